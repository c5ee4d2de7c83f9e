"""What the process of one sandboxed tool call runs (forked by `toolworkers.sandbox_zygote`).

Reads {"function", "arguments", "options", "limits", "state"?, "partial"?} as a
JSON line on stdin (for a partial call, then a line {"piece": ...} per piece and
{"finish": arguments} last), limits itself before importing the tool, runs it,
and writes one JSON result on the stdout it started with (with the state a
stateful call left); whatever the tool prints goes to stderr."""

from __future__ import annotations

import ctypes
import functools
import inspect
import json
import os
import resource
import sys
from collections.abc import Callable, Iterator
from typing import Any

_CLONE_NEWNET = 0x40000000
_NETWORK_EVENTS = frozenset(
    {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"}
)


def _deny_network(event: str, _args: tuple[Any, ...]) -> None:
    if event in _NETWORK_EVENTS:
        raise PermissionError("network access is disabled for this tool")


def _limit_self(limits: dict[str, Any]) -> None:
    memory_bytes = int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    cpu_s = max(1, int(limits["cpu_s"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    file_bytes = int(limits["max_file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    if not limits["network"]:
        # An empty network namespace where the kernel allows it (root, or user
        # namespaces); the audit hook refuses sockets either way.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.unshare(_CLONE_NEWNET)
        sys.addaudithook(_deny_network)


def _failure(error_kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error_kind": error_kind, "output": message}


def _run(request: dict[str, Any], more_lines: Iterator[bytes]) -> dict[str, Any]:
    from toolworkers.builtin_tools import ToolError
    from toolworkers.registry import RegistryError, declared_spec, resolve_function
    from toolworkers.tool_state import ToolState, decode_value, encode_value

    try:
        function = resolve_function(request["function"])
    except RegistryError as error:
        return _failure("unknown_tool", str(error))
    arguments, options = request["arguments"], dict(request["options"])
    state = None
    if "state" in request:
        state = ToolState(decode_value(request["state"]["value"]), request["state"]["scenario"])
        options["state"] = state

    def reply_of(call: Callable[[], Any]) -> dict[str, Any]:
        try:
            output = call()
        except ToolError as error:
            return _failure("tool_error", str(error))
        except MemoryError:
            return _failure("memory_limit", "the tool ran out of memory")
        except Exception as error:
            return _failure("tool_error", f"{type(error).__name__}: {error}")
        text = output if isinstance(output, str) else json.dumps(output, default=str)
        reply: dict[str, Any] = {"ok": True, "error_kind": None, "output": text}
        if state is not None:
            reply["state"] = encode_value(state.value)
        return reply

    if request.get("partial"):
        try:
            partial = declared_spec(function, request["function"]).partial_input
        except RegistryError:
            partial = None
        if partial is None:
            return _failure("bad_arguments", f"{request['function']} takes no partial input")
        return _run_partial(partial.session, options, more_lines, reply_of)
    try:
        inspect.signature(function).bind(**arguments, **options)
    except TypeError as error:
        return _failure("bad_arguments", str(error))
    return reply_of(lambda: function(**arguments, **options))


def _run_partial(
    new_session: Callable[..., Any],
    options: dict[str, Any],
    lines: Iterator[bytes],
    reply_of: Callable[[Callable[[], Any]], dict[str, Any]],
) -> dict[str, Any]:
    """Feeds the session each piece as its line arrives; the first failure is the
    call's result, reported once the whole arguments have come."""
    sessions: list[Any] = []
    outcome = reply_of(lambda: sessions.append(new_session(**options)))
    for line in lines:
        message = json.loads(line)
        if not outcome["ok"]:
            if "finish" in message:
                return outcome
        elif "finish" in message:
            return reply_of(functools.partial(sessions[0].finish, message["finish"]))
        else:
            outcome = reply_of(functools.partial(sessions[0].feed, message["piece"]))
    return _failure("abandoned", "the call's arguments never finished")


def main() -> None:
    request = json.loads(sys.stdin.buffer.readline())
    result_stream = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _limit_self(request["limits"])
    try:
        result = _run(request, iter(sys.stdin.buffer.readline, b""))
    except MemoryError:
        result = _failure("memory_limit", "the tool ran out of memory")
    json.dump(result, result_stream)
    result_stream.flush()
