"""Small networking helpers shared by the launchers."""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
