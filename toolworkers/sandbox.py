"""Runs one tool call in its own process, forked from a warm zygote process
(`toolworkers.sandbox_zygote`) so a call costs milliseconds: its own working
directory and session, memory, CPU-time and file-size limits, no network unless allowed, a
wall-clock timeout and a cap on output. Every failure (crash, hang, memory
blow-up, oversized output, bad arguments) comes back as a `ToolResult`, never
as an exception or a hung caller."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from cluster.config import SandboxLimits
from cluster.store.tool_state import SlotContents

logger = logging.getLogger("toolserve.toolworkers")

_STDERR_TAIL_BYTES = 2048
_READ_CHUNK = 65536


@dataclass(frozen=True)
class ToolResult:
    """`output` is the tool's text when `ok`, else what went wrong, for the model;
    `state`: what a stateful tool's call left in its slot (encoded), for the executor."""

    ok: bool
    output: str
    error_kind: str | None
    duration_s: float
    state: str | None = None
    cpu_s: float | None = None
    """CPU seconds the call's process (and any it started) used, as it reported
    them; None where it did not (killed, or never started)."""

    def for_model(self) -> str:
        return self.output if self.ok else f"error: {self.output}"


@dataclass(frozen=True)
class SandboxCall:
    """One call: the function the child imports, the model's arguments, the
    options configuration binds to every call of the tool, and for a stateful
    tool its program's slot."""

    function_reference: str
    arguments: dict[str, Any]
    options: dict[str, Any]
    timeout_s: float
    state: SlotContents | None = None
    starts_programs: bool = False
    """The tool runs programs (`execve`); refused to every other tool."""


def _zygote_environment() -> dict[str, str]:
    # Nothing of the worker's environment (credentials among it) reaches a tool.
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }


def _child_environment(workdir: str) -> dict[str, str]:
    return {**_zygote_environment(), "HOME": workdir, "TMPDIR": workdir}


class ZygoteLost(Exception):
    """The zygote process ended or stopped answering."""


_StartedChild = tuple[int, "asyncio.Future[int | None]"]


class _Zygote:
    """The worker's end of `toolworkers.sandbox_zygote`, bound to one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._socket, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-s",
                    "-m",
                    "toolworkers.sandbox_zygote",
                    str(zygote_end.fileno()),
                ],
                pass_fds=[zygote_end.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=_zygote_environment(),
                start_new_session=True,
            )
        except OSError:
            self._socket.close()
            raise
        finally:
            zygote_end.close()
        self.pid = self._process.pid
        self._socket.setblocking(False)
        self._starting: collections.deque[asyncio.Future[_StartedChild]] = collections.deque()
        self._exits: dict[int, asyncio.Future[int | None]] = {}
        self.alive = True
        self._reader = loop.create_task(self._read_replies())

    async def _read_replies(self) -> None:
        try:
            while message := await self.loop.sock_recv(self._socket, 4096):
                reply = json.loads(message)
                if "started" in reply:
                    pid = reply["started"]
                    self._exits[pid] = self.loop.create_future()
                    starting = self._starting.popleft()
                    if starting.done():  # its caller was cancelled: nobody runs the child
                        _kill_group(pid)
                    else:
                        starting.set_result((pid, self._exits[pid]))
                elif (exit_future := self._exits.pop(reply["exited"], None)) is not None:
                    exit_future.set_result(reply["status"])
        except (OSError, ValueError) as error:
            logger.warning("tool sandbox zygote failed: %s", error)
        finally:
            self.close()

    async def start(self, workdir: str, descriptors: list[int]) -> _StartedChild:
        """Forks a child on `descriptors` (stdin, stdout, stderr); its pid and a
        future of its wait status (None when the zygote is lost before it ends)."""
        if not self.alive:
            raise ZygoteLost("the tool sandbox zygote has ended")
        request = json.dumps({"workdir": workdir, "environment": _child_environment(workdir)})
        started: asyncio.Future[_StartedChild] = self.loop.create_future()
        try:
            socket.send_fds(self._socket, [request.encode()], descriptors)
        except OSError as error:
            self.close()
            raise ZygoteLost(f"cannot reach the tool sandbox zygote: {error}") from error
        self._starting.append(started)
        return await started

    def close(self) -> None:
        if not self.alive:
            return
        self.alive = False
        self._socket.close()
        if not self.loop.is_closed():
            for started in self._starting:
                if not started.done():
                    started.set_exception(ZygoteLost("the tool sandbox zygote has ended"))
            for exit_future in self._exits.values():
                if not exit_future.done():
                    exit_future.set_result(None)
        self._starting.clear()
        self._exits.clear()
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=1)


_zygote: _Zygote | None = None


def zygote_pid() -> int | None:
    """This process's zygote, while one runs."""
    return _zygote.pid if _zygote is not None and _zygote.alive else None


def _running_zygote() -> _Zygote:
    """This process's zygote, started on first use and again after it is lost
    or when calls move to another event loop."""
    global _zygote
    loop = asyncio.get_running_loop()
    if _zygote is None or not _zygote.alive or _zygote.loop is not loop:
        if _zygote is not None:
            _zygote.close()
        _zygote = _Zygote(loop)
    return _zygote


async def _pipe_reader(descriptor: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_READ_CHUNK)
    transport, _protocol = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(descriptor, "rb", buffering=0)
    )
    return reader, transport


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Up to `cap` bytes; True when the stream held more (the reader stops there)."""
    data = bytearray()
    while chunk := await stream.read(_READ_CHUNK):
        data += chunk
        if len(data) > cap:
            return bytes(data[:cap]), True
    return bytes(data), False


async def _drain_tail(stream: asyncio.StreamReader) -> bytes:
    """Everything the child writes (so it never blocks on a full pipe); the tail kept."""
    tail = b""
    while chunk := await stream.read(_READ_CHUNK):
        tail = (tail + chunk)[-_STDERR_TAIL_BYTES:]
    return tail


def _exit_description(status: int | None, stderr_tail: bytes) -> tuple[str, str]:
    returncode = None if status is None else os.waitstatus_to_exitcode(status)
    if returncode is None:
        reason = "the tool process ended without a result"
    elif returncode < 0:
        signal_number = -returncode
        name = signal.Signals(signal_number).name if signal_number in signal.valid_signals() else ""
        if signal_number == signal.SIGXCPU:
            return "cpu_limit", "the tool used more CPU time than allowed"
        reason = f"the tool process was killed by {name or signal_number}"
    else:
        reason = f"the tool process exited with status {returncode}"
    last_line = stderr_tail.decode(errors="replace").strip().splitlines()[-1:]
    return "crash", reason + (f": {last_line[0][:300]}" if last_line else "")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _request_line(call: SandboxCall, limits: SandboxLimits, partial: bool) -> bytes:
    fields: dict[str, Any] = {
        "function": call.function_reference,
        "arguments": call.arguments,
        "options": call.options,
        "limits": {
            "memory_mb": limits.memory_mb,
            "cpu_s": min(limits.cpu_s, call.timeout_s + 1),
            "max_file_bytes": limits.max_file_bytes,
            "network": limits.network,
            "allowed_paths": limits.allowed_paths,
            "run_as": list(limits.run_as),
            "scratch_bytes": limits.scratch_mb * 1024 * 1024,
            "max_processes": limits.max_processes,
            "max_open_files": limits.max_open_files,
            "starts_programs": call.starts_programs,
            "audit_hooks": limits.audit_hooks,
        },
    }
    if partial:
        fields["partial"] = True
    if call.state is not None:
        fields["state"] = {"value": call.state.value, "scenario": call.state.scenario}
    return json.dumps(fields, default=str).encode() + b"\n"


class _SandboxedChild:
    """One call's child process: started on a given stdin, its result read once."""

    def __init__(self, limits: SandboxLimits, started: float):
        self._limits = limits
        self._started = started
        self._cleanup = contextlib.ExitStack()
        self._workdir = tempfile.mkdtemp(prefix="toolserve-tool-")
        self._cleanup.callback(shutil.rmtree, self._workdir, ignore_errors=True)
        self._output: asyncio.Task[tuple[bytes, bool]] | None = None
        self._stderr: asyncio.Task[bytes] | None = None
        self._exited: asyncio.Future[int | None] | None = None
        self.pid: int | None = None

    def result(
        self,
        ok: bool,
        output: str,
        error_kind: str | None,
        state: str | None = None,
        cpu_s: float | None = None,
    ) -> ToolResult:
        return ToolResult(ok, output, error_kind, time.monotonic() - self._started, state, cpu_s)

    async def start(self, stdin_descriptor: int) -> ToolResult | None:
        """Starts the child; a failure's result, or None once it runs."""
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe()
        try:
            pid, self._exited = await _running_zygote().start(
                self._workdir, [stdin_descriptor, stdout_write, stderr_write]
            )
        except (OSError, ZygoteLost) as error:
            for descriptor in (stdout_read, stdout_write, stderr_read, stderr_write):
                os.close(descriptor)
            self.close()
            return self.result(False, f"cannot start the tool process: {error}", "crash")
        finally:
            os.close(stdin_descriptor)
        os.close(stdout_write)
        os.close(stderr_write)
        self.pid = pid
        self._cleanup.callback(_kill_group, pid)
        stdout, stdout_transport = await _pipe_reader(stdout_read)
        self._cleanup.callback(stdout_transport.close)
        stderr, stderr_transport = await _pipe_reader(stderr_read)
        self._cleanup.callback(stderr_transport.close)
        self._output = asyncio.create_task(_read_capped(stdout, self._limits.max_output_bytes))
        self._cleanup.callback(self._output.cancel)
        self._stderr = asyncio.create_task(_drain_tail(stderr))
        self._cleanup.callback(self._stderr.cancel)
        return None

    async def outcome(self, timeout_s: float) -> ToolResult:
        """The child's result, waiting at most `timeout_s`; the child is gone after."""
        assert self._output is not None and self._stderr is not None and self._exited
        try:
            async with asyncio.timeout(timeout_s):
                output, overflowed = await self._output
                if overflowed:
                    return self.result(
                        False,
                        f"the tool's output exceeded {self._limits.max_output_bytes} bytes",
                        "output_too_large",
                    )
                status = await self._exited
                stderr_tail = await self._stderr
        except TimeoutError:
            return self.result(False, f"the tool ran longer than {timeout_s:g} s", "timeout")
        finally:
            self.close()
        try:
            reply = json.loads(output)
            return self.result(
                bool(reply["ok"]),
                str(reply["output"]),
                reply.get("error_kind"),
                reply.get("state"),
                reply.get("cpu_s"),
            )
        except (ValueError, KeyError, TypeError):
            error_kind, reason = _exit_description(status, stderr_tail)
            return self.result(False, reason, error_kind)

    def close(self) -> None:
        self._cleanup.close()


async def run_sandboxed(call: SandboxCall, limits: SandboxLimits) -> ToolResult:
    child = _SandboxedChild(limits, time.monotonic())
    try:
        # A file, not a pipe, carries the request: the child reads it whenever it
        # likes and a large request cannot block the worker.
        with tempfile.TemporaryFile() as request_file:
            request_file.write(_request_line(call, limits, partial=False))
            request_file.seek(0)
            failed = await child.start(os.dup(request_file.fileno()))
        return failed or await child.outcome(call.timeout_s)
    finally:
        child.close()  # also when the caller is cancelled


class PartialCall:
    """A sandboxed call of a partial-input tool (`toolworkers.partial_input`) that
    runs while the model still writes it: `feed` each piece as the call's stream
    completes it, then `finish` with the whole arguments (the timeout counts from
    there), or `abandon` it (also when the caller is cancelled before the
    result). `call.arguments` is not used."""

    def __init__(self, call: SandboxCall, limits: SandboxLimits):
        self._call = call
        self._limits = limits
        self._child = _SandboxedChild(limits, time.monotonic())
        self._pipe: asyncio.WriteTransport | None = None
        self._failed: ToolResult | None = None

    async def start(self) -> None:
        stdin_read, stdin_write = os.pipe()
        self._failed = await self._child.start(stdin_read)
        if self._failed is not None:
            os.close(stdin_write)
            return
        loop = asyncio.get_running_loop()
        self._pipe, _protocol = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(stdin_write, "wb", buffering=0)
        )
        self._send(_request_line(self._call, self._limits, partial=True))

    def feed(self, piece: Any) -> None:
        self._send(json.dumps({"piece": piece}, default=str).encode() + b"\n")

    async def finish(self, arguments: dict[str, Any]) -> ToolResult:
        if self._failed is not None:
            return self._failed
        self._send(json.dumps({"finish": arguments}, default=str).encode() + b"\n")
        if self._pipe is not None:
            self._pipe.close()
        return await self._child.outcome(self._call.timeout_s)

    @property
    def pid(self) -> int | None:
        """The call's process, once started."""
        return self._child.pid

    def abandon(self) -> None:
        if self._pipe is not None and not self._pipe.is_closing():
            self._pipe.abort()
        self._child.close()

    def _send(self, line: bytes) -> None:
        if self._pipe is not None and not self._pipe.is_closing():
            self._pipe.write(line)
