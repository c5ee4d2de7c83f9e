"""A run's records: built from what the driver saw, written compressed one gzip
member per arm, read back as one stream (and a run's plain file from before)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from bench.records import (
    PLAIN_RECORDS_FILE,
    RECORDS_FILE,
    ClientStall,
    ProgramRecord,
    RequestRecord,
    append_records,
    open_records,
    program_record,
    request_record,
    start_records,
)
from bench.workloads import plan_workload
from bench.workloads.program import AgentProgram, Reply, ToolCall, ToolRound


def _program() -> AgentProgram:
    program = plan_workload("many-agent", "quick").build(0)[1]
    program.turns_sent = 3
    return program


def test_a_request_record_is_the_programs_latest_turn() -> None:
    program = _program()
    reply = Reply(
        content=None,
        tool_calls=(ToolCall("c1", "read_file", "{}"), ToolCall("c2", "run_tests", "{}")),
        finish_reason="tool_calls",
        prompt_tokens=120,
        cached_tokens=96,
        completion_tokens=14,
        replica="replica-1",
        first_result_s=0.4,
        first_token_s=0.2,
    )
    record = request_record("toolserve", 1, program, 2.5, 0.75, reply, ToolRound(1.25, 2, 1), None)
    assert record.as_json() == {
        "kind": "request",
        "system": "toolserve",
        "repeat": 1,
        "program_id": program.program_id,
        "agent_type": program.agent_type,
        "turn_index": 2,
        "sent_s": 2.5,
        "latency_s": 0.75,
        "prompt_tokens": 120,
        "cached_tokens": 96,
        "completion_tokens": 14,
        "finish_reason": "tool_calls",
        "tool_calls": 2,
        "unusable_calls": 1,
        "tool_latency_s": 1.25,
        "error": None,
        "replica": "replica-1",
        "first_result_s": 0.4,
        "first_token_s": 0.2,
        "prefix": None,
        "server_ran_calls": 0,
        "server_ran_rounds": 0,
    }


def test_a_failed_request_records_no_tokens_and_no_tool_round() -> None:
    record = request_record("stock-vllm", 0, _program(), 1.0, 0.5, None, None, "APIError: boom")
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (0, None, 0)
    assert (record.tool_calls, record.unusable_calls, record.tool_latency_s) == (0, 0, 0.0)
    assert record.error == "APIError: boom" and record.replica is None
    assert record.first_token_s is None


def test_a_request_recorded_before_first_tokens_were_timed_reads_back_without_one() -> None:
    older = {
        "system": "stock-vllm", "repeat": 0, "program_id": "p", "agent_type": "coding",
        "turn_index": 0, "sent_s": 0.0, "latency_s": 1.0, "prompt_tokens": 10,
        "cached_tokens": 0, "completion_tokens": 5, "finish_reason": "length",
        "tool_calls": 0, "unusable_calls": 0, "tool_latency_s": 0.0, "error": None,
        "replica": None, "first_result_s": None,
    }  # fmt: skip
    assert RequestRecord(**older).first_token_s is None


def test_a_programs_jct_runs_from_its_arrival() -> None:
    program = _program()
    record = program_record("stock-vllm", 0, program, program.arrival_s + 9.0, 3.0, 4, 1, None)
    assert record.jct_s == 9.0 and record.turns == 3
    assert (record.tool_time_s, record.calls, record.unusable_calls) == (3.0, 4, 1)


def _stall(system: str) -> ClientStall:
    return ClientStall(system, 0, 1.0, 0.6, "loop")


def test_each_arms_records_are_a_gzip_member_and_read_back_as_one_stream(
    tmp_path: Path,
) -> None:
    path = start_records(tmp_path)
    assert path.name == RECORDS_FILE
    with open_records(tmp_path) as records:
        assert records.read() == ""
    program = program_record("a", 0, _program(), 10.0, 0.0, 0, 0, None)
    append_records(path, [program, _stall("a")])
    append_records(path, [_stall("b")])
    assert path.read_bytes().count(b"\x1f\x8b\x08") >= 2
    with open_records(tmp_path) as records:
        lines = [json.loads(line) for line in records]
    assert [(line["kind"], line["system"]) for line in lines] == [
        ("program", "a"),
        ("client_stall", "a"),
        ("client_stall", "b"),
    ]
    assert ProgramRecord(**{k: v for k, v in lines[0].items() if k != "kind"}) == program
    with gzip.open(path, "rt") as whole:
        assert len(whole.read().splitlines()) == 3


def test_a_run_recorded_before_compression_is_read_from_its_plain_file(tmp_path: Path) -> None:
    (tmp_path / PLAIN_RECORDS_FILE).write_text(json.dumps(_stall("a").as_json()) + "\n")
    with open_records(tmp_path) as records:
        assert [json.loads(line)["kind"] for line in records] == ["client_stall"]
