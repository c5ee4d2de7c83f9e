"""An engine's pinning decision log replayed through the controller the simulator
builds: whether the simulator's policies decide as the engine's did for the same
events (`cluster/policies/pinning_log.py`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from bench.sim.systems import SimSystem
from cluster.config import PinningConfig
from cluster.policies.pinning_controller import DecisionSink, PinningController
from cluster.policies.pinning_log import replayed


def read_decision_log(path: Path) -> list[dict[str, Any]]:
    """One engine's log (`<replica>.jsonl`, or gzipped)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def simulated_decisions(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records the simulator's controller writes for the logged events, as
    the engine's log holds them (through JSON)."""
    start = log[0]
    if start.get("offload_reload") is not None:
        raise ValueError("the logged engine had a CPU tier under its KV, which is not simulated")
    system = SimSystem(name="logged", pinning=PinningConfig.model_validate(start["config"]))

    def build(sink: DecisionSink) -> PinningController:
        glue = system.pinning_glue(start["total_blocks"], sink)
        if glue is None:
            raise ValueError("the logged engine did not pin")
        return glue.controller

    records = [json.loads(json.dumps(record)) for record in replayed(log, build)]
    if records and records[0].get("event") == "start":
        # A log written before a setting existed lacks it; the simulator ran with
        # its default, which is what the engine ran with too.
        records[0]["config"] = {
            name: value for name, value in records[0]["config"].items() if name in start["config"]
        }
    return records
