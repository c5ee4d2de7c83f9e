"""AIPerf as a peer benchmark: the command it is run with and its per-request
export read back as this harness's requests and programs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.peer import aiperf_command, aiperf_report_figures, records_from_export
from bench.workloads import plan_workload
from bench.workloads.aiperf import AGENT_TYPE, AiperfWorkload

WORKLOAD = AiperfWorkload(
    conversations=2, turns=2, turn_delay_ms=1000, turn_delay_stddev_ms=0,
    input_tokens=64, output_tokens=32, concurrency=2, seed=5,
)  # fmt: skip
S = 1_000_000_000


def _record(
    session: str,
    turn: int,
    start_s: float,
    end_s: float,
    error: Any = None,
    conversation: str | None = None,
) -> dict[str, Any]:
    """The fields AIPerf 0.13's `profile_export.jsonl` writes that are read back."""
    return {
        "metadata": {
            "session_num": 0,
            "x_correlation_id": f"uuid-{session}",
            "conversation_id": conversation or f"session_{session}",
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
    assert set(programs) == {"session_a", "session_b"}, "warm-up requests are not the workload"
    a, b = programs["session_a"], programs["session_b"]
    assert (a.arrival_s, a.finished_s, a.jct_s, a.turns) == pytest.approx((0.0, 4.5, 4.5, 2))
    assert a.tool_time_s == pytest.approx(1.0)
    assert a.error is None and b.error == "boom"
    assert a.agent_type == AGENT_TYPE and a.system == "stock-vllm" and a.repeat == 2
    assert result.wall_s == pytest.approx(4.5)
    turn = next(r for r in result.requests if r.program_id == "session_a" and r.turn_index == 1)
    assert (turn.sent_s, turn.latency_s) == pytest.approx((3.0, 1.5))
    assert (turn.prompt_tokens, turn.completion_tokens) == (195, 32)


def test_the_peer_workload_sends_no_programs_of_its_own() -> None:
    plan = plan_workload("aiperf-multi-turn", "quick")
    assert plan.peer is not None and list(plan.build(0)) == []


def test_programs_are_named_by_conversation_so_runs_pair_up() -> None:
    # AIPerf's session ids are random per run; its conversation ids are not.
    export = [
        _record("x1", 0, 10.0, 11.0, conversation="session_000000"),
        _record("x2", 0, 10.0, 12.0, conversation="session_000001"),
        _record("x3", 0, 13.0, 14.0, conversation="session_000000"),
    ]
    result = records_from_export(export, "toolserve", 0)
    assert sorted(p.program_id for p in result.programs) == [
        "session_000000",
        "session_000000#2",
        "session_000001",
    ]


def test_aiperf_own_figures_are_read_from_its_report(tmp_path: Path) -> None:
    nested = tmp_path / "artifacts"
    nested.mkdir()
    (nested / "profile_export_aiperf.json").write_text(
        json.dumps(
            {
                "request_latency": {"unit": "ms", "avg": 755.7, "p90": 1904.0},
                "time_to_first_token": {"unit": "ms", "avg": 421.5},
                "inter_token_latency": {"unit": "ms", "avg": 47.7},
                "output_token_throughput": {"unit": "tokens/sec", "avg": 29.5},
            }
        )
    )
    assert aiperf_report_figures(tmp_path) == {
        "request_latency_ms": 755.7,
        "request_latency_p90_ms": 1904.0,
        "time_to_first_token_ms": 421.5,
        "inter_token_latency_ms": 47.7,
        "output_tokens_per_s": 29.5,
    }
    assert aiperf_report_figures(tmp_path / "nothing-here") == {}
