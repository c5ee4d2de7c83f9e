"""Redis bootstrap against real servers: the machine's, and one we start."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.launch.redis_server import ensure_redis, is_reachable

MACHINE_REDIS = "redis://127.0.0.1:6379/0"
UNREACHABLE = "redis://127.0.0.1:1/0"


def test_a_reachable_configured_redis_is_used_as_is(tmp_path: Path) -> None:
    server = ensure_redis(MACHINE_REDIS, tmp_path, lambda _: None)
    assert server.url == MACHINE_REDIS
    assert not server.owned


@pytest.mark.parametrize("configured", [UNREACHABLE, None])
def test_otherwise_a_local_redis_server_is_started_and_stopped(
    tmp_path: Path, configured: str | None
) -> None:
    lines: list[str] = []
    server = ensure_redis(configured, tmp_path, lines.append)
    try:
        assert server.owned
        assert server.url != MACHINE_REDIS
        assert is_reachable(server.url)
        assert any("started redis-server" in line for line in lines)
    finally:
        server.stop()
    assert not is_reachable(server.url)
