"""AIPerf (NVIDIA's maintained serving benchmark, `pip install aiperf`) driving a
system the way its own users run it: `aiperf profile` against the system's
OpenAI API with synthetic multi-turn conversations. Each turn sends the whole
history, the server's real replies included; every conversation carries its own
`X-Session-ID`; a pause between turns stands for the agent's tool time.

AIPerf runs in a virtualenv of its own (its dependencies are not this project's
pins). Its per-request export is read back into this harness's records, so the
rounds, intervals and comparisons are computed exactly as for `toolserve bench`'s
own workloads, and AIPerf's report files are kept beside ours.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench.records import ProgramRecord, RequestRecord, RunResult
from bench.workloads.aiperf import AGENT_TYPE, AiperfWorkload
from cluster.config import REPO_ROOT

AIPERF_VERSION = "0.13.0"
AIPERF_VENV = REPO_ROOT / ".venv-aiperf"
EXPORT_FILE = "profile_export.jsonl"
REPORT_FILE = "profile_export_aiperf.json"
# Our name -> (AIPerf's metric, its statistic) in AIPerf's own summary report.
AIPERF_FIGURES = {
    "request_latency_ms": ("request_latency", "avg"),
    "request_latency_p90_ms": ("request_latency", "p90"),
    "time_to_first_token_ms": ("time_to_first_token", "avg"),
    "inter_token_latency_ms": ("inter_token_latency", "avg"),
    "output_tokens_per_s": ("output_token_throughput", "avg"),
}
_TIMEOUT_S = 3600.0


def aiperf_executable() -> str:
    """This checkout's AIPerf virtualenv, else `aiperf` on the PATH."""
    for candidate in (AIPERF_VENV / "bin" / "aiperf", shutil.which("aiperf")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise RuntimeError(
        f"aiperf not found: python3 -m venv {AIPERF_VENV} && "
        f"{AIPERF_VENV}/bin/pip install aiperf=={AIPERF_VERSION}"
    )


def aiperf_command(
    workload: AiperfWorkload,
    executable: str,
    base_url: str,
    model: str,
    tokenizer: str,
    artifact_dir: Path,
) -> list[str]:
    """`aiperf profile` for `workload` against `base_url` (an OpenAI `/v1` URL)."""
    server = base_url.removesuffix("/").removesuffix("/v1")
    return [
        executable, "profile",
        "--model", model,
        "--url", server,
        "--endpoint-type", "chat",
        "--streaming",
        "--tokenizer", tokenizer,
        "--use-legacy-max-tokens",
        "--session-header", "X-Session-ID",
        "--conversation-num", str(workload.conversations),
        "--conversation-turn-mean", str(workload.turns),
        "--conversation-turn-stddev", "0",
        "--conversation-turn-delay-mean", f"{workload.turn_delay_ms:g}",
        "--conversation-turn-delay-stddev", f"{workload.turn_delay_stddev_ms:g}",
        "--synthetic-input-tokens-mean", str(workload.input_tokens),
        "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(workload.output_tokens),
        "--output-tokens-stddev", "0",
        "--extra-inputs", "temperature:0",
        "--concurrency", str(workload.concurrency),
        "--random-seed", str(workload.seed),
        "--ui-type", "none",
        "--output-artifact-dir", str(artifact_dir),
    ]  # fmt: skip


def run_aiperf(
    workload: AiperfWorkload,
    base_url: str,
    model: str,
    tokenizer: str,
    artifact_dir: Path,
    system: str,
    repeat: int,
) -> RunResult:
    """Runs `aiperf profile` to completion and reads its per-request export."""
    artifact_dir.mkdir(parents=True, exist_ok=True)
    command = aiperf_command(
        workload, aiperf_executable(), base_url, model, tokenizer, artifact_dir
    )
    (artifact_dir / "command.json").write_text(json.dumps(command, indent=2) + "\n")
    # The tokenizer is a local directory, which AIPerf loads without the Hub; its
    # offline mode would instead demand a Hub cache entry.
    environment = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1"}
    with (artifact_dir / "aiperf.log").open("w") as log:
        finished = subprocess.run(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            timeout=_TIMEOUT_S,
            check=False,
        )
    if finished.returncode != 0:
        raise RuntimeError(f"aiperf exited {finished.returncode}; see {artifact_dir}/aiperf.log")
    exports = sorted(artifact_dir.rglob(EXPORT_FILE))
    if not exports:
        raise RuntimeError(f"aiperf wrote no {EXPORT_FILE} under {artifact_dir}")
    lines = exports[0].read_text().splitlines()
    return records_from_export([json.loads(line) for line in lines if line.strip()], system, repeat)


def aiperf_report_figures(artifact_dir: Path) -> dict[str, float]:
    """The figures of `AIPERF_FIGURES` from the report AIPerf wrote itself."""
    reports = sorted(artifact_dir.rglob(REPORT_FILE))
    if not reports:
        return {}
    report = json.loads(reports[0].read_text())
    figures = {}
    for name, (metric, statistic) in AIPERF_FIGURES.items():
        value = (report.get(metric) or {}).get(statistic)
        if isinstance(value, int | float):
            figures[name] = float(value)
    return figures


def _metric(record: dict[str, Any], name: str) -> float | None:
    value = (record.get("metrics") or {}).get(name)
    if isinstance(value, dict):
        value = value.get("value")
    return float(value) if isinstance(value, int | float) else None


def _error_text(metadata: dict[str, Any], record: dict[str, Any]) -> str | None:
    error = record.get("error") or metadata.get("error")
    if not error:
        return None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or error)
    return str(error)


def _session(metadata: dict[str, Any]) -> str:
    """One run of one conversation: AIPerf's per-session correlation id."""
    return str(metadata.get("x_correlation_id") or metadata["session_num"])


def _program_ids(metadata: list[dict[str, Any]]) -> dict[str, str]:
    """Session -> program id: the dataset's conversation id, the same on every
    system and round (AIPerf's session ids are random per run), so runs pair up
    program by program; a conversation AIPerf sent twice gets `#2` on its second
    session, by start time."""
    first_start: dict[str, tuple[int, str]] = {}
    for entry in metadata:
        session = _session(entry)
        start = int(entry["request_start_ns"])
        if session not in first_start or start < first_start[session][0]:
            first_start[session] = (start, str(entry.get("conversation_id") or session))
    ids: dict[str, str] = {}
    sent: dict[str, int] = {}
    for session, (_, conversation) in sorted(first_start.items(), key=lambda item: item[1]):
        sent[conversation] = sent.get(conversation, 0) + 1
        ids[session] = (
            conversation if sent[conversation] == 1 else f"{conversation}#{sent[conversation]}"
        )
    return ids


def records_from_export(export: list[dict[str, Any]], system: str, repeat: int) -> RunResult:
    """AIPerf's per-request records (profiling phase) as this harness's request
    and program records: a conversation is a program, from its first request's
    start to its last reply; the time between a reply and the next turn is its
    tool time. Times are relative to the first request of the run."""
    profiled = [
        record
        for record in export
        if (record.get("metadata") or {}).get("benchmark_phase", "profiling") == "profiling"
    ]
    if not profiled:
        return RunResult([], [], 0.0)
    start_ns = min(record["metadata"]["request_start_ns"] for record in profiled)
    program_ids = _program_ids([record["metadata"] for record in profiled])
    requests: list[RequestRecord] = []
    by_conversation: dict[str, list[tuple[dict[str, Any], RequestRecord]]] = {}
    for record in profiled:
        metadata = record["metadata"]
        conversation = program_ids[_session(metadata)]
        request = RequestRecord(
            system=system,
            repeat=repeat,
            program_id=conversation,
            agent_type=AGENT_TYPE,
            turn_index=int(metadata.get("turn_index") or 0),
            sent_s=(metadata["request_start_ns"] - start_ns) / 1e9,
            latency_s=(metadata["request_end_ns"] - metadata["request_start_ns"]) / 1e9,
            # The server's own counts (`usage`); AIPerf's sequence lengths count
            # only the new message, with its own tokenizer.
            prompt_tokens=int(_metric(record, "usage_prompt_tokens") or 0),
            cached_tokens=None,
            completion_tokens=int(_metric(record, "usage_completion_tokens") or 0),
            finish_reason=None,
            tool_calls=0,
            unusable_calls=0,
            tool_latency_s=0.0,
            error=_error_text(metadata, record),
        )
        requests.append(request)
        by_conversation.setdefault(conversation, []).append((metadata, request))
    programs = []
    for conversation, turns in by_conversation.items():
        turns.sort(key=lambda turn: turn[1].turn_index)
        first_start = turns[0][0]["request_start_ns"]
        last_end = max(metadata["request_end_ns"] for metadata, _ in turns)
        paused_ns = sum(
            max(0, later[0]["request_start_ns"] - earlier[0]["request_end_ns"])
            for earlier, later in pairwise(turns)
        )
        errors = [request.error for _, request in turns if request.error]
        programs.append(
            ProgramRecord(
                system=system,
                repeat=repeat,
                program_id=conversation,
                agent_type=AGENT_TYPE,
                arrival_s=(first_start - start_ns) / 1e9,
                finished_s=(last_end - start_ns) / 1e9,
                jct_s=(last_end - first_start) / 1e9,
                turns=len(turns),
                tool_time_s=paused_ns / 1e9,
                calls=0,
                unusable_calls=0,
                error=errors[0] if errors else None,
            )
        )
    wall_s = max(program.finished_s for program in programs)
    return RunResult(requests, programs, wall_s)
