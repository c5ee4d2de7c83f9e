"""The layout the GPU profiles use: the draft model on replicas of its own
(`draft_placement: own_replicas`), here with both models on the tiny model. A
request naming the draft is served by a draft replica under the draft's name;
the main model still answers on its own replicas."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from cluster.config import ModelDeploymentConfig, ToolserveConfig, load_config
from cluster.launch.launcher import Endpoints, LocalCluster
from cluster.models import EMBEDDED_SCHEME, TINY_RANDOM_LLAMA
from cluster.net import free_port
from deployments.api.chat import REPLICA_HEADER

pytestmark = pytest.mark.e2e


def _on_tiny_model(deployment: ModelDeploymentConfig) -> ModelDeploymentConfig:
    engine = deployment.engine.model_copy(
        update={
            "model": f"{EMBEDDED_SCHEME}{TINY_RANDOM_LLAMA}",
            "max_model_len": 1024,
            "kv_cache_memory_bytes": 64 * 1024 * 1024,
            "max_num_seqs": 4,
        }
    )
    return deployment.model_copy(update={"engine": engine})


@pytest.fixture(scope="module")
def own_draft_config() -> ToolserveConfig:
    config = load_config()
    assert config.draft is not None
    return config.model_copy(
        update={
            "name": "toolserve-own-draft",
            "main": _on_tiny_model(config.main),
            "draft": _on_tiny_model(config.draft),
            "draft_placement": "own_replicas",
            "tools": config.tools.model_copy(update={"hosted": []}),
            "server": config.server.model_copy(update={"port": free_port()}),
            "ray": config.ray.model_copy(update={"metrics_export_port": free_port()}),
        }
    )


@pytest.fixture(scope="module")
def own_draft_cluster(own_draft_config: ToolserveConfig) -> Iterator[Endpoints]:
    with LocalCluster(own_draft_config, log=lambda line: print(f"[own-draft] {line}")) as cluster:
        yield cluster


def test_a_draft_request_is_served_by_a_draft_replica(
    own_draft_config: ToolserveConfig, own_draft_cluster: Endpoints
) -> None:
    assert own_draft_config.draft is not None
    draft = own_draft_config.draft.engine.served_model_name
    main = own_draft_config.main.engine.served_model_name
    client = OpenAI(base_url=own_draft_cluster.api_base, api_key="test", max_retries=0)
    assert [model.id for model in client.models.list()] == [main, draft]

    engines = httpx.get(own_draft_cluster.health_url, timeout=30).json()["engines"]
    replicas = {
        role: {e["replica"] for e in engines if e["role"] == role} for role in ("main", "draft")
    }
    assert replicas["main"] and replicas["draft"] and not replicas["main"] & replicas["draft"]

    for model, role in ((draft, "draft"), (main, "main")):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert raw.parse().model == model
        assert raw.headers[REPLICA_HEADER] in replicas[role]

    streamed = client.chat.completions.create(
        model=draft, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
    )
    assert {chunk.model for chunk in streamed} == {draft}
