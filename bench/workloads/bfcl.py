"""BFCL multi-turn (from the `bfcl-eval` package): the dataset's user turns are
replayed, and every call the model makes is executed by BFCL's own stateful
Python backends (file system, messaging, trading, travel, vehicle, ...).

BFCL's own dispatcher builds a Python expression from the model's call and
`eval`s it; here a call is executed only if it names a documented function of
one of the entry's classes, with the model's JSON arguments as keyword
arguments."""

from __future__ import annotations

import copy
import importlib
import json
import random
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.workloads.distributions import Distribution, poisson_arrivals
from bench.workloads.program import (
    AgentProgram,
    ToolCall,
    ToolOutcome,
    TurnRequest,
    checked_call,
    function_tool,
)

_MAX_RESULT_CHARS = 2000
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
        default=Distribution(kind="lognormal", mean=1.923, sd=2.133, high=30),
        description="Seconds a tool round takes beyond the backend's own run time "
        "(the backends are in-memory; real APIs are not). Default: BFCL v4 statistics.",
    )
    max_tokens: int = Field(default=96, gt=0, description="Token cap of each model request.")


def _backend_config() -> tuple[dict[str, str], dict[str, str]]:
    from bfcl_eval.constants import executable_backend_config as backends

    return backends.CLASS_FILE_PATH_MAPPING, backends.MULTI_TURN_FUNC_DOC_FILE_MAPPING


def _gorilla_to_json_schema_types() -> dict[str, str]:
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    return dict(GORILLA_TO_OPENAPI)


def _data_file(relative: str) -> str:
    return resources.files("bfcl_eval").joinpath("data", relative).read_text()


@cache
def load_entries(category: str) -> tuple[dict[str, Any], ...]:
    text = _data_file(f"BFCL_v4_multi_turn_{category}.json")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def to_json_schema(node: dict[str, Any], type_map: dict[str, str]) -> dict[str, Any]:
    """A BFCL parameter description (Gorilla types) as JSON Schema."""
    schema: dict[str, Any] = {}
    if "type" in node:
        schema["type"] = type_map.get(node["type"], "string")
    for key in ("description", "enum", "required", "default"):
        if key in node:
            schema[key] = node[key]
    if "items" in node:
        schema["items"] = to_json_schema(node["items"], type_map)
    if "properties" in node:
        schema["properties"] = {
            name: to_json_schema(child, type_map) for name, child in node["properties"].items()
        }
    return schema


def _short_description(text: str) -> str:
    # BFCL prefixes every function with its class's paragraph; the part after
    # "Tool description:" is what distinguishes the function.
    return text.split("Tool description:", 1)[-1].strip()


@cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    _, doc_files = _backend_config()
    text = _data_file(f"multi_turn_func_doc/{doc_files[class_name]}")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def tool_schemas(classes: list[str], excluded: list[str]) -> list[dict[str, Any]]:
    type_map = _gorilla_to_json_schema_types()
    tools = []
    for class_name in classes:
        for doc in function_docs(class_name):
            if doc["name"] in excluded:
                continue
            tools.append(
                function_tool(
                    doc["name"],
                    _short_description(doc["description"]),
                    to_json_schema(doc["parameters"], type_map),
                )
            )
    return tools


class SafeDispatcher:
    """Runs calls on BFCL's backend objects: documented functions only, keyword
    arguments only, no `eval`."""

    def __init__(self, classes: list[str], initial_config: dict[str, Any], excluded: list[str]):
        modules, _ = _backend_config()
        self._functions: dict[str, Any] = {}
        for class_name in classes:
            instance = getattr(importlib.import_module(modules[class_name]), class_name)()
            if hasattr(instance, "_load_scenario"):
                instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})))
            for doc in function_docs(class_name):
                if doc["name"] not in excluded:
                    self._functions[doc["name"]] = getattr(instance, doc["name"])

    def __call__(self, name: str, arguments: dict[str, Any]) -> str:
        function = self._functions[name]
        try:
            result = function(**arguments)
        except TypeError:
            raise
        except Exception as error:
            result = {"error": f"{type(error).__name__}: {error}"}
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        return text[:_MAX_RESULT_CHARS]


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
            )
        )
    return programs
