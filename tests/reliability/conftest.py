"""One cluster for the reliability suite, on a Redis of its own that tests may
stop and start again (the machine's Redis is never touched)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from load_agents import MAX_ONGOING_REQUESTS, MAX_QUEUED_REQUESTS

from cluster.config import RedisConfig, ToolserveConfig, load_config
from cluster.launch.launcher import Endpoints, LocalCluster
from cluster.net import free_port

from .own_redis import OwnRedis


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that set `RUNS_LAST` run after the suite's others."""

    def runs_last(item: pytest.Item) -> bool:
        return bool(getattr(getattr(item, "module", None), "RUNS_LAST", False))

    suite = [index for index, item in enumerate(items) if item.get_closest_marker("reliability")]
    if suite:
        members = [items[index] for index in suite]
        ordered = [item for item in members if not runs_last(item)] + [
            item for item in members if runs_last(item)
        ]
        for index, item in zip(suite, ordered, strict=True):
            items[index] = item


@pytest.fixture(scope="package")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedis]:
    redis = OwnRedis(tmp_path_factory.mktemp("own-redis"))
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


@pytest.fixture(scope="package")
def reliability_config(own_redis: OwnRedis) -> ToolserveConfig:
    """The embedded default on its own ports and Redis, holding at most
    `MAX_ONGOING_REQUESTS` (above the largest load run's agents) and queueing
    `MAX_QUEUED_REQUESTS`."""
    config = load_config()
    server = config.server.model_copy(
        update={
            "port": free_port(),
            "max_ongoing_requests": MAX_ONGOING_REQUESTS,
            "max_queued_requests": MAX_QUEUED_REQUESTS,
        }
    )
    return config.model_copy(
        update={
            "name": "toolserve-reliability",
            "redis": RedisConfig(url=own_redis.url),
            "server": server,
            "ray": config.ray.model_copy(update={"metrics_export_port": free_port()}),
        }
    )


@pytest.fixture(scope="package")
def reliability_cluster(reliability_config: ToolserveConfig) -> Iterator[Endpoints]:
    with LocalCluster(
        reliability_config, log=lambda line: print(f"[reliability] {line}")
    ) as cluster:
        yield cluster
