"""A run's records: one per model request, per agent program and per client stall,
built from what the driver saw, and their file (`records.jsonl.gz`, one JSON
object a line)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from bench.workloads.program import AgentProgram, Reply, ToolRound

RECORDS_FILE = "records.jsonl.gz"
PLAIN_RECORDS_FILE = "records.jsonl"
"""What runs recorded before their records were compressed wrote."""


@dataclass(frozen=True)
class RequestRecord:
    """One model request, as the agent saw it."""

    system: str
    repeat: int
    program_id: str
    agent_type: str
    turn_index: int
    sent_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int | None
    completion_tokens: int
    finish_reason: str | None
    tool_calls: int
    unusable_calls: int
    tool_latency_s: float
    error: str | None = None
    replica: str | None = None
    first_result_s: float | None = None
    """Seconds from sending to the first tool result the server ran (streamed
    replies); for a call the server rejected, when its error came."""
    first_token_s: float | None = None
    """Seconds from sending to the first generated token (streamed replies; None
    otherwise, and in records written before it was recorded)."""
    prefix: str | None = None
    """The server's check of the prompt against what it held for the program
    (`X-Toolserve-Prefix`), where it made one."""
    server_ran_calls: int = 0
    """Calls the server ran itself within the request (hosted tools)."""
    server_ran_rounds: int = 0
    """Model turns the server ran after those calls within the request: returning
    turns to the engine that the client never sent (0 in records written before it
    was recorded)."""

    def as_json(self) -> dict[str, Any]:
        return {"kind": "request", **asdict(self)}


@dataclass(frozen=True)
class ProgramRecord:
    """One agent program from its arrival to its last reply."""

    system: str
    repeat: int
    program_id: str
    agent_type: str
    arrival_s: float
    finished_s: float
    jct_s: float
    turns: int
    tool_time_s: float
    calls: int
    unusable_calls: int
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"kind": "program", **asdict(self)}


@dataclass(frozen=True)
class ClientStall:
    """A moment the benchmark client itself was late: its event loop woke late
    (`loop`) or a thread-pool call waited to start (`threads`). Time lost here
    shows up in every latency the client measures, whatever the system did."""

    system: str
    repeat: int
    at_s: float
    lag_s: float
    where: str

    def as_json(self) -> dict[str, Any]:
        return {"kind": "client_stall", **asdict(self)}


@dataclass
class ProgramLoad:
    """Programs kept running for a stretch of time (a soak, a node-loss run):
    how many started, run, finished, and their records."""

    started: int = 0
    running: int = 0
    completed: int = 0
    failed: int = 0
    stopped: int = 0
    """Programs still running when the load ended, their requests cancelled."""
    programs: list[ProgramRecord] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)

    def finished(self, record: ProgramRecord) -> None:
        self.programs.append(record)
        if record.error is None:
            self.completed += 1
        else:
            self.failed += 1


@dataclass(frozen=True)
class RunResult:
    requests: list[RequestRecord]
    programs: list[ProgramRecord]
    wall_s: float
    stalls: list[ClientStall] = field(default_factory=list)


def request_record(
    system: str,
    repeat: int,
    program: AgentProgram,
    sent_s: float,
    latency_s: float,
    reply: Reply | None,
    tool_round: ToolRound | None,
    error: str | None,
) -> RequestRecord:
    """The program's latest turn: `sent_s` from the run's start; without a reply
    (the request failed), no tokens and no tool round."""
    return RequestRecord(
        system=system,
        repeat=repeat,
        program_id=program.program_id,
        agent_type=program.agent_type,
        turn_index=program.turns_sent - 1,
        sent_s=sent_s,
        latency_s=latency_s,
        prompt_tokens=reply.prompt_tokens if reply else 0,
        cached_tokens=reply.cached_tokens if reply else None,
        completion_tokens=reply.completion_tokens if reply else 0,
        finish_reason=reply.finish_reason if reply else None,
        tool_calls=len(reply.tool_calls) if reply else 0,
        unusable_calls=tool_round.unusable_calls if tool_round else 0,
        tool_latency_s=tool_round.latency_s if tool_round else 0.0,
        error=error,
        replica=reply.replica if reply else None,
        first_result_s=reply.first_result_s if reply else None,
        first_token_s=reply.first_token_s if reply else None,
    )


def program_record(
    system: str,
    repeat: int,
    program: AgentProgram,
    finished_s: float,
    tool_time_s: float,
    calls: int,
    unusable_calls: int,
    error: str | None,
) -> ProgramRecord:
    """The program once it finished (or failed), `finished_s` from the run's start."""
    return ProgramRecord(
        system=system,
        repeat=repeat,
        program_id=program.program_id,
        agent_type=program.agent_type,
        arrival_s=program.arrival_s,
        finished_s=finished_s,
        jct_s=finished_s - program.arrival_s,
        turns=program.turns_sent,
        tool_time_s=tool_time_s,
        calls=calls,
        unusable_calls=unusable_calls,
        error=error,
    )


def start_records(run_dir: Path) -> Path:
    """The run's records file, empty."""
    path = run_dir / RECORDS_FILE
    path.write_bytes(b"")
    return path


class JsonRecord(Protocol):
    def as_json(self) -> dict[str, Any]: ...


def append_records(path: Path, records: Iterable[JsonRecord]) -> None:
    """One arm's records, appended as a gzip member of their own: a file of
    several members reads back as one stream."""
    with gzip.open(path, "at") as file:
        for record in records:
            file.write(json.dumps(record.as_json()) + "\n")


def open_records(run_dir: Path) -> IO[str]:
    """A run's `records.jsonl.gz`, or the plain `records.jsonl` of a run recorded
    before records were compressed."""
    compressed = run_dir / RECORDS_FILE
    if compressed.exists():
        return gzip.open(compressed, "rt")
    return (run_dir / PLAIN_RECORDS_FILE).open()
