"""A Redis server of the test's own."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cluster.launch.redis_server import RedisServer, start_redis_server
from cluster.net import free_port


@dataclass
class OwnRedis:
    """A redis-server a test stops and starts again (empty) on the same port."""

    work_dir: Path
    port: int = field(default_factory=free_port)
    server: RedisServer | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.server = start_redis_server(self.work_dir, print, self.port)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
