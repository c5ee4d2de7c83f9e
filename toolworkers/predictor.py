"""Pure: a tool-call predictor learned online from traffic.

Agents of one kind (same instructions and tools) repeat their workflow: after
`list_files` comes `read_file`, after `search` comes `open` on what was found.
Per agent kind the predictor counts which tool follows which (the first call of
a conversation follows START) and, per such transition, where each argument's
value came from: a constant the agent always passes, the same value as an
argument of the previous call, or a word of the latest user message shaped
like the values seen before (`INC-2041` has the shape `A-9`). A prediction is
made only when the next tool and every argument have been seen often enough,
with a confidence that is the product of those frequencies.
"""

from __future__ import annotations

import json
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from cluster.openai_protocol import message_tool_calls
from toolworkers.cache_keys import ArgumentsError, normalized_arguments

START = "(start)"


@dataclass(frozen=True)
class ObservedCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class PredictedCall:
    name: str
    arguments: dict[str, Any]
    confidence: float
    source: str


def calls_in_history(messages: list[Any]) -> list[ObservedCall]:
    """The tool calls of a conversation's assistant messages, in order (calls with
    unreadable arguments are skipped)."""
    calls = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for call in message_tool_calls(message):
            try:
                arguments = normalized_arguments(call.arguments)
            except ArgumentsError:
                continue
            calls.append(ObservedCall(call.name, arguments))
    return calls


_WORD = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_./:\-]*[A-Za-z0-9])?")


def shape_of(text: str) -> str:
    """Letters, digits and case folded to a pattern: `INC-2041` -> `A-9`."""
    text = re.sub(r"[0-9]+", "9", text)
    text = re.sub(r"[A-Z]+", "A", text)
    return re.sub(r"[a-z]+", "a", text)


def latest_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
            return ""
    return ""


def _value_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass
class _Transition:
    """What followed one previous tool, with where each argument came from."""

    count: int = 0
    argument_counts: Counter[str] = field(default_factory=Counter)
    sources: dict[str, Counter[tuple[str, str]]] = field(default_factory=dict)


@dataclass
class _Context:
    """Everything seen after one previous tool in one agent kind."""

    total: int = 0
    following: dict[str, _Transition] = field(default_factory=dict)


class TransitionPredictor:
    def __init__(
        self,
        min_support: int = 2,
        min_confidence: float = 0.5,
        max_agents: int = 1024,
        max_tools_per_agent: int = 256,
    ):
        self._min_support = min_support
        self._min_confidence = min_confidence
        self._max_agents = max_agents
        self._max_tools = max_tools_per_agent
        self._agents: OrderedDict[str, dict[str, _Context]] = OrderedDict()

    def observe(
        self, agent: str, previous: ObservedCall | None, call: ObservedCall, user_text: str = ""
    ) -> None:
        contexts = self._agents.get(agent)
        if contexts is None:
            contexts = self._agents[agent] = {}
            while len(self._agents) > self._max_agents:
                self._agents.popitem(last=False)
        self._agents.move_to_end(agent)
        previous_name = previous.name if previous else START
        context = contexts.get(previous_name)
        if context is None:
            if len(contexts) >= self._max_tools:
                return
            context = contexts[previous_name] = _Context()
        context.total += 1
        transition = context.following.setdefault(call.name, _Transition())
        transition.count += 1
        for name, value in call.arguments.items():
            transition.argument_counts[name] += 1
            sources = transition.sources.setdefault(name, Counter())
            for source in self._sources_of(value, previous, user_text):
                sources[source] += 1

    @staticmethod
    def _sources_of(
        value: Any, previous: ObservedCall | None, user_text: str
    ) -> list[tuple[str, str]]:
        sources = [("constant", _value_key(value))]
        if isinstance(value, str) and value in _WORD.findall(user_text):
            sources.append(("user", shape_of(value)))
        if previous is not None:
            sources += [
                ("copy", name)
                for name, earlier in previous.arguments.items()
                if _value_key(earlier) == _value_key(value)
            ]
        return sources

    def predict(
        self, agent: str, previous: ObservedCall | None, limit: int = 1, user_text: str = ""
    ) -> list[PredictedCall]:
        """The likeliest next calls with fully determined arguments, most confident first."""
        contexts = self._agents.get(agent)
        context = contexts.get(previous.name if previous else START) if contexts else None
        if context is None or context.total == 0:
            return []
        predictions = []
        for name, transition in context.following.items():
            if transition.count < self._min_support:
                continue
            confidence = transition.count / context.total
            arguments: dict[str, Any] = {}
            for argument, seen in transition.argument_counts.items():
                if seen * 2 < transition.count:
                    continue  # an optional argument the agent mostly leaves out
                found, value, support = self._best_source(
                    transition.sources[argument], previous, user_text
                )
                if not found:
                    confidence = 0.0
                    break
                arguments[argument] = value
                confidence *= support / transition.count
            if confidence >= self._min_confidence:
                predictions.append(PredictedCall(name, arguments, confidence, "learned"))
        predictions.sort(key=lambda prediction: -prediction.confidence)
        return predictions[:limit]

    @staticmethod
    def _best_source(
        sources: Counter[tuple[str, str]], previous: ObservedCall | None, user_text: str
    ) -> tuple[bool, Any, int]:
        """The value the most frequent usable source gives (on a tie, a copy or a
        user word over a constant: they generalize), and that source's count;
        (False, None, 0) when no source is usable."""
        ranked = sorted(sources.items(), key=lambda item: (-item[1], item[0][0] == "constant"))
        for (kind, detail), count in ranked:
            if kind == "constant":
                return True, json.loads(detail), count
            if kind == "copy" and previous is not None and detail in previous.arguments:
                return True, previous.arguments[detail], count
            if kind == "user":
                words = [word for word in _WORD.findall(user_text) if shape_of(word) == detail]
                if words:
                    return True, words[0], count
        return False, None, 0
