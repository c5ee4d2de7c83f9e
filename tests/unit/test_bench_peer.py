"""AIPerf as a peer benchmark: the command it is run with and its per-request
export read back as this harness's requests and programs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.peer import aiperf_command, records_from_export
from bench.workloads import plan_workload
from bench.workloads.aiperf import AGENT_TYPE, AiperfWorkload

WORKLOAD = AiperfWorkload(
    conversations=2, turns=2, turn_delay_ms=1000, turn_delay_stddev_ms=0,
    input_tokens=64, output_tokens=32, concurrency=2, seed=5,
)  # fmt: skip
S = 1_000_000_000


def _record(
    session: str, turn: int, start_s: float, end_s: float, error: Any = None
) -> dict[str, Any]:
    """The fields AIPerf 0.13's `profile_export.jsonl` writes that are read back."""
    return {
        "metadata": {
            "session_num": 0,
            "x_correlation_id": session,
            "conversation_id": "session_000000",
            "turn_index": turn,
            "request_start_ns": int(start_s * S),
            "request_end_ns": int(end_s * S),
            "benchmark_phase": "profiling",
        },
        "metrics": {
            "usage_prompt_tokens": {"value": 95 + 100 * turn, "unit": "tokens"},
            "usage_completion_tokens": {"value": 32, "unit": "tokens"},
            "input_sequence_length": {"value": 64, "unit": "tokens"},
        },
        "error": error,
    }


def test_the_command_sends_one_session_header_per_conversation() -> None:
    command = aiperf_command(
        WORKLOAD, "aiperf", "http://127.0.0.1:8000/v1", "m", "/models/m", Path("/out")
    )
    flags = {flag: command[i + 1] for i, flag in enumerate(command[:-1]) if flag.startswith("--")}
    assert command[:2] == ["aiperf", "profile"]
    assert flags["--url"] == "http://127.0.0.1:8000", "AIPerf appends /v1/chat/completions"
    assert flags["--session-header"] == "X-Session-ID"
    assert flags["--conversation-num"] == "2" and flags["--conversation-turn-mean"] == "2"
    assert flags["--conversation-turn-delay-mean"] == "1000"
    assert flags["--random-seed"] == "5" and flags["--tokenizer"] == "/models/m"
    assert flags["--output-artifact-dir"] == "/out"


def test_a_conversation_is_a_program_from_first_request_to_last_reply() -> None:
    export = [
        _record("a", 0, 100.0, 102.0),
        _record("b", 0, 100.5, 101.5),
        _record("a", 1, 103.0, 104.5),
        _record("b", 1, 102.5, 103.0, error={"message": "boom"}),
        {**_record("w", 0, 90.0, 91.0), "metadata": {
            **_record("w", 0, 90.0, 91.0)["metadata"], "benchmark_phase": "warmup"}},
    ]  # fmt: skip
    result = records_from_export(export, "stock-vllm", 2)
    programs = {program.program_id: program for program in result.programs}
    assert set(programs) == {"a", "b"}, "warm-up requests are not the workload"
    a, b = programs["a"], programs["b"]
    assert (a.arrival_s, a.finished_s, a.jct_s, a.turns) == pytest.approx((0.0, 4.5, 4.5, 2))
    assert a.tool_time_s == pytest.approx(1.0)
    assert a.error is None and b.error == "boom"
    assert a.agent_type == AGENT_TYPE and a.system == "stock-vllm" and a.repeat == 2
    assert result.wall_s == pytest.approx(4.5)
    turn = next(r for r in result.requests if r.program_id == "a" and r.turn_index == 1)
    assert (turn.sent_s, turn.latency_s) == pytest.approx((3.0, 1.5))
    assert (turn.prompt_tokens, turn.completion_tokens) == (195, 32)


def test_the_peer_workload_sends_no_programs_of_its_own() -> None:
    plan = plan_workload("aiperf-multi-turn", "quick")
    assert plan.peer is not None and list(plan.build(0)) == []
