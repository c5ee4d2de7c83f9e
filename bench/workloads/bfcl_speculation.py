"""BFCL-derived speculation tasks: BFCL v4 multi-turn entries (the setting of the
speculative tool calls papers) on BFCL's own stateful backends, hosted by the
server under test.

A program replays one entry's user turns. A turn's first request holds the model
to the shape "one plan sentence, then a call of one of the entry's functions" (a
structured output, since the 135M model makes no call of its own accord: 0 of 84
requests in `bench/results/bfcl-quick`); the model chooses the function and
writes the values of its required arguments. A turn's token budget covers the
call and the answer, however many requests the server takes for them. A server
that hosts the backends runs the call on the program's state (its
`initial_config`, set through the tool-state API before the first turn) and
continues, so the model answers the user in the same request; a server that does
not hands the call back, and the program runs it on its own copy of the
backends, waiting the same latency, then asks for the answer. Speculation may
run the entry's functions that only read the backend
(`toolworkers.bfcl_tools.READER_FUNCTIONS`) before the model writes the call; a
result is used only when the model makes that call on the same state.

Not reproduced: the papers' capable models (here the 135M model's calls are
often wrong, which is measured, not hidden: a wrong call is still run and its
error answered), per-call latencies (every call takes BFCL v4's mean tool time
from Continuum, arXiv 2511.02230, Table 1), BFCL's scoring.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.workloads.bfcl import SYSTEM_PROMPT, SafeDispatcher, load_entries, tool_schemas
from bench.workloads.plan import Size, WorkloadPlan
from bench.workloads.program import (
    AgentProgram,
    Reply,
    ToolCall,
    ToolOutcome,
    ToolRound,
    TurnRequest,
    checked_call,
)
from toolworkers.bfcl_tools import BACKEND_CLASSES

_STRING = r'"[A-Za-z0-9 ._/\-]{0,40}"'
_VALUES = {
    "integer": r"-?[0-9]{1,6}",
    "number": r"-?[0-9]{1,6}(\.[0-9]{1,3})?",
    "boolean": "(true|false)",
    "object": r"\{\}",
}


def _value_regex(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "(" + "|".join(re.escape(json.dumps(value)) for value in schema["enum"]) + ")"
    if schema.get("type") == "array":
        item = _value_regex(schema.get("items") or {})
        return r"\[(" + item + "(, " + item + r"){0,3})?\]"
    return _VALUES.get(str(schema.get("type")), _STRING)


def _call_regex(function: dict[str, Any]) -> str:
    """A call of `function` with its required arguments, in order, each a value of
    its declared type (the model writes the values)."""
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    arguments = ", ".join(
        re.escape(json.dumps(name)) + ": " + _value_regex(properties.get(name) or {})
        for name in parameters.get("required") or []
    )
    return re.escape(f'{{"name": "{function["name"]}", "arguments": {{') + arguments + r"\}\}"


def plan_and_call_regex(tools: list[dict[str, Any]]) -> str:
    """One plan sentence, then a call of one of `tools` in the chat template's
    `<tool_call>` format: the function and its argument values are the model's
    choice, the argument names and types the function's own."""
    calls = "|".join(_call_regex(tool["function"]) for tool in tools)
    return r"[A-Z][A-Za-z0-9 ,'\-]{15,100}\.\n<tool_call>\n(" + calls + r")\n</tool_call>"


class BfclSpeculationConfig(BaseModel):
    """Shape of the BFCL-derived speculation workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    category: str = Field(default="base", description="BFCL multi-turn category.")
    entries: int = Field(gt=0, description="Dataset entries to replay, drawn by the seed.")
    user_turns: int = Field(
        default=3, gt=0, description="User turns replayed per entry (its first ones)."
    )
    arrival_gap_s: float = Field(gt=0, description="Seconds between program arrivals.")
    tool_latency_s: float = Field(
        default=1.923,
        ge=0,
        description="Seconds every call takes: BFCL v4's mean tool time (Continuum, "
        "arXiv 2511.02230, Table 1).",
    )
    max_tokens: int = Field(
        default=160,
        gt=0,
        description="Token budget of a user turn: the plan and call, then the answer "
        "(a server that continues spends the same budget over its rounds).",
    )


def hosted_bfcl_tools(latency_s: float) -> list[dict[str, Any]]:
    """`tools.hosted` entries: every BFCL backend, each call taking `latency_s`."""
    return [
        {"function": f"toolworkers.bfcl_tools:{name}", "options": {"latency_s": latency_s}}
        for name in BACKEND_CLASSES
    ]


@dataclass
class BfclSpeculationProgram(AgentProgram):
    user_turns: list[list[dict[str, Any]]] = field(default_factory=list)
    initial_config: dict[str, Any] = field(default_factory=dict)
    dispatcher: SafeDispatcher | None = None
    call_regex: str = ""
    max_tokens: int = 160
    tool_latency_s: float = 0.0
    user_turns_started: int = 0
    spent_in_turn: int = 0

    def tool_state(self) -> dict[str, Any]:
        return self.initial_config

    def next_request(self) -> TurnRequest | None:
        answering = self.messages[-1]["role"] == "tool"  # the program ran the call
        if not answering:
            if self.user_turns_started == len(self.user_turns):
                return None
            self.messages.extend(self.user_turns[self.user_turns_started])
            self.user_turns_started += 1
        self.turns_sent += 1
        if answering:
            return TurnRequest(
                tool_choice="none", max_tokens=max(8, self.max_tokens - self.spent_in_turn)
            )
        return TurnRequest(
            tool_choice="auto",
            max_tokens=self.max_tokens,
            structured_outputs={"regex": self.call_regex},
        )

    async def act(
        self, request: TurnRequest, reply: Reply, ready: dict[str, ToolOutcome] | None = None
    ) -> ToolRound:
        self.spent_in_turn = reply.completion_tokens if request.structured_outputs else 0
        return await super().act(request, reply, ready)

    def execute(self, call: ToolCall) -> ToolOutcome:
        dispatcher = self.dispatcher
        assert dispatcher is not None
        return checked_call(call, self.tools, lambda arguments: dispatcher(call.name, arguments))

    def simulated_latency_s(self, turn_index: int) -> float:
        return self.tool_latency_s


def generate_bfcl_speculation(
    config: BfclSpeculationConfig, seed: int
) -> list[BfclSpeculationProgram]:
    entries = [
        entry
        for entry in load_entries(config.category)
        if set(entry["involved_classes"]) <= set(BACKEND_CLASSES)
    ]
    rng = random.Random(seed)
    programs = []
    for index, entry in enumerate(rng.sample(entries, min(config.entries, len(entries)))):
        classes, excluded = entry["involved_classes"], entry.get("excluded_function", [])
        tools = tool_schemas(classes, excluded)
        programs.append(
            BfclSpeculationProgram(
                program_id=f"bfcl-spec-{seed}-{entry['id']}",
                agent_type="bfcl-" + "+".join(sorted(classes)),
                arrival_s=index * config.arrival_gap_s,
                tools=tools,
                messages=[{"role": "system", "content": SYSTEM_PROMPT}],
                user_turns=[list(turn) for turn in entry["question"][: config.user_turns]],
                initial_config={
                    name: entry["initial_config"][name]
                    for name in classes
                    if name in entry["initial_config"]
                },
                dispatcher=SafeDispatcher(classes, entry["initial_config"], excluded),
                call_regex=plan_and_call_regex(tools),
                max_tokens=config.max_tokens,
                tool_latency_s=config.tool_latency_s,
            )
        )
    return programs


def bfcl_speculation_plan(size: Size) -> WorkloadPlan:
    config = (
        BfclSpeculationConfig(entries=3, user_turns=2, arrival_gap_s=8.0)
        if size == "quick"
        else BfclSpeculationConfig(entries=12, arrival_gap_s=15.0)
    )
    return WorkloadPlan(
        name="bfcl-speculation",
        size=size,
        description=(
            f"{config.entries} BFCL v4 multi-turn ({config.category}) entries, the first "
            f"{config.user_turns} user turns each, one program every {config.arrival_gap_s:g}s; "
            "each turn a plan sentence, a call of the entry's functions the model writes, "
            f"run on BFCL's backends ({config.tool_latency_s:g}s each, hosted by toolserve), "
            "and the answer. Not reproduced: the papers' capable models, per-call latencies, "
            "BFCL's scoring"
        ),
        build=lambda seed: generate_bfcl_speculation(config, seed),
        kv_cache_mib=768,
        max_model_len=8192,
        toolserve_overrides={"tools.hosted": hosted_bfcl_tools(config.tool_latency_s)},
        reference_system="toolserve-no-speculation",
    )
