"""How the ingress's calls to the tool-worker pool end when a worker is lost or
hangs (the pool's handle is a stand-in; the workers' own behaviour is tested on
real processes in test_sandbox.py and on the cluster in tests/reliability)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ray.exceptions import RayActorError

from toolworkers import workers
from toolworkers.sandbox import SandboxCall, ToolResult

CALL = SandboxCall("toolworkers.hosted_tools:calculator", {"expression": "1+1"}, {}, 0.1)


class _Method:
    def __init__(self, answer: Any):
        self._answer = answer

    def remote(self, *args: Any) -> Any:
        return self._answer()


class _Pool:
    def __init__(self, answer: Any):
        self.run = self.run_partial = _Method(answer)


def _run(answer: Any, partial: bool = False) -> ToolResult:
    run, run_partial = workers.worker_pool_runner(_Pool(answer))  # type: ignore[arg-type]
    return asyncio.run(run_partial(CALL, "call-1") if partial else run(CALL))


def test_a_lost_worker_is_a_tool_error() -> None:
    async def lost() -> ToolResult:
        raise RayActorError()

    result = _run(lost)
    assert (result.ok, result.error_kind) == (False, "worker_lost")


def test_a_silent_worker_is_a_tool_error_after_the_tools_limit_and_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers, "WORKER_ANSWER_GRACE_S", 0.2)

    async def hangs() -> ToolResult:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    result = _run(hangs)
    assert (result.ok, result.error_kind) == (False, "worker_unresponsive")


def test_an_answer_is_passed_on_and_partial_calls_have_no_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers, "WORKER_ANSWER_GRACE_S", 0.0)
    done = ToolResult(True, "2", None, 0.01)

    async def slow_answer() -> ToolResult:
        await asyncio.sleep(0.3)  # past the whole-call deadline of 0.1 s
        return done

    assert _run(slow_answer, partial=True) == done
