"""Small networking helpers shared by the launchers."""

from __future__ import annotations

import socket
import time

# NOTE: Ray listens on these fixed ports by default (GCS and client server under
# `ray start`, the dashboard, the autoscaler's and dashboard's metrics, the
# dashboard agent). The kernel may hand one out before Ray starts; an API port
# chosen so is then held by Ray's monitor for good, and the ingress never binds.
RAY_DEFAULT_PORTS = frozenset({6379, 8265, 10001, 44217, 44227, 52365})


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that no
    Ray process will claim by default."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in RAY_DEFAULT_PORTS:
            return port


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind `port` on `host` now."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def wait_for_free_port(host: str, port: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `port` to be free (a stopping server's socket
    closes a moment after its process is told to stop); whether it became free."""
    deadline = time.monotonic() + timeout_s
    while not port_is_free(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)
    return True
