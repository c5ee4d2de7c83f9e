"""A reachable Redis for the local cluster: the configured one, else our own
`redis-server` on a free port (installing Debian's package when missing)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.exceptions import RedisError

from cluster.launch.debian_packages import PackageInstallError, binary_or_install
from cluster.net import free_port

_START_TIMEOUT_S = 15.0


class RedisUnavailableError(RuntimeError):
    """No Redis could be reached or started."""


@dataclass
class RedisServer:
    url: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def owned(self) -> bool:
        return self.process is not None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def is_reachable(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (RedisError, OSError, ValueError):
        return False


def ensure_redis(url: str | None, work_dir: Path, log: Callable[[str], None]) -> RedisServer:
    if url and is_reachable(url):
        log(f"redis: using {url}")
        return RedisServer(url)
    if url:
        log(f"redis: {url} is not reachable; starting a local redis-server")
    return start_redis_server(work_dir, log)


def start_redis_server(
    work_dir: Path, log: Callable[[str], None], port: int | None = None
) -> RedisServer:
    """Our own `redis-server` (no persistence) on `port`, else on a free one."""
    binary = _redis_server_binary(log)
    port = port or free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(work_dir),
            "--logfile",
            str(work_dir / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    own_url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RedisUnavailableError(
                f"redis-server exited with {process.returncode}; see {work_dir / 'redis.log'}"
            )
        if is_reachable(own_url):
            log(f"redis: started redis-server on port {port}")
            return RedisServer(own_url, process)
        time.sleep(0.1)
    process.kill()
    raise RedisUnavailableError(f"redis-server did not answer within {_START_TIMEOUT_S:.0f}s")


def _redis_server_binary(log: Callable[[str], None]) -> str:
    """`redis-server`, installed from Debian's package when missing."""
    try:
        return binary_or_install("redis-server", "redis-server", lambda line: log(f"redis: {line}"))
    except PackageInstallError as error:
        raise RedisUnavailableError(
            f"{error}; install Redis or set redis.url to a reachable server"
        ) from error
