"""An engine that is not serving answers 503 with an OpenAI-style body; here
behind Serve's HTTP proxy (`server.ingress: proxy`, the multi-node setting)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cluster.config import load_config
from cluster.launch.launcher import ClusterStartError, LocalCluster
from cluster.net import free_port

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def broken_api_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A cluster whose engine cannot load (its model directory is missing), left
    running after its start reported the failure."""
    config = load_config()
    missing_model = str(tmp_path_factory.mktemp("broken") / "no-model-here")
    main = config.main.model_copy(
        update={"engine": config.main.engine.model_copy(update={"model": missing_model})}
    )
    config = config.model_copy(
        update={
            "name": "broken",
            "main": main,
            "draft": None,
            "draft_placement": "own_replicas",
            "server": config.server.model_copy(update={"port": free_port(), "ingress": "proxy"}),
            "ray": config.ray.model_copy(update={"metrics_export_port": free_port()}),
        }
    )
    cluster = LocalCluster(config, log=lambda line: print(f"[broken] {line}"))
    try:
        with pytest.raises(ClusterStartError, match="failed"):
            cluster.start()
        yield f"http://127.0.0.1:{config.server.port}"
    finally:
        cluster.stop()


def test_requests_to_an_engine_that_failed_to_load_get_503(broken_api_root: str) -> None:
    response = httpx.post(
        f"{broken_api_root}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "engine_not_ready"
    assert error["type"] == "service_unavailable_error"
    assert error["message"]

    health = httpx.get(f"{broken_api_root}/health", timeout=60)
    assert health.status_code == 503
    assert health.json()["error"]["code"] == "engine_not_ready"
