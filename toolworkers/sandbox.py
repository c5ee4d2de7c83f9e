"""Runs one tool call in a fresh subprocess: its own working directory and
session, memory, CPU-time and file-size limits, no network unless allowed, a
wall-clock timeout and a cap on output. Every failure (crash, hang, memory
blow-up, oversized output, bad arguments) comes back as a `ToolResult`, never
as an exception or a hung caller."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from cluster.config import SandboxLimits

_STDERR_TAIL_BYTES = 2048
_READ_CHUNK = 65536


@dataclass(frozen=True)
class ToolResult:
    """`output` is the tool's text when `ok`, else what went wrong, for the model."""

    ok: bool
    output: str
    error_kind: str | None
    duration_s: float

    def for_model(self) -> str:
        return self.output if self.ok else f"error: {self.output}"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "output": self.output,
            "error_kind": self.error_kind,
            "duration_s": self.duration_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolResult:
        return cls(
            ok=bool(data["ok"]),
            output=str(data["output"]),
            error_kind=data.get("error_kind"),
            duration_s=float(data.get("duration_s", 0.0)),
        )


@dataclass(frozen=True)
class SandboxCall:
    """One call: the function the child imports, the model's arguments, and the
    options configuration binds to every call of the tool."""

    function_reference: str
    arguments: dict[str, Any]
    options: dict[str, Any]
    timeout_s: float


def _child_environment(workdir: str) -> dict[str, str]:
    # Nothing of the worker's environment (credentials among it) reaches the tool.
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }


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


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _exit_description(returncode: int, stderr_tail: bytes) -> tuple[str, str]:
    if returncode < 0:
        signal_number = -returncode
        name = signal.Signals(signal_number).name if signal_number in signal.valid_signals() else ""
        if signal_number == signal.SIGXCPU:
            return "cpu_limit", "the tool used more CPU time than allowed"
        reason = f"the tool process was killed by {name or signal_number}"
    else:
        reason = f"the tool process exited with status {returncode}"
    last_line = stderr_tail.decode(errors="replace").strip().splitlines()[-1:]
    return "crash", reason + (f": {last_line[0][:300]}" if last_line else "")


async def run_sandboxed(call: SandboxCall, limits: SandboxLimits) -> ToolResult:
    started = time.monotonic()

    def result(ok: bool, output: str, error_kind: str | None) -> ToolResult:
        return ToolResult(ok, output, error_kind, time.monotonic() - started)

    request = json.dumps(
        {
            "function": call.function_reference,
            "arguments": call.arguments,
            "options": call.options,
            "limits": {
                "memory_mb": limits.memory_mb,
                "cpu_s": min(limits.cpu_s, call.timeout_s + 1),
                "max_file_bytes": limits.max_file_bytes,
                "network": limits.network,
            },
        },
        default=str,
    ).encode()
    workdir = tempfile.mkdtemp(prefix="toolserve-tool-")
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-s", "-m", "toolworkers.sandbox_child",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=_child_environment(workdir),
            start_new_session=True,
        )  # fmt: skip
    except OSError as error:
        shutil.rmtree(workdir, ignore_errors=True)
        return result(False, f"cannot start the tool process: {error}", "crash")
    assert process.stdin and process.stdout and process.stderr
    stderr_task = asyncio.create_task(_drain_tail(process.stderr))
    try:
        async with asyncio.timeout(call.timeout_s):
            process.stdin.write(request)
            with contextlib.suppress(ConnectionError):
                await process.stdin.drain()
            process.stdin.close()
            stdout, overflowed = await _read_capped(process.stdout, limits.max_output_bytes)
            if overflowed:
                _kill_group(process)
                return result(
                    False,
                    f"the tool's output exceeded {limits.max_output_bytes} bytes",
                    "output_too_large",
                )
            returncode = await process.wait()
            stderr_tail = await stderr_task
    except TimeoutError:
        return result(False, f"the tool ran longer than {call.timeout_s:g} s", "timeout")
    finally:
        _kill_group(process)
        stderr_task.cancel()
        with contextlib.suppress(ProcessLookupError):
            await process.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    try:
        reply = json.loads(stdout)
        return result(bool(reply["ok"]), str(reply["output"]), reply.get("error_kind"))
    except (ValueError, KeyError, TypeError):
        error_kind, reason = _exit_description(returncode, stderr_tail)
        return result(False, reason, error_kind)
