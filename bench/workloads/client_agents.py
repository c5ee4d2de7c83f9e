"""Agents written with the client libraries users write agents with: the raw
`openai` SDK, `openai-agents` and `langchain-openai`, each streamed and not, each
with tools of its own (the client runs them) and with a tool the server hosts
(`calculator`, declared with its hosted schema: a server that hosts it runs it
and continues the turn; any other hands the call back and the client runs the
same function). The harness builds no request: each library sends the
conversation back as its users' code does (`bench/client_agents.py`), which is
what decides whether the prompt a server gets starts with what it holds.

Every agent is a support assistant with one long instructions text (store
policies and a catalogue, as production agents carry) and asks several
questions in turn; each question's first request must call a tool, the rest
leave it to the model. What is measured is the prompt: how much of each
returning request's previous prompt and reply the server had in its cache."""

from __future__ import annotations

import copy
import functools
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bench.workloads.plan import Size, WorkloadPlan
from cluster.config import HostedToolConfig, ToolsConfig
from toolworkers.builtin_tools import ToolError, calculate, string_parameter
from toolworkers.registry import ToolRegistry

ClientLibrary = Literal["openai", "openai-agents", "langchain-openai"]
ToolPlacement = Literal["client", "hosted"]
CLIENT_LIBRARIES: tuple[ClientLibrary, ...] = ("openai", "openai-agents", "langchain-openai")
TOOL_PLACEMENTS: tuple[ToolPlacement, ...] = ("client", "hosted")
HOSTED_TOOL = "calculator"
HOSTED_TOOL_FUNCTION = "toolworkers.hosted_tools:calculator"


@functools.cache
def _hosted_tool_schema() -> dict[str, Any]:
    registry = ToolRegistry.from_config(
        ToolsConfig(hosted=[HostedToolConfig(function=HOSTED_TOOL_FUNCTION)])
    )
    (schema,) = registry.openai_schemas()
    return schema


def hosted_tool_schema() -> dict[str, Any]:
    """The calculator as `GET /v1/tools` lists it on a server that hosts it (a
    copy: the libraries may change what they are given)."""
    return copy.deepcopy(_hosted_tool_schema())


CLIENT_TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look up an order of the store by its number.",
            "parameters": string_parameter("order_id", "The order number, e.g. 'A-1042'"),
        },
    },
    {
        "type": "function",
        "function": {
            "name": "check_stock",
            "description": "How many of a catalogue item each warehouse holds.",
            "parameters": string_parameter("item", "The item's name in the catalogue"),
        },
    },
]

_ITEMS = (
    "desk lamp", "office chair", "standing desk", "monitor arm", "keyboard", "mouse pad",
    "webcam", "headset", "cable tray", "footrest", "whiteboard", "bookshelf", "filing cabinet",
    "paper shredder", "label printer", "document scanner", "laptop stand", "docking station",
    "noise panel", "plant pot", "coat rack", "drawer unit", "task light", "wrist rest",
)  # fmt: skip
_WAREHOUSES = ("Leeds", "Lyon", "Porto", "Gdansk")


@functools.cache
def instructions() -> str:
    """The agents' instructions: policies and a catalogue (about 1,200 tokens of
    SmolLM2's), the same for every program, as one deployment's agents share theirs."""
    rng = random.Random(7)
    lines = [
        "You are the support assistant of Northwind Office Supply. Answer customers' "
        "questions about orders, stock and prices. Use a tool whenever an answer needs "
        "an order's details, the stock of an item or arithmetic; never guess them.",
        "",
        "Policies:",
        "- Orders over 150 euros ship free; others pay 7.50 euros for shipping.",
        "- Items can be returned within 30 days of delivery, unused and in their box.",
        "- Refunds go to the original payment method within 5 working days.",
        "- A delayed order (more than 3 days past its promised date) earns a 10% voucher.",
        "- Business customers with an account pay on invoice, due in 30 days.",
        "- Prices include VAT at 21%; quote prices with VAT unless asked otherwise.",
        "- Never share another customer's order details.",
        "",
        "Catalogue (item: price in euros, weight in kg, warranty in years):",
    ]
    for item in _ITEMS:
        price = rng.randrange(900, 48000) / 100
        lines.append(
            f"- {item}: {price:.2f} EUR, {rng.randrange(2, 250) / 10:.1f} kg, "
            f"{rng.choice((1, 2, 3, 5))} year warranty, ships from "
            f"{rng.choice(_WAREHOUSES)} in {rng.randrange(1, 6)} days"
        )
    lines += [
        "",
        "Answer in two or three sentences, in plain text, citing the figures the tools returned.",
    ]
    return "\n".join(lines)


def lookup_order(order_id: str) -> str:
    digest = hashlib.sha256(order_id.encode()).digest()
    items = [_ITEMS[byte % len(_ITEMS)] for byte in digest[:3]]
    status = ("shipped", "processing", "delivered", "delayed")[digest[3] % 4]
    return (
        f"order {order_id}: {status}; items: {', '.join(items)}; total "
        f"{(digest[4] * 256 + digest[5]) % 40000 / 100:.2f} EUR; promised "
        f"2026-11-{digest[6] % 28 + 1:02d}; carrier {('DHL', 'UPS', 'GLS')[digest[7] % 3]}"
    )


def check_stock(item: str) -> str:
    digest = hashlib.sha256(item.lower().encode()).digest()
    return "; ".join(
        f"{warehouse}: {digest[index] % 60}" for index, warehouse in enumerate(_WAREHOUSES)
    )


_AGENT_TOOLS: dict[str, Callable[..., str]] = {
    "lookup_order": lookup_order,
    "check_stock": check_stock,
    HOSTED_TOOL: calculate,
}


def run_tool(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the agent's own code runs it; errors become the result text,
    as the libraries report them to the model."""
    if name not in _AGENT_TOOLS:
        return f"Error: there is no tool named {name!r}."
    try:
        return _AGENT_TOOLS[name](**arguments)
    except (ToolError, TypeError, ValueError, ArithmeticError) as error:
        return f"Error: {error}"


def _client_questions(rng: random.Random, turns: int) -> list[str]:
    asks = [
        lambda: f"Where is my order A-{rng.randrange(1000, 9999)}? When will it arrive?",
        lambda: f"Do you have the {rng.choice(_ITEMS)} in stock, and where?",
        lambda: f"What was in order B-{rng.randrange(1000, 9999)} and what did it cost?",
        lambda: f"Is the {rng.choice(_ITEMS)} available in Porto?",
    ]
    return [rng.choice(asks)() for _ in range(turns)]


def _hosted_questions(rng: random.Random, turns: int) -> list[str]:
    asks = [
        lambda: (
            f"What do {rng.randrange(2, 9)} of the {rng.choice(_ITEMS)} cost with "
            "shipping? Use the calculator."
        ),
        lambda: f"What is {rng.randrange(100, 999)} euros without the 21% VAT? Use the calculator.",
        lambda: (
            f"How much is a {rng.randrange(5, 30)}% discount on "
            f"{rng.randrange(100, 900)}.{rng.randrange(10, 99)} euros? Use the calculator."
        ),
    ]
    return [rng.choice(asks)() for _ in range(turns)]


@dataclass(frozen=True)
class ClientAgent:
    """One program: a library, streamed or not, its tools, and its questions."""

    program_id: str
    library: ClientLibrary
    stream: bool
    placement: ToolPlacement
    arrival_s: float
    questions: tuple[str, ...]

    @property
    def agent_type(self) -> str:
        return f"{self.library}/{'stream' if self.stream else 'plain'}/{self.placement}"

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [hosted_tool_schema()] if self.placement == "hosted" else CLIENT_TOOL_SCHEMAS


class ClientAgentsConfig(BaseModel):
    """Shape of the client-library workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    programs_per_kind: int = Field(
        gt=0, description="Programs of each library, streaming choice and tool placement."
    )
    questions: int = Field(gt=0, description="Questions each program asks, one after another.")
    max_tool_steps: int = Field(
        default=3, gt=0, description="Requests one question may take before the agent stops it."
    )
    max_tokens: int = Field(default=96, gt=0, description="`max_tokens` of every request.")
    temperature: float = Field(default=0.7, ge=0, description="Sampling temperature.")
    arrival_spacing_s: float = Field(
        default=1.0, ge=0, description="Seconds between programs' starts."
    )
    libraries: tuple[ClientLibrary, ...] = Field(default=CLIENT_LIBRARIES, min_length=1)
    placements: tuple[ToolPlacement, ...] = Field(default=TOOL_PLACEMENTS, min_length=1)

    def agents(self, seed: int) -> list[ClientAgent]:
        rng = random.Random(seed)
        kinds = [
            (library, stream, placement)
            for library in self.libraries
            for stream in (False, True)
            for placement in self.placements
        ]
        agents: list[ClientAgent] = []
        for number in range(self.programs_per_kind):
            for library, stream, placement in kinds:
                ask = _hosted_questions if placement == "hosted" else _client_questions
                mode = "s" if stream else "p"
                agents.append(
                    ClientAgent(
                        program_id=f"{library}-{mode}-{placement}-{number}-{seed}",
                        library=library,
                        stream=stream,
                        placement=placement,
                        arrival_s=len(agents) * self.arrival_spacing_s,
                        questions=tuple(ask(rng, self.questions)),
                    )
                )
        return agents


SIZE_CONFIGS: dict[Size, ClientAgentsConfig] = {
    "quick": ClientAgentsConfig(programs_per_kind=1, questions=2),
    "default": ClientAgentsConfig(programs_per_kind=2, questions=3),
}


def client_agents_plan(size: Size) -> WorkloadPlan:
    config = SIZE_CONFIGS[size]
    kinds = len(config.libraries) * 2 * len(config.placements)
    return WorkloadPlan(
        name="client-agents",
        size=size,
        description=(
            f"client-agents: {config.programs_per_kind * kinds} support agents written with "
            f"{', '.join(config.libraries)} (streamed and not; tools of their own and the "
            f"hosted `{HOSTED_TOOL}`), {config.questions} questions each, the first request "
            "of each forced to call a tool; the libraries send the conversation back as "
            "their users' code does"
        ),
        build=lambda seed: [],
        kv_cache_mib=512,
        max_model_len=8192,
        toolserve_overrides={"tools.hosted": [{"function": HOSTED_TOOL_FUNCTION}]},
        client_agents=config,
    )
