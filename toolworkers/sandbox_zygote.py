"""A warm process that forks one child per sandboxed tool call (started and
driven by `toolworkers.sandbox`), so a call costs a fork, not an interpreter
start and its imports.

Protocol, on the SOCK_SEQPACKET socket whose descriptor is `argv[1]`: the worker
sends {"workdir", "environment"} with three descriptors (the child's stdin,
stdout and stderr); the zygote answers {"started": pid} in request order, and
{"exited": pid, "status": <waitpid status>} when that child ends. The end of
the socket (the worker is gone) ends the zygote; running children live on in
their own sessions until they finish or the worker kills them."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from typing import Any, NoReturn

# Imported once here instead of in every call's child.
import toolworkers.builtin_tools
import toolworkers.hosted_tools
import toolworkers.registry
import toolworkers.tool_state  # noqa: F401
from toolworkers import confinement, sandbox_child

_MAX_MESSAGE_BYTES = 1 << 16
_CHILD_DESCRIPTORS = 3


def _run_child(control: socket.socket, request: dict[str, Any], descriptors: list[int]) -> NoReturn:
    exit_code = 1
    try:
        control.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        for target, descriptor in enumerate(descriptors):
            os.dup2(descriptor, target)
        # The zygote's own descriptors (its wake-up pipe, its selector) stay with it.
        os.closerange(_CHILD_DESCRIPTORS, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["workdir"])
        os.environ.clear()
        os.environ.update(request["environment"])
        sandbox_child.main()
        exit_code = 0
    except SystemExit as stop:
        exit_code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(exit_code)


def _send(control: socket.socket, message: dict[str, int]) -> None:
    control.send(json.dumps(message).encode())


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(control, {"exited": pid, "status": status})


def main() -> None:
    confinement.prepare()
    control = socket.socket(fileno=int(sys.argv[1]))
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_read, False)
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda _signal, _frame: None)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)
    while True:
        for key, _events in selector.select():
            if key.fileobj is control:
                message, descriptors, _flags, _address = socket.recv_fds(
                    control, _MAX_MESSAGE_BYTES, _CHILD_DESCRIPTORS
                )
                if not message:
                    return
                pid = os.fork()
                if pid == 0:
                    _run_child(control, json.loads(message), descriptors)
                for descriptor in descriptors:
                    os.close(descriptor)
                _send(control, {"started": pid})
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wakeup_read, 512):
                        pass
                _report_exits(control)


if __name__ == "__main__":
    main()
