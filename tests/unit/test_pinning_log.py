import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.sim.decisions import read_decision_log, simulated_decisions
from cluster.config import PinningConfig
from cluster.policies.pinning_controller import PinningController, pinning_controller
from cluster.policies.pinning_log import first_difference, replayed
from cluster.policies.ttl_cost_model import PrefillProfile, RetentionHint

CONFIG = PinningConfig(mode="cost_model", min_tool_samples=2, max_pinned_fraction=0.5)
TOOLS = ["read_file", "run_tests", None]


def drive(controller: PinningController, seed: int, steps: int = 400) -> None:
    """Programs arriving, finishing turns, calling tools and coming back, with
    pressure, expiry, repricing and moves between them, as an engine calls."""
    rng = random.Random(seed)
    now = 1000.0
    away: dict[str, int] = {}  # program: context blocks
    controller.set_prefill_profile(PrefillProfile(1e-7, 2e-3, 0.05))
    for step in range(steps):
        now += rng.uniform(0.0, 1.5)
        controller.expire(now)
        choice = rng.random()
        if choice < 0.35 or not away:
            program = rng.choice([*away, f"p{step}"]) if away else f"p{step}"
            controller.on_arrival(program, now)
            controller.queue_time(program, now)
            controller.on_admitted(program, now + 0.1, rng.randrange(0, 2000))
            context = away.pop(program, 0) + rng.randrange(1, 6)
            hint = RetentionHint(retain_for_s=3.0) if rng.random() < 0.1 else None
            controller.on_finished(
                program, list(range(context)), context * 64, now + 0.5, rng.random() < 0.05, hint
            )
            controller.on_turn_ended(program, rng.choice(TOOLS), now + 0.6, rng.random())
            away[program] = context
        elif choice < 0.45:
            controller.relieve_pressure(queued_after=now - rng.uniform(0, 30), now=now)
        elif choice < 0.55:
            controller.reprice(now, {pin.program_id: rng.random() for pin in controller.pins})
        elif choice < 0.6:
            controller.release_moved(rng.choice(list(away)), now)
        elif choice < 0.7:
            program = rng.choice(list(away))
            controller.end_program(program, now)
            del away[program]
    controller.release_all(now=now)


def as_written(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records as an engine's log file holds them (through JSON)."""
    return [json.loads(json.dumps(record)) for record in records]


def logged_run(config: PinningConfig = CONFIG, seed: int = 7) -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = []
    drive(pinning_controller(config, 40, decision_sink=log.append), seed)
    return as_written(log)


def test_the_log_holds_every_kind_of_decision_with_its_reason() -> None:
    log = logged_run()
    assert log[0]["event"] == "start" and log[0]["total_blocks"] == 40
    events = {record["event"] for record in log}
    assert {"on_finished", "on_turn_ended", "reprice", "expire", "set_prefill_profile"} <= events
    reasons = {reason for record in log[1:] for _, reason in record["released"]}
    assert {"next_turn", "expiry", "pressure", "program_end", "moved"} <= reasons
    assert any(record["event"] == "on_finished" and record["result"] for record in log)


def test_checks_that_decide_nothing_are_left_out() -> None:
    log: list[dict[str, Any]] = []
    controller = pinning_controller(CONFIG, 40, decision_sink=log.append)
    controller.expire(1.0)
    controller.relieve_pressure(now=1.0)
    controller.on_arrival("a", 2.0)
    controller.on_finished("a", [1, 2], 128, 3.0, False)
    assert [record["event"] for record in log] == ["start", "on_arrival", "on_finished"]
    assert log[-1]["inputs"]["blocks"] == 2  # the calls nested in it are part of it


@pytest.mark.parametrize("seed", [1, 7, 23])
def test_a_controller_of_the_same_configuration_replays_the_log_exactly(seed: int) -> None:
    log = logged_run(seed=seed)
    replay = replayed(log, lambda sink: pinning_controller(CONFIG, 40, decision_sink=sink))
    assert first_difference(log, as_written(replay)) is None


def test_the_simulators_controller_decides_as_the_logged_one() -> None:
    log = logged_run()
    assert first_difference(log, simulated_decisions(log)) is None


def test_another_configuration_parts_from_the_log_where_it_decides_otherwise() -> None:
    log = logged_run()
    fixed = CONFIG.model_copy(update={"mode": "fixed", "fixed_ttl_s": 0.5})
    replay = replayed(log, lambda sink: pinning_controller(fixed, 40, decision_sink=sink))
    difference = first_difference(log, as_written(replay))
    assert difference is not None
    assert difference[0] == 0  # its description already differs
    later = first_difference(log[1:], as_written(replay[1:]))
    assert later is not None and later[1] != later[2]


def test_a_log_without_its_start_or_with_an_unknown_call_is_refused() -> None:
    log = logged_run()
    build = lambda sink: pinning_controller(CONFIG, 40, decision_sink=sink)  # noqa: E731
    with pytest.raises(ValueError, match="starts with"):
        replayed(log[1:], build)
    with pytest.raises(ValueError, match="not a decision"):
        replayed([log[0], {"event": "take_stats", "inputs": {}}], build)


RECORDED_LOG = Path(__file__).parent / "data" / "pinning-decisions-trace-replay.jsonl.gz"


def test_the_simulators_controller_decides_as_a_recorded_engine_did() -> None:
    """The log of toolserve's engine in `toolserve bench --workload trace-replay
    --quick --programs 16 --repeats 1 --systems
    toolserve@main.pinning.decision_log_dir=DIR` (SmolLM2 on the CPU, the cost
    model and program FCFS as shipped, 87 turns under KV pressure), replayed
    through the controller the simulator builds."""
    log = read_decision_log(RECORDED_LOG)
    assert log[0]["config"]["mode"] == "cost_model" and log[0]["config"]["program_fcfs"]
    reasons = Counter(reason for record in log[1:] for _, reason in record["released"])
    assert reasons["pressure"] >= 20 and reasons["next_turn"] >= 20 and reasons["expiry"] >= 5
    events = Counter(record["event"] for record in log)
    assert events["reprice"] >= 20 and events["on_turn_ended"] >= 80
    assert first_difference(log, simulated_decisions(log)) is None
