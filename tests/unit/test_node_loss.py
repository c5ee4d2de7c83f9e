"""The node-loss run's reading of what it saw: the lost node's replica and pins,
when `/health` turned and came back, turns sent again, and errors by kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.node_loss import (
    Event,
    NodeLossOptions,
    NodeLossRun,
    Observation,
    node_loss_summary,
    write_node_loss_run,
)
from bench.provenance import Provenance
from bench.records import ProgramLoad, ProgramRecord, RequestRecord
from cluster.config import CONFIGS_DIR, load_config

LOST = "10.77.0.4"
KEPT = "10.77.0.3"


def _options(**changed: object) -> NodeLossOptions:
    values: dict[str, object] = {
        "programs": 2,
        "load_minutes": 5,
        "lost_node": "model-b",
        "kill_at_s": 60,
        "down_s": 30,
        "partition_at_s": 200,
        "partition_s": 10,
        "drain_timeout_s": 60,
        "seed": 0,
        "config_path": CONFIGS_DIR / "multinode-cpu.yaml",
        "output_dir": Path("unused"),
        "run_name": "node-loss-test",
        "argv": ["node-loss"],
    }
    return NodeLossOptions(**(values | changed))  # type: ignore[arg-type]


def _provenance() -> Provenance:
    return Provenance(
        command="toolserve node-loss",
        commit="0" * 40,
        dirty=False,
        dirty_paths=[],
        allow_dirty=False,
        started_utc="2026-11-29T00:00:00Z",
        finished_utc="2026-11-29T00:10:00Z",
        code_changed_during_run=False,
        packages={},
        machine={"cpu_model": "test CPU"},
    )


def _turn(
    program: str, sent_s: float, replica: str | None, error: str | None = None
) -> RequestRecord:
    return RequestRecord(
        system="toolserve",
        repeat=0,
        program_id=program,
        agent_type="many-agent",
        turn_index=0,
        sent_s=sent_s,
        latency_s=2.0,
        prompt_tokens=0 if error else 300,
        cached_tokens=None,
        completion_tokens=0 if error else 20,
        finish_reason=None if error else "tool_calls",
        tool_calls=0 if error else 1,
        unusable_calls=0,
        tool_latency_s=0.0,
        error=error,
        replica=replica,
    )


def _program(program: str, error: str | None = None) -> ProgramRecord:
    return ProgramRecord(
        system="toolserve",
        repeat=0,
        program_id=program,
        agent_type="many-agent",
        arrival_s=0.0,
        finished_s=100.0,
        jct_s=100.0,
        turns=3,
        tool_time_s=1.0,
        calls=2,
        unusable_calls=0,
        error=error,
    )


def _seen(
    at_s: float, status: str, nodes: dict[str, str], pins: dict[str, int] | None
) -> Observation:
    return Observation(at_s, status, nodes, 0 if status == "ok" else 1, pins)


EVENTS = [
    Event(58.0, "turns running on the node", "2.0"),
    Event(59.0, "kill begins"),
    Event(60.0, "kill ends"),
    Event(90.0, "start begins"),
    Event(92.0, "start ends"),
    Event(200.0, "partition begins"),
    Event(210.5, "partition ends"),
]
BOTH = {"replica-a": KEPT, "replica-b": LOST}
OBSERVATIONS = [
    _seen(50.0, "ok", BOTH, {"replica-a": 2, "replica-b": 3}),
    _seen(58.0, "ok", BOTH, {"replica-a": 1, "replica-b": 4}),
    _seen(62.0, "ok", BOTH, {"replica-a": 1, "replica-b": 4}),
    _seen(66.0, "degraded", {"replica-a": KEPT}, {"replica-a": 3, "replica-b": 1}),
    _seen(74.0, "degraded", {"replica-a": KEPT}, {"replica-a": 4}),
    _seen(150.0, "degraded", {"replica-a": KEPT}, {"replica-a": 4}),
    _seen(160.0, "ok", {"replica-a": KEPT, "replica-c": LOST}, {"replica-a": 4}),
    _seen(204.0, "ok", {"replica-a": KEPT, "replica-c": LOST}, None),
]


def _load() -> ProgramLoad:
    return ProgramLoad(
        started=3,
        completed=2,
        failed=1,
        programs=[_program("p1"), _program("p2"), _program("p3", "InternalServerError: ...")],
        requests=[
            _turn("p1", 40.0, "replica-b"),
            _turn("p1", 61.0, "replica-a"),
            _turn("p2", 45.0, "replica-a"),
            _turn("p2", 199.0, "replica-a"),
            _turn("p2", 203.0, "replica-a"),
            _turn(
                "p3",
                100.0,
                None,
                "InternalServerError: Error code: 500 - {'error': {'message': 'x'}}",
            ),
            _turn("p3", 120.0, None, "InternalServerError: Error code: 502 - upstream"),
        ],
    )


def _run(observations: list[Observation], resends: float = 0.0) -> NodeLossRun:
    return NodeLossRun(
        _options(),
        LOST,
        load_config(CONFIGS_DIR / "multinode-cpu.yaml"),
        _provenance(),
        _load(),
        list(EVENTS),
        observations,
        resends,
    )


def test_the_lost_nodes_replica_pins_and_health_are_read_from_what_was_seen() -> None:
    summary = node_loss_summary(_run(OBSERVATIONS, resends=3.0))
    node = summary["node"]
    assert node["replicas"] == ["replica-b"]
    assert node["turns_running_at_kill"] == 2.0
    assert node["pins_at_kill"] == 4
    assert node["pins_gone_after_s"] == 14.0
    assert node["health_degraded_after_s"] == 6.0
    assert node["serving_again_after_start_s"] == 68.0
    programs, requests = summary["programs"], summary["requests"]
    assert (programs["started"], programs["completed"], programs["failed"]) == (3, 2, 1)
    assert programs["unfinished"] == 0
    assert programs["on_both_model_nodes"] == 1
    assert requests["sent"] == 7 and requests["failed"] == 2
    assert requests["sent_again_after_replica_loss"] == 3.0
    assert requests["errors"] == {
        "InternalServerError (OpenAI-style body)": 1,
        "InternalServerError (no OpenAI-style body)": 1,
    }
    # Ends within the partition (200-210.5 s): the turns sent at 199 and 203 s.
    assert (requests["completed_during_partition"], requests["failed_during_partition"]) == (2, 0)


def test_a_node_never_back_reads_never() -> None:
    still_down = [seen for seen in OBSERVATIONS if seen.at_s < 160.0]
    summary = node_loss_summary(_run(still_down))
    assert summary["node"]["serving_again_after_start_s"] is None


def test_the_run_is_written_with_its_report_plot_and_records(tmp_path: Path) -> None:
    run_dir = write_node_loss_run(tmp_path, _run(OBSERVATIONS, resends=3.0))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["programs"]["completed"] == 2
    report = (run_dir / "report.md").read_text()
    assert "| programs failed | 1 |" in report
    assert "left the ledger 14 s after the kill" in report
    assert (run_dir / "node-loss.png").stat().st_size > 0
    assert (run_dir / "records.jsonl.gz").exists()


@pytest.mark.parametrize(
    "changed",
    [
        {"kill_at_s": 0},
        {"down_s": 300},
        {"partition_at_s": 80},
        {"partition_at_s": 400},
        {"programs": 0},
    ],
)
def test_faults_out_of_order_or_past_the_load_are_refused(changed: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _options(**changed).check()
