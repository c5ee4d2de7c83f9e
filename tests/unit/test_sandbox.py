"""The sandbox each hosted tool call runs in: real subprocesses, real limits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
from tool_paths import owned_by_tools

from cluster.config import SandboxLimits
from toolworkers import sandbox
from toolworkers.sandbox import SandboxCall, ToolResult, run_sandboxed

LIMITS = SandboxLimits(memory_mb=512, cpu_s=30, max_output_bytes=64 * 1024)


def run(
    function: str,
    arguments: dict[str, object] | None = None,
    *,
    timeout_s: float = 20.0,
    limits: SandboxLimits = LIMITS,
    options: dict[str, object] | None = None,
) -> ToolResult:
    call = SandboxCall(f"sandbox_probes:{function}", arguments or {}, options or {}, timeout_s)
    return asyncio.run(run_sandboxed(call, limits))


def test_a_tool_returns_its_text() -> None:
    result = run("echo", {"text": "héllo"})
    assert result == ToolResult(True, "héllo", None, result.duration_s, cpu_s=result.cpu_s)
    assert result.for_model() == "héllo"


def test_a_call_reports_the_cpu_it_used_not_the_time_it_waited() -> None:
    waited = run("hang", {"seconds": 1.0})
    assert waited.cpu_s is not None and waited.duration_s >= 1.0
    assert 0 < waited.cpu_s < waited.duration_s / 2, waited
    killed = run("hang", {"seconds": 30}, timeout_s=1.0)
    assert killed.error_kind == "timeout" and killed.cpu_s is None


def test_structured_results_come_back_as_json() -> None:
    result = run("structured", {"count": 3})
    assert result.ok
    assert json.loads(result.output) == {"numbers": [0, 1, 2]}


def test_a_hang_is_cut_at_the_timeout() -> None:
    result = run("hang", {"seconds": 60}, timeout_s=1.0)
    assert (result.ok, result.error_kind) == (False, "timeout")
    assert result.duration_s < 30
    assert result.for_model().startswith("error: the tool ran longer than 1 s")


def test_a_cpu_spin_is_stopped_by_the_cpu_limit() -> None:
    result = run("spin", timeout_s=60, limits=LIMITS.model_copy(update={"cpu_s": 1}))
    assert (result.ok, result.error_kind) == (False, "cpu_limit")


def test_a_memory_blow_up_is_a_clean_error() -> None:
    result = run("eat_memory", {"megabytes": 2048})
    assert (result.ok, result.error_kind) == (False, "memory_limit")


def test_the_same_allocation_fits_a_larger_limit() -> None:
    result = run("eat_memory", {"megabytes": 64})
    assert result.ok, result


def test_network_is_refused_by_default() -> None:
    result = run("connect", {"host": "127.0.0.1", "port": 6379})
    assert not result.ok
    assert result.error_kind == "tool_error"
    assert "network access is disabled" in result.output


def test_network_can_be_allowed() -> None:
    result = run(
        "connect",
        {"host": "127.0.0.1", "port": 6379},
        limits=LIMITS.model_copy(update={"network": True}),
    )
    assert result.ok, result


def test_a_crash_is_reported_with_its_signal() -> None:
    result = run("crash")
    assert (result.ok, result.error_kind) == (False, "crash")
    assert "SIGSEGV" in result.output


def test_an_exit_without_a_result_is_a_crash() -> None:
    result = run("exit_quietly")
    assert (result.ok, result.error_kind) == (False, "crash")
    assert "status 3" in result.output


def test_oversized_output_is_refused() -> None:
    result = run("flood", {"megabytes": 8})
    assert (result.ok, result.error_kind) == (False, "output_too_large")
    assert "65536 bytes" in result.output


def test_printing_does_not_corrupt_the_result() -> None:
    assert run("chatty").output == "quiet result"


def test_tool_errors_and_exceptions_reach_the_model_as_text() -> None:
    refused = run("refuse", {"reason": "no such city"})
    assert (refused.ok, refused.error_kind, refused.output) == (False, "tool_error", "no such city")
    failed = run("fail")
    assert failed.error_kind == "tool_error"
    assert failed.output == "KeyError: 'no such record'"


def test_bad_arguments_and_unknown_functions() -> None:
    assert run("echo", {"txt": "typo"}).error_kind == "bad_arguments"
    assert run("echo", {}).error_kind == "bad_arguments"
    assert run("no_such_probe").error_kind == "unknown_tool"


def test_each_call_gets_its_own_directory_and_no_inherited_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    first = run("where_am_i").output.split("|")
    second = run("where_am_i").output.split("|")
    assert first[0] != second[0]
    assert first[1] == second[1] == ""
    assert not Path(first[0]).exists(), "the working directory is removed after the call"


def test_options_are_bound_as_keywords() -> None:
    assert run("with_root", {"path": "a.txt"}, options={"root": "/data"}).output == "/data/a.txt"


def test_concurrent_calls_do_not_interfere() -> None:
    async def many() -> list[ToolResult]:
        calls = [
            run_sandboxed(SandboxCall("sandbox_probes:echo", {"text": str(n)}, {}, 20), LIMITS)
            for n in range(6)
        ]
        calls.append(
            run_sandboxed(SandboxCall("sandbox_probes:hang", {"seconds": 60}, {}, 1), LIMITS)
        )
        return await asyncio.gather(*calls)

    results = asyncio.run(many())
    assert [result.output for result in results[:6]] == [str(n) for n in range(6)]
    assert results[6].error_kind == "timeout"


def test_a_lost_zygote_is_replaced_and_a_running_call_still_finishes() -> None:
    async def scenario() -> tuple[ToolResult, ToolResult, ToolResult]:
        first = await run_sandboxed(
            SandboxCall("sandbox_probes:echo", {"text": "a"}, {}, 20), LIMITS
        )
        zygote = sandbox._running_zygote()
        running = asyncio.create_task(
            run_sandboxed(SandboxCall("sandbox_probes:hang", {"seconds": 1}, {}, 20), LIMITS)
        )
        await asyncio.sleep(0.5)
        os.kill(zygote.pid, signal.SIGKILL)
        interrupted = await running
        after = await run_sandboxed(
            SandboxCall("sandbox_probes:echo", {"text": "b"}, {}, 20), LIMITS
        )
        assert sandbox._running_zygote().pid != zygote.pid
        return first, interrupted, after

    first, interrupted, after = asyncio.run(scenario())
    assert (first.output, interrupted.output, after.output) == ("a", "woke up", "b")


PYTHON_TOOL = "toolworkers.python_tool:python"


async def partial_call(pieces: list[str], arguments: dict[str, object]) -> ToolResult:
    call = sandbox.PartialCall(SandboxCall(PYTHON_TOOL, {}, {}, 20.0), LIMITS)
    await call.start()
    for piece in pieces:
        call.feed(piece)
    return await call.finish(arguments)


def test_a_partial_call_runs_its_pieces_before_it_is_finished(tmp_path: Path) -> None:
    marker = tmp_path / "marker"

    limits = LIMITS.model_copy(update={"allowed_paths": [owned_by_tools(tmp_path)]})

    async def scenario() -> ToolResult:
        call = sandbox.PartialCall(SandboxCall(PYTHON_TOOL, {}, {}, 20.0), limits)
        await call.start()
        call.feed(f"open({str(marker)!r}, 'w').write('ran')\n")
        for _ in range(200):
            if marker.exists():
                break
            await asyncio.sleep(0.05)
        assert marker.read_text() == "ran"  # the arguments are not finished yet
        call.feed("print('done')\n")
        return await call.finish({"code": "..."})

    result = asyncio.run(scenario())
    assert (result.ok, result.output) == (True, "done\n")


def test_a_partial_call_gives_the_whole_calls_result() -> None:
    code = "x = 6\nprint(x * 7)\nprint(undefined)\nprint('never')\n"
    pieces = ["x = 6\n", "print(x * 7)\n", "print(undefined)\n", "print('never')\n"]
    partial = asyncio.run(partial_call(pieces, {"code": code}))
    whole = asyncio.run(run_sandboxed(SandboxCall(PYTHON_TOOL, {"code": code}, {}, 20.0), LIMITS))
    assert (partial.ok, partial.error_kind, partial.output) == (
        whole.ok,
        whole.error_kind,
        whole.output,
    )
    assert partial.output == "42\nline 3: NameError: name 'undefined' is not defined"


def test_a_tool_without_partial_input_refuses_a_partial_call() -> None:
    async def scenario() -> ToolResult:
        call = sandbox.PartialCall(SandboxCall("sandbox_probes:echo", {}, {}, 20.0), LIMITS)
        await call.start()
        call.feed("text")
        return await call.finish({"text": "text"})

    result = asyncio.run(scenario())
    assert (result.ok, result.error_kind) == (False, "bad_arguments")


def test_an_abandoned_partial_call_leaves_no_process() -> None:
    async def scenario() -> int:
        call = sandbox.PartialCall(SandboxCall(PYTHON_TOOL, {}, {}, 20.0), LIMITS)
        await call.start()
        call.feed("import os\nprint(os.getpid())\n")
        pid = call.pid
        assert pid is not None
        call.abandon()
        return pid

    pid = asyncio.run(scenario())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} still runs after the call was abandoned")


@pytest.mark.parametrize(
    ("probe", "arguments", "limit"),
    [
        ("read_file", {"path": "/etc/passwd"}, "may not read /etc/passwd"),
        ("read_file", {"path": "/proc/1/environ"}, "may not read /proc/1/environ"),
        ("list_directory", {"path": "/"}, "may not read /"),
        ("read_through_symlink", {"target": "/etc/hostname"}, "may not read /etc/hostname"),
        ("write_file", {"path": "/toolserve-escape"}, "may not write /toolserve-escape"),
        ("write_file", {"path": "../escape.txt"}, "may not write"),
        ("fork_bomb", {}, "starting processes is disabled"),
        ("spawn_shell", {}, "starting processes is disabled"),
        ("shell_out", {}, "starting processes is disabled"),
        ("ptrace_parent", {}, "foreign code (ctypes) is disabled"),
        ("kill_parent", {}, "may signal only its own process"),
    ],
)
def test_escape_attempts_are_clean_tool_errors_naming_the_limit(
    probe: str, arguments: dict[str, object], limit: str
) -> None:
    result = run(probe, arguments)
    assert (result.ok, result.error_kind) == (False, "tool_error"), result
    assert limit in result.output, result.output
    assert run("echo", {"text": "still here"}).output == "still here"


def test_a_tool_reads_and_writes_its_call_directory_and_its_option_paths(tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("granted")
    assert run("read_file", {"path": str(data)}).output.startswith("PermissionError")
    granted = run("read_under", {"path": "data.txt"}, options={"root": owned_by_tools(tmp_path)})
    assert granted.output == "granted"
    assert run("where_am_i").ok, "the call directory stays writable"
    assert "SECRET" not in run("environment").output
