"""Test ordering and the Redis every test that needs one shares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.launch.redis_server import ensure_redis

MACHINE_REDIS = "redis://127.0.0.1:6379/0"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Unit tests first; then tests that start their own engine or servers, before
    the shared cluster starts, so they never share the two cores with it."""

    def phase(item: pytest.Item) -> int:
        if not any(item.get_closest_marker(name) for name in ("e2e", "engine", "reliability")):
            return 0
        return 2 if "cluster" in getattr(item, "fixturenames", ()) else 1

    items.sort(key=phase)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The machine's Redis when it runs, else one started for the test session."""
    server = ensure_redis(MACHINE_REDIS, Path(tmp_path_factory.mktemp("redis")), print)
    try:
        yield server.url
    finally:
        server.stop()
