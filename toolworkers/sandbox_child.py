"""What the process of one sandboxed tool call runs (forked by `toolworkers.sandbox_zygote`).

Reads {"function", "arguments", "options", "limits", "state"?, "partial"?} as a
JSON line on stdin (for a partial call, then a line {"piece": ...} per piece and
{"finish": arguments} last), limits itself before importing the tool, runs it,
and writes one JSON result on the stdout it started with (with the state a
stateful call left); whatever the tool prints goes to stderr."""

from __future__ import annotations

import functools
import inspect
import json
import os
import resource
import site
import sys
import sysconfig
from collections.abc import Callable, Iterator
from typing import Any

from toolworkers.confinement import ConfinementError, ConfinementPlan
from toolworkers.confinement import enter as enter_confinement

_NETWORK_EVENTS = frozenset(
    {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"}
)
_PROCESS_EVENTS = frozenset(
    {
        "os.exec",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "pty.spawn",
        "subprocess.Popen",
    }
)
# Foreign calls could do anything the audit events below are there to refuse
# (ptrace, raw syscalls); the sandbox's own ctypes use happens before the hook.
_FOREIGN_CODE_EVENTS = frozenset({"ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function"})
_SIGNAL_EVENTS = frozenset({"os.kill", "os.killpg"})
_READ_EVENTS = frozenset({"os.listdir", "os.scandir"})
_WRITE_EVENTS = frozenset(
    {
        "os.chmod",
        "os.chown",
        "os.link",
        "os.mkdir",
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.symlink",
        "os.truncate",
        "os.utime",
        "shutil.rmtree",
    }
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_READABLE_SYSTEM_PATHS = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
# What a tool process may read besides its packages: the interpreter's library
# and the shared libraries (with the loader's cache) extension modules load.
_PYTHON_PATHS = ("stdlib", "platstdlib", "purelib", "platlib")
_SYSTEM_LIBRARIES = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache")
_NETWORK_CONFIGURATION = ("/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf", "/etc/ssl")


def _deny_network(event: str, _args: tuple[Any, ...]) -> None:
    if event in _NETWORK_EVENTS:
        raise PermissionError("network access is disabled for this tool")


def _within(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


class _Confinement:
    """What a tool process may do beyond computing: read its call directory,
    paths named in its options, the Python installation it runs on and a few
    devices; write its call directory and option paths; start no process, call
    no foreign code, signal only itself."""

    def __init__(self, request: dict[str, Any]):
        granted = _granted_paths(request)
        self._writable = tuple(os.path.realpath(path) for path in [os.getcwd(), *granted])
        python = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        python.update(entry for entry in sys.path if entry)
        python.update(_package_roots(request["function"]))
        readable = {os.path.realpath(path) for path in python}
        readable.update(_READABLE_SYSTEM_PATHS)
        readable.add(f"/proc/{os.getpid()}")
        if request["limits"]["network"]:
            readable.update(_NETWORK_CONFIGURATION)
        self._readable = (*self._writable, *sorted(readable))

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if event in _PROCESS_EVENTS:
            raise PermissionError("starting processes is disabled for this tool")
        if event in _FOREIGN_CODE_EVENTS:
            raise PermissionError("foreign code (ctypes) is disabled for this tool")
        if event in _SIGNAL_EVENTS and args[0] not in (os.getpid(), 0):
            raise PermissionError("this tool may signal only its own process")
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in mode for c in "wax+")) or bool(
                (flags or 0) & _WRITE_FLAGS
            )
            self._check(path, writes)
        elif event in _READ_EVENTS:
            self._check(args[0] if args else ".", writes=False)
        elif event == "os.symlink":  # where the link points is checked on use
            self._check(args[1], writes=True)
        elif event in _WRITE_EVENTS:
            self._check(args[0], writes=True)
            if event in ("os.rename", "os.link"):
                self._check(args[1], writes=True)

    def _check(self, path: Any, writes: bool) -> None:
        if isinstance(path, int) or path is None:
            return  # an open descriptor: checked when it was opened
        resolved = os.path.realpath(os.fsdecode(path))
        roots = self._writable if writes else self._readable
        if not _within(resolved, roots):
            access = "write" if writes else "read"
            raise PermissionError(
                f"filesystem: this tool may not {access} {resolved} (it may read its call "
                "directory, paths in its options and the Python installation, and write "
                "its call directory and paths in its options)"
            )


def _package_roots(function_reference: str) -> list[str]:
    """The tool's package and the directories that hold it."""
    locations = _package_locations(function_reference)
    return [os.path.dirname(location) for location in locations] + locations


def _package_locations(function_reference: str) -> list[str]:
    """Where the tool's top-level package lives (found without importing it)."""
    import importlib.util

    top_level = function_reference.partition(":")[0].partition(".")[0]
    try:
        spec = importlib.util.find_spec(top_level)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    locations = list(spec.submodule_search_locations or [])
    if spec.origin and os.path.isabs(spec.origin):
        locations.append(os.path.dirname(spec.origin))
    return locations


def confinement_plan(request: dict[str, Any]) -> ConfinementPlan:
    """The namespaces' view for the call: the Python installation, the packages
    this process has imported and the tool's, read-only; the paths granted in the
    tool's options and `allowed_paths`, writable."""
    limits = request["limits"]
    python = {sysconfig.get_paths()[kind] for kind in _PYTHON_PATHS}
    python.update(site.getsitepackages())
    python.add(sysconfig.get_config_var("LIBDIR") or sys.base_prefix)
    python.update(_SYSTEM_LIBRARIES)
    for name, module in list(sys.modules.items()):
        if "." not in name and (locations := getattr(module, "__path__", None)):
            python.update(location for location in locations if os.path.isabs(location))
    python.update(_package_locations(request["function"]))
    if limits["network"]:
        python.update(_NETWORK_CONFIGURATION)
    uid, gid = limits["run_as"]
    return ConfinementPlan(
        workdir=os.getcwd(),
        read_only=tuple(sorted(python)),
        writable=tuple(_granted_paths(request)),
        network=limits["network"],
        starts_programs=limits["starts_programs"],
        uid=uid,
        gid=gid,
        scratch_bytes=limits["scratch_bytes"],
        max_processes=limits["max_processes"],
        max_open_files=limits["max_open_files"],
    )


def _granted_paths(request: dict[str, Any]) -> list[str]:
    return [
        value
        for value in request["options"].values()
        if isinstance(value, str) and os.path.isabs(value)
    ] + list(request["limits"]["allowed_paths"])


def _limit_self(limits: dict[str, Any], confinement: _Confinement) -> None:
    memory_bytes = int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    cpu_s = max(1, int(limits["cpu_s"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    file_bytes = int(limits["max_file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    # The namespaces and the seccomp filter confine the process; the audit hooks
    # only turn what they would refuse into errors that say why.
    if not limits["audit_hooks"]:
        return
    if not limits["network"]:
        sys.addaudithook(_deny_network)
    sys.addaudithook(confinement)


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


def _cpu_seconds() -> float:
    """This process's CPU time since the zygote forked it, and its children's."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    request = json.loads(sys.stdin.buffer.readline())
    try:
        enter_confinement(confinement_plan(request))
    except ConfinementError as error:
        refusal = _failure("confinement", f"the tool cannot be confined: {error}")
        sys.stdout.write(json.dumps(refusal))
        sys.stdout.flush()  # the zygote's child ends with os._exit, which flushes nothing
        return
    result_stream = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _limit_self(request["limits"], _Confinement(request))
    try:
        result = _run(request, iter(sys.stdin.buffer.readline, b""))
    except MemoryError:
        result = _failure("memory_limit", "the tool ran out of memory")
    result["cpu_s"] = _cpu_seconds()
    json.dump(result, result_stream)
    result_stream.flush()
