"""One real cluster per test session: Ray, the real Redis, vLLM on SmolLM2."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from cluster.config import ToolserveConfig, load_config
from cluster.launcher import Endpoints, LocalCluster
from cluster.net import free_port


@pytest.fixture(scope="session")
def cluster_config() -> ToolserveConfig:
    config = load_config()
    return config.model_copy(
        update={
            "server": config.server.model_copy(update={"port": free_port()}),
            "ray": config.ray.model_copy(update={"metrics_export_port": free_port()}),
        }
    )


@pytest.fixture(scope="session")
def cluster(cluster_config: ToolserveConfig) -> Iterator[Endpoints]:
    with LocalCluster(cluster_config, log=lambda line: print(f"[cluster] {line}")) as endpoints:
        yield endpoints


@pytest.fixture(scope="session")
def model_name(cluster_config: ToolserveConfig) -> str:
    return cluster_config.main.engine.served_model_name


@pytest.fixture(scope="session")
def client(cluster: Endpoints) -> OpenAI:
    return OpenAI(base_url=cluster.api_base, api_key="test", max_retries=0, timeout=120)


@pytest.fixture()
def healthy_after(cluster: Endpoints) -> Iterator[None]:
    """Asserts the server still reports healthy after the test (bad inputs must not hurt it)."""
    yield
    response = httpx.get(cluster.health_url, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "ok"
