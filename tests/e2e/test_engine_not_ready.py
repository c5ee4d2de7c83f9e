"""An engine that is not serving answers 503 with an OpenAI-style body."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ray import serve

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints
from deployments.app import build_application

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("healthy_after")]

BROKEN_APP = "broken"


@pytest.fixture()
def broken_app_root(
    cluster: Endpoints, cluster_config: ToolserveConfig, tmp_path: Path
) -> Iterator[str]:
    """A second application whose engine cannot load: its model directory is missing."""
    missing_model = str(tmp_path / "no-model-here")
    main = cluster_config.main.model_copy(
        update={"engine": cluster_config.main.engine.model_copy(update={"model": missing_model})}
    )
    config = cluster_config.model_copy(update={"name": BROKEN_APP, "main": main, "draft": None})
    serve.run(
        build_application(config, missing_model, None, cluster.redis_url),
        name=BROKEN_APP,
        route_prefix=f"/{BROKEN_APP}",
    )
    try:
        yield cluster.api_base.removesuffix("/v1") + f"/{BROKEN_APP}"
    finally:
        serve.delete(BROKEN_APP)


def test_requests_to_an_engine_that_failed_to_load_get_503(
    broken_app_root: str, model_name: str
) -> None:
    response = httpx.post(
        f"{broken_app_root}/v1/chat/completions",
        json={"model": model_name, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "engine_not_ready"
    assert error["type"] == "service_unavailable_error"
    assert error["message"]

    health = httpx.get(f"{broken_app_root}/health", timeout=60)
    assert health.status_code == 503
    assert health.json()["error"]["code"] == "engine_not_ready"
