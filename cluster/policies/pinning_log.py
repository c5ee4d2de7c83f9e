"""A pinning controller's decision log, replayed: the same calls with the same
inputs made on another controller, whose own records then compare with the log's
line for line.

An engine writes the log (`main.pinning.decision_log_dir`): a first record of the
configuration and pool the controller was built for, then one record per decision,
each with its inputs (times, tokens, holding costs, block counts) and outcome (the
pin made or not, the pins released and why, a queue place). Replaying it through
a controller built another way shows whether that controller decides as the
engine's did for the same events; the simulator's tests do this with the
controller the simulator builds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from cluster.policies.pinning_controller import DecisionSink, PinningController, ReleaseReason
from cluster.policies.ttl_cost_model import PrefillProfile, RetentionHint

START = "start"
DECISIONS = frozenset(
    {
        "on_arrival",
        "queue_time",
        "on_admitted",
        "on_finished",
        "on_turn_ended",
        "end_program",
        "release_moved",
        "expire",
        "relieve_pressure",
        "reprice",
        "release_all",
        "set_prefill_profile",
    }
)


def replayed(
    log: Iterable[dict[str, Any]], build: Callable[[DecisionSink], PinningController]
) -> list[dict[str, Any]]:
    """The records of a controller `build` makes (given the sink to write to) when
    it is handed the calls of `log`, whose first record describes the controller
    the log came from. Equal to `log` when that controller decides as the
    logged one did."""
    records = iter(log)
    start = next(records, None)
    if start is None or start.get("event") != START:
        raise ValueError("a decision log starts with its controller's description")
    written: list[dict[str, Any]] = []
    controller = build(written.append)
    for record in records:
        event = record.get("event")
        if event not in DECISIONS:
            raise ValueError(f"not a decision of the pinning controller: {event!r}")
        getattr(controller, event)(**_call_inputs(record["inputs"]))
    return written


def _call_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    arguments = dict(inputs)
    if "blocks" in arguments:
        arguments["blocks"] = list(range(arguments["blocks"]))
    if arguments.get("hint") is not None:
        arguments["hint"] = RetentionHint(**arguments["hint"])
    if "profile" in arguments:
        arguments["profile"] = PrefillProfile(**arguments["profile"])
    if "reason" in arguments:
        arguments["reason"] = ReleaseReason(arguments["reason"])
    return arguments


def first_difference(
    expected: list[dict[str, Any]], actual: list[dict[str, Any]]
) -> tuple[int, dict[str, Any] | None, dict[str, Any] | None] | None:
    """Where two decision logs part (index, and each one's record there), or None."""
    for index in range(max(len(expected), len(actual))):
        left = expected[index] if index < len(expected) else None
        right = actual[index] if index < len(actual) else None
        if left != right:
            return index, left, right
    return None
