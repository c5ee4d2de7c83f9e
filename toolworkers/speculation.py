"""Pure: which predicted tool calls to run early, how to ask the draft model for
predictions, and how a turn's actual calls settle the speculations (used or
wasted). Speculation only ever starts side-effect-free hosted tools the request
declared; it changes when a result is ready, never what the client receives."""

from __future__ import annotations

import statistics
from collections import Counter, deque
from dataclasses import dataclass
from enum import StrEnum
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


class DraftWorth:
    """Whether a turn's draft request could pay: a guessed run saves at most the
    tool's own run time, and the draft's answer takes its own (on shared cores,
    from the turn it predicts). Both from the median of their last `remembered`
    durations, robust to a fresh tool worker's slow first run; while turns skip
    the draft, its figure stays as last measured."""

    def __init__(self, min_run_ratio: float, remembered: int = 8):
        self._min_run_ratio = min_run_ratio
        self._remembered = remembered
        self._runs: dict[str, deque[float]] = {}
        self._answers: deque[float] = deque(maxlen=remembered)

    def tool_ran(self, tool: str, duration_s: float) -> None:
        self._runs.setdefault(tool, deque(maxlen=self._remembered)).append(duration_s)

    def draft_answered(self, duration_s: float) -> None:
        self._answers.append(duration_s)

    def typical_run(self, tool: str) -> float | None:
        """The tool's typical run, seconds; None before its first."""
        runs = self._runs.get(tool)
        return statistics.median(runs) if runs else None

    def typical_answer(self) -> float | None:
        """The draft's typical answer time, seconds; None before its first."""
        return statistics.median(self._answers) if self._answers else None

    def worth_drafting(self, tool: str) -> bool:
        """A tool not run yet, or a draft not answered yet, may be worth it."""
        run, answer = self.typical_run(tool), self.typical_answer()
        return run is None or answer is None or run >= self._min_run_ratio * answer


class DraftSkip(StrEnum):
    """Why a turn's draft request was not made."""

    LEARNED_PREDICTION = "learned_prediction"
    SHORT_TOOLS = "short_tools"


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

    def describe(self, name: str, worth: DraftWorth) -> dict[str, Any] | None:
        """A hosted tool's speculation policy, as `GET /v1/tools` shows it (None
        for a tool the deployment does not host)."""
        tool = self._registry.get(name)
        if tool is None:
            return None
        spec = tool.spec
        on_guess = self._config.enabled and spec.side_effect_free
        if not spec.side_effect_free:
            why = "it has side effects: it runs only once the model has written its call"
        elif not self._config.enabled:
            why = "speculation is off in this deployment"
        elif spec.reads_state_only:
            why = (
                "it only reads its program's state: a guessed run is used only while "
                "that state is unchanged"
            )
        else:
            why = "it is declared side-effect-free (read-only, idempotent)"
        sources = [
            source
            for source, used in (
                ("learned", self._config.learned),
                (DRAFT_SOURCE, self._config.draft_predictions > 0),
            )
            if used
        ]
        return {
            "runs_on_a_guess": on_guess,
            "why": why,
            "cost_class": str(spec.cost_class),
            "min_confidence": self._threshold(spec.cost_class) if on_guess else None,
            "predicted_from": sources if on_guess else [],
            "predictions_learned_per": "tenant",
            "typical_run_s": worth.typical_run(name),
            "typical_draft_answer_s": worth.typical_answer(),
        }

    def draft_skip(
        self, learned_chosen: list[PredictedCall], declared_hosted: set[str], worth: DraftWorth
    ) -> DraftSkip | None:
        """Why the turn is not worth the draft's model time (None: it is), given the
        learned predictions already started and, for the tools the draft could
        start early, whether a guess could save more than the draft takes."""
        if self._config.draft_when == "no_learned_prediction" and learned_chosen:
            return DraftSkip.LEARNED_PREDICTION
        for name in declared_hosted:
            tool = self._registry.get(name)
            if tool is not None and tool.spec.side_effect_free and worth.worth_drafting(name):
                return None
        return DraftSkip.SHORT_TOOLS

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


TURNS = "turns"
DRAFT_TOKENS = "draft_tokens"
LEDGER_OUTCOMES = ("issued", "used", "discarded")


@dataclass(frozen=True)
class LedgerEntry:
    """What one turn's speculation adds to its tenant's ledger, as counter
    increments by field: `turns`, `{tool}|issued`, `{tool}|used`,
    `{tool}|discarded`, `{tool}|cpu_ms_used`, `{tool}|cpu_ms_discarded`,
    `draft_tokens|used`, `draft_tokens|discarded`."""

    increments: dict[str, int]


def turn_entry(settlement: Settlement, draft_tokens: int) -> LedgerEntry:
    """A settled turn: one turn, each speculation by its tool used or discarded,
    and the draft model's tokens for it, used when one of the draft's
    predictions was (else they bought nothing)."""
    increments: Counter[str] = Counter({TURNS: 1})
    for outcome, predictions in (("used", settlement.used), ("discarded", settlement.wasted)):
        for prediction in predictions:
            increments[f"{prediction.name}|issued"] += 1
            increments[f"{prediction.name}|{outcome}"] += 1
    if draft_tokens:
        increments[f"{DRAFT_TOKENS}|{draft_outcome(settlement)}"] += draft_tokens
    return LedgerEntry(dict(increments))


def draft_outcome(settlement: Settlement) -> str:
    """What the draft model's tokens for a turn bought: `used` when one of its
    guesses was, else `discarded`."""
    return "used" if any(p.source == DRAFT_SOURCE for p in settlement.used) else "discarded"


def run_cost_entry(tool: str, used: bool, cpu_s: float) -> LedgerEntry:
    """The CPU one speculative run of `tool` took, once it ended."""
    return LedgerEntry({f"{tool}|cpu_ms_{'used' if used else 'discarded'}": round(cpu_s * 1000)})


def _per_100(count: float, turns: int) -> float | None:
    return round(100 * count / turns, 3) if turns else None


def ledger_view(fields: dict[str, int], tools: list[str]) -> dict[str, Any]:
    """A tenant's ledger as `GET /v1/tools` shows it: per tool its speculative
    runs used and discarded and the tool CPU each cost; overall the turns
    speculated on, the draft's tokens, and the waste per 100 turns (discarded
    runs, their tool CPU seconds and the draft tokens that bought nothing)."""
    turns = fields.get(TURNS, 0)
    by_tool = {
        tool: {
            **{outcome: fields.get(f"{tool}|{outcome}", 0) for outcome in LEDGER_OUTCOMES},
            "tool_cpu_s_used": fields.get(f"{tool}|cpu_ms_used", 0) / 1000,
            "tool_cpu_s_discarded": fields.get(f"{tool}|cpu_ms_discarded", 0) / 1000,
        }
        for tool in tools
    }
    discarded = sum(row["discarded"] for row in by_tool.values())
    discarded_cpu_s = sum(row["tool_cpu_s_discarded"] for row in by_tool.values())
    draft_discarded = fields.get(f"{DRAFT_TOKENS}|discarded", 0)
    return {
        "turns": turns,
        "draft_tokens_used": fields.get(f"{DRAFT_TOKENS}|used", 0),
        "draft_tokens_discarded": draft_discarded,
        "waste_per_100_turns": {
            "discarded_runs": _per_100(discarded, turns),
            "tool_cpu_s": _per_100(discarded_cpu_s, turns),
            "draft_tokens": _per_100(draft_discarded, turns),
        },
        "tools": by_tool,
    }
