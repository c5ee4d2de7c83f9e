"""An engine that is not serving answers 503 with an OpenAI-style body; here
behind Serve's HTTP proxy (`server.ingress: proxy`, the multi-node setting), on
a cluster that requires API keys (checked before anything else)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from pydantic import SecretStr

from cluster.config import load_config
from cluster.launch.launcher import ClusterStartError, LocalCluster
from cluster.net import free_port

pytestmark = pytest.mark.e2e

API_KEY = "sk-broken-cluster-0001"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def broken_api_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A cluster whose engine cannot load (its model directory is missing), left
    running after its start reported the failure; it accepts one API key."""
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
            "server": config.server.model_copy(
                update={"port": free_port(), "ingress": "proxy", "api_keys": [SecretStr(API_KEY)]}
            ),
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
        headers=AUTH,
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


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer sk-not-a-key-of-this-cluster"}, {"Authorization": "Bearer"}],
    ids=["no key", "unknown key", "empty key"],
)
def test_a_cluster_with_api_keys_answers_401_to_other_callers(
    broken_api_root: str, headers: dict[str, str]
) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    requests = [
        httpx.post(
            f"{broken_api_root}/v1/chat/completions", json=chat, headers=headers, timeout=60
        ),
        httpx.get(f"{broken_api_root}/v1/models", headers=headers, timeout=60),
        httpx.get(f"{broken_api_root}/v1/tools", headers=headers, timeout=60),
        httpx.delete(f"{broken_api_root}/v1/sessions/agent-1", headers=headers, timeout=60),
        httpx.put(
            f"{broken_api_root}/v1/sessions/agent-1/tool-state/GorillaFileSystem",
            json={},
            headers=headers,
            timeout=60,
        ),
        httpx.post(
            f"{broken_api_root}/cache-tool-output/chatcmpl-1", json=[], headers=headers, timeout=60
        ),
    ]
    for response in requests:
        assert response.status_code == 401, (response.request.url, response.text)
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        assert (error["code"], error["type"]) == ("invalid_api_key", "invalid_request_error")
        assert "sk-not-a-key" not in error["message"]
    models = httpx.get(f"{broken_api_root}/v1/models", headers=AUTH, timeout=60)
    assert models.status_code == 200
    health = httpx.get(f"{broken_api_root}/health", headers=headers, timeout=60)
    assert health.status_code == 503, "health is open to probes, and reports the broken engine"
