"""BFCL multi-turn (from the `bfcl-eval` package): the dataset's user turns are
replayed, and every call the model makes is executed by BFCL's own stateful
Python backends (file system, messaging, trading, travel, vehicle, ...).

BFCL's own dispatcher builds a Python expression from the model's call and
`eval`s it; here a call is executed only if it names a documented function of
one of the entry's classes, with the model's JSON arguments as keyword
arguments (`toolworkers.bfcl_tools`, which also hosts the backends as tools)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.workloads.distributions import Distribution, poisson_arrivals
from bench.workloads.plan import Size, WorkloadPlan
from bench.workloads.program import (
    AGENT_TEMPERATURE,
    AgentProgram,
    Temperature,
    ToolCall,
    ToolOutcome,
    TurnRequest,
    checked_call,
)
from toolworkers.bfcl_tools import (
    data_file,
    function_docs,
    new_backend,
    run_backend_function,
    tool_set,
)
from toolworkers.builtin_tools import ToolError
from toolworkers.registry import declared_spec

SYSTEM_PROMPT = (
    "You are an assistant that completes the user's requests by calling the provided "
    "functions. Call functions when they are needed; when the request is done, reply "
    "to the user in one short sentence."
)


class BfclConfig(BaseModel):
    """Shape of a BFCL multi-turn workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    category: str = Field(default="base", description="BFCL multi-turn category (`base`, ...).")
    entries: int = Field(gt=0, description="Dataset entries to replay, drawn by the seed.")
    arrival_rate_per_s: float = Field(ge=0, description="Poisson rate of entry starts.")
    steps_per_turn: int = Field(
        default=4, gt=0, description="Model requests allowed per user turn (bounds loops)."
    )
    tool_latency_s: Distribution = Field(
        default=Distribution(kind="lognormal", mean=1.923, sd=2.133),
        description="Seconds a tool round takes beyond the backend's own run time "
        "(the backends are in-memory; real APIs are not). Default: Continuum's BFCL v4 "
        "statistics (arXiv 2511.02230, Table 1).",
    )
    max_tokens: int = Field(default=96, gt=0, description="Token cap of each model request.")
    temperature: Temperature = AGENT_TEMPERATURE


@cache
def load_entries(category: str) -> tuple[dict[str, Any], ...]:
    text = data_file(f"BFCL_v4_multi_turn_{category}.json")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def tool_schemas(classes: list[str], excluded: list[str]) -> list[dict[str, Any]]:
    """The entry's functions as OpenAI tools, the same schemas the hosted BFCL tools declare."""
    return [
        declared_spec(getattr(tool_set(class_name), doc["name"]), doc["name"]).openai_schema()
        for class_name in classes
        for doc in function_docs(class_name)
        if doc["name"] not in excluded
    ]


class SafeDispatcher:
    """Runs calls on BFCL's backend objects: documented functions only, keyword
    arguments only, no `eval`."""

    def __init__(self, classes: list[str], initial_config: dict[str, Any], excluded: list[str]):
        self._backends: dict[str, Any] = {}
        for class_name in classes:
            backend = new_backend(class_name, initial_config.get(class_name))
            for doc in function_docs(class_name):
                if doc["name"] not in excluded:
                    self._backends[doc["name"]] = backend

    def __call__(self, name: str, arguments: dict[str, Any]) -> str:
        try:
            return run_backend_function(self._backends[name], name, arguments)
        except ToolError as error:
            raise TypeError(str(error)) from error


@dataclass
class BfclProgram(AgentProgram):
    user_turns: list[list[dict[str, Any]]] = field(default_factory=list)
    dispatcher: SafeDispatcher | None = None
    steps_per_turn: int = 4
    max_tokens: int = 96
    latencies_s: list[float] = field(default_factory=list)
    user_turns_started: int = 0
    steps_in_turn: int = 0
    step_limit_hits: int = 0

    def next_request(self) -> TurnRequest | None:
        model_called_tools = bool(self.messages) and self.messages[-1]["role"] == "tool"
        if model_called_tools and self.steps_in_turn >= self.steps_per_turn:
            self.step_limit_hits += 1
        if not model_called_tools or self.steps_in_turn >= self.steps_per_turn:
            if self.user_turns_started >= len(self.user_turns):
                return None
            self.messages.extend(self.user_turns[self.user_turns_started])
            self.user_turns_started += 1
            self.steps_in_turn = 0
        self.steps_in_turn += 1
        self.turns_sent += 1
        return TurnRequest(tool_choice="auto", max_tokens=self.max_tokens)

    def execute(self, call: ToolCall) -> ToolOutcome:
        dispatcher = self.dispatcher
        assert dispatcher is not None
        return checked_call(call, self.tools, lambda arguments: dispatcher(call.name, arguments))

    def simulated_latency_s(self, turn_index: int) -> float:
        return self.latencies_s[turn_index % len(self.latencies_s)]


def generate_bfcl(config: BfclConfig, seed: int) -> list[BfclProgram]:
    entries = list(load_entries(config.category))
    rng = random.Random(seed)
    chosen = rng.sample(entries, min(config.entries, len(entries)))
    arrivals = poisson_arrivals(len(chosen), config.arrival_rate_per_s, rng)
    programs = []
    for entry, arrival in zip(chosen, arrivals, strict=True):
        classes, excluded = entry["involved_classes"], entry.get("excluded_function", [])
        most_requests = len(entry["question"]) * config.steps_per_turn
        programs.append(
            BfclProgram(
                program_id=f"bfcl-{seed}-{entry['id']}",
                agent_type=f"bfcl-{config.category}",
                arrival_s=arrival,
                tools=tool_schemas(classes, excluded),
                messages=[{"role": "system", "content": SYSTEM_PROMPT}],
                user_turns=[list(turn) for turn in entry["question"]],
                dispatcher=SafeDispatcher(classes, entry["initial_config"], excluded),
                steps_per_turn=config.steps_per_turn,
                max_tokens=config.max_tokens,
                latencies_s=[config.tool_latency_s.sample(rng) for _ in range(most_requests)],
                temperature=config.temperature,
            )
        )
    return programs


def bfcl_plan(size: Size) -> WorkloadPlan:
    config = BfclConfig(
        entries=3 if size == "quick" else 20,
        arrival_rate_per_s=0.5 if size == "quick" else 0.1,
    )
    return WorkloadPlan(
        name="bfcl",
        size=size,
        description=(
            f"{config.entries} BFCL v4 multi-turn ({config.category}) entries, real BFCL "
            f"backends, at most {config.steps_per_turn} model requests per user turn. Not "
            "reproduced: BFCL's scoring (answers are not graded); the in-memory backends "
            "answer at once, so each tool round adds a latency drawn from Continuum's "
            "BFCL v4 statistics"
        ),
        build=lambda seed: generate_bfcl(config, seed),
        kv_cache_mib=256,
        max_model_len=4096,
        # Every system's calls run on the client, with the same simulated latency;
        # toolserve's hosted BFCL tools (same schemas) would run them server-side.
        toolserve_overrides={"tools.hosted": []},
    )
