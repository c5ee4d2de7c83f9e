from __future__ import annotations

import socket
import threading

import pytest

import cluster.net
from cluster.net import RAY_DEFAULT_PORTS, free_port, port_is_free, wait_for_free_port


def test_a_listened_port_is_not_free_and_becomes_free_when_closed() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    assert not port_is_free("127.0.0.1", port)
    assert not wait_for_free_port("127.0.0.1", port, timeout_s=0.3)

    closer = threading.Timer(0.3, listener.close)
    closer.start()
    assert wait_for_free_port("127.0.0.1", port, timeout_s=10)
    closer.join()


def test_an_unused_port_is_free() -> None:
    assert port_is_free("127.0.0.1", free_port())


class _KernelPorts:
    """Stands in for `socket.socket`: each probe is bound to the next port given."""

    def __init__(self, ports: list[int]) -> None:
        self._ports = iter(ports)

    def __call__(self) -> _KernelPorts:
        self._port = next(self._ports)
        return self

    def __enter__(self) -> _KernelPorts:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, address: tuple[str, int]) -> None:
        return None

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self._port)


def test_a_port_ray_listens_on_by_default_is_never_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster.net.socket, "socket", _KernelPorts([44217, 52365, 40001]))
    assert 44217 in RAY_DEFAULT_PORTS
    assert free_port() == 40001
