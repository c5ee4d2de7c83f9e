"""Pure: which predicted tool calls to run early, how to ask the draft model for
predictions, and how a turn's actual calls settle the speculations (used or
wasted). Speculation only ever starts side-effect-free hosted tools the request
declared; it changes when a result is ready, never what the client receives."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from cluster.config import SpeculationConfig
from cluster.openai_protocol import ModelToolCall, executed_messages
from toolworkers.cache_keys import canonical_arguments
from toolworkers.predictor import ObservedCall, PredictedCall, calls_in_history
from toolworkers.registry import CostClass, ToolRegistry

DRAFT_SOURCE = "draft"


def call_identity(name: str, arguments: dict[str, Any]) -> str:
    return f"{name}\x00{canonical_arguments(arguments)}"


def draft_request(
    body: dict[str, Any], draft_model: str, config: SpeculationConfig
) -> dict[str, Any] | None:
    """The draft model's request for λ predictions of the main model's next call:
    the same conversation and tools, made to call at once (no prose first), so
    the prediction is ready early. None when the request cannot call tools."""
    samples = config.draft_predictions
    tool_choice = body.get("tool_choice")
    if samples == 0 or not body.get("tools") or tool_choice == "none":
        return None
    request: dict[str, Any] = {
        "model": draft_model,
        "messages": body["messages"],
        "tools": body["tools"],
        "tool_choice": tool_choice if isinstance(tool_choice, dict) else "required",
        "n": samples,
        "temperature": config.draft_temperature if samples > 1 else 0.0,
        "max_tokens": config.draft_max_tokens,
        "stream": False,
    }
    if body.get("cache_salt") is not None:  # the turn's own cached prefix
        request["cache_salt"] = body["cache_salt"]
    return request


def _reply_message(choice: dict[str, Any]) -> dict[str, Any]:
    """A reply choice's message: the model's, whatever role it states."""
    return {**(choice.get("message") or {}), "role": "assistant"}


def draft_predictions(reply: dict[str, Any]) -> list[PredictedCall]:
    """The distinct calls of a draft reply's samples; confidence = the share of
    samples that made the call."""
    choices = reply.get("choices") or []
    seen: Counter[str] = Counter()
    calls: dict[str, ObservedCall] = {}
    for choice in choices:
        for call in calls_in_history([_reply_message(choice)]):
            identity = call_identity(call.name, call.arguments)
            seen[identity] += 1
            calls[identity] = call
    return [
        PredictedCall(call.name, call.arguments, seen[identity] / len(choices), DRAFT_SOURCE)
        for identity, call in calls.items()
    ]


class SpeculationPolicy:
    def __init__(self, config: SpeculationConfig, registry: ToolRegistry):
        self._config = config
        self._registry = registry

    def _threshold(self, cost_class: CostClass) -> float:
        if cost_class is CostClass.EXPENSIVE:
            return self._config.expensive_min_confidence
        if cost_class is CostClass.MODERATE:
            return self._config.moderate_min_confidence
        return 0.0

    def asks_draft(self, learned_chosen: list[PredictedCall]) -> bool:
        """Whether the turn is worth the draft's model time, given the learned
        predictions already started."""
        return self._config.draft_when == "always" or not learned_chosen

    def choose(
        self, predictions: list[PredictedCall], declared_hosted: set[str]
    ) -> list[PredictedCall]:
        """Predictions worth running now: of side-effect-free hosted tools the
        request declared with their hosted schema, confident enough for the
        tool's cost, each distinct call once (its most confident prediction)."""
        best: dict[str, PredictedCall] = {}
        for prediction in predictions:
            tool = self._registry.get(prediction.name)
            if tool is None or not tool.spec.side_effect_free:
                continue
            if prediction.name not in declared_hosted:
                continue
            if prediction.confidence < self._threshold(tool.spec.cost_class):
                continue
            identity = call_identity(prediction.name, prediction.arguments)
            if identity not in best or best[identity].confidence < prediction.confidence:
                best[identity] = prediction
        return sorted(best.values(), key=lambda prediction: -prediction.confidence)


@dataclass(frozen=True)
class Settlement:
    used: list[PredictedCall]
    wasted: list[PredictedCall]


def settle(issued: list[PredictedCall], actual: list[ObservedCall]) -> Settlement:
    """A speculation is used when the turn made exactly that call."""
    made = {call_identity(call.name, call.arguments) for call in actual}
    used = [p for p in issued if call_identity(p.name, p.arguments) in made]
    wasted = [p for p in issued if call_identity(p.name, p.arguments) not in made]
    return Settlement(used, wasted)


def reply_calls(reply: dict[str, Any]) -> list[ObservedCall]:
    """Every call a non-streamed reply made: those the server ran, then the reply's own."""
    executed = executed_messages(reply)
    replied = [_reply_message(choice) for choice in reply.get("choices") or []]
    return calls_in_history([*executed, *replied])


def observed_calls(calls: list[ModelToolCall]) -> list[ObservedCall]:
    """The calls as the predictor sees them (calls with unreadable arguments left out)."""
    return calls_in_history(
        [{"role": "assistant", "tool_calls": [c.as_message_part() for c in calls]}]
    )
