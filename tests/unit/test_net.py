import socket
import threading

from cluster.net import free_port, port_is_free, wait_for_free_port


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
