"""Many-agent trace: programs arrive as a Poisson process; each runs a number of
turns drawn from its agent profile, and between turns a tool whose latency is
drawn from the same profile.

Source: the turn counts and tool latencies (mean ± sd) of the two agent kinds
are those Continuum (Li et al., arXiv 2511.02230, Table 1) measured on its
SWE-bench and BFCL v4 traces: SWE-bench 10.9 ± 2.1 turns, tool 925 ± 3550 ms;
BFCL v4 6.3 ± 2.3 turns, tool 1923 ± 2133 ms. Tool latencies are lognormal with
exactly that mean and sd, uncapped, so the heavy SWE-bench tail is kept.

Not reproduced: program size. Continuum's programs reach tens of thousands of
tokens (its SWE-bench contexts grow past 70k); here each turn adds a short
synthetic tool output (`tool_output_lines`) and programs end near 2k tokens, so
that SmolLM2 on two CPU cores finishes a run in minutes. Memory pressure comes
instead from a KV budget set well below the live contexts (the workload's
`kv_cache_mib`). The tools are simulated (a sleep of the drawn latency and a
canned output); the model's calls are checked against their schemas.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.workloads.coding_tools import EDIT_FILE, READ_FILE, RUN_TESTS, SEARCH_CODE
from bench.workloads.distributions import Distribution, poisson_arrivals
from bench.workloads.plan import Size, WorkloadPlan, programs_note, programs_update
from bench.workloads.program import (
    AGENT_TEMPERATURE,
    AgentProgram,
    Temperature,
    ToolCall,
    ToolOutcome,
    TurnRequest,
    checked_call,
)
from toolworkers.builtin_tools import openai_function_schema


class AgentProfile(BaseModel):
    """One kind of agent in the mix."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Agent type (`swe` or `assistant`); picks tools and prompt.")
    share: float = Field(gt=0, description="Relative share of programs of this type.")
    turns: Distribution = Field(description="Model turns per program (rounded).")
    tool_latency_s: Distribution = Field(description="Seconds each tool round takes.")


SWE_BENCH_PROFILE = AgentProfile(
    name="swe",
    share=1.0,
    turns=Distribution(kind="normal", mean=10.9, sd=2.1, low=2),
    tool_latency_s=Distribution(kind="lognormal", mean=0.925, sd=3.55),
)
BFCL_V4_PROFILE = AgentProfile(
    name="assistant",
    share=1.0,
    turns=Distribution(kind="normal", mean=6.3, sd=2.3, low=2),
    tool_latency_s=Distribution(kind="lognormal", mean=1.923, sd=2.133),
)


class TraceConfig(BaseModel):
    """Shape of a many-agent trace."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    programs: int = Field(gt=0, description="Number of agent programs.")
    arrival_rate_per_s: float = Field(
        ge=0, description="Poisson rate of program arrivals; 0 starts all at once."
    )
    profiles: tuple[AgentProfile, ...] = Field(
        default=(SWE_BENCH_PROFILE, BFCL_V4_PROFILE), description="The agent mix."
    )
    tool_output_lines: Distribution = Field(
        default=Distribution(kind="normal", mean=8, sd=3, low=2, high=24),
        description="Lines of text each tool returns (about 12 tokens per line).",
    )
    call_max_tokens: int = Field(default=64, gt=0, description="Token cap of a tool-call turn.")
    answer_max_tokens: int = Field(default=48, gt=0, description="Token cap of the final turn.")
    temperature: Temperature = AGENT_TEMPERATURE


SWE_TOOLS = [READ_FILE, SEARCH_CODE, RUN_TESTS, EDIT_FILE]
ASSISTANT_TOOLS = [
    openai_function_schema(
        "search_flights",
        "Find flights between two airports on a date.",
        {
            "type": "object",
            "properties": {
                "origin": {"type": "string", "description": "IATA code."},
                "destination": {"type": "string", "description": "IATA code."},
                "date": {"type": "string", "description": "YYYY-MM-DD."},
            },
            "required": ["origin", "destination", "date"],
        },
    ),
    openai_function_schema(
        "get_weather",
        "Weather forecast for a city.",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    ),
    openai_function_schema(
        "send_message",
        "Send a message to a contact.",
        {
            "type": "object",
            "properties": {"to": {"type": "string"}, "text": {"type": "string"}},
            "required": ["to", "text"],
        },
    ),
    openai_function_schema(
        "lookup_order",
        "Status of a customer order.",
        {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
        },
    ),
]
_PROFILE_SETUP: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "swe": (
        "You are a software engineering agent working in a Python repository. "
        "Use the tools to investigate and fix the issue. Call one tool per step; "
        "when done, summarize the fix in one sentence.",
        SWE_TOOLS,
    ),
    "assistant": (
        "You are a personal assistant with access to travel, weather, messaging and "
        "order tools. Call one tool per step; when done, answer in one sentence.",
        ASSISTANT_TOOLS,
    ),
}
_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "kappa",
    "lambda",
    "sigma",
    "omega",
    "vector",
    "matrix",
    "cache",
    "buffer",
    "index",
    "parser",
    "token",
    "stream",
    "socket",
    "worker",
    "queue",
    "ledger",
    "router",
    "budget",
]


def _task_text(profile: str, rng: random.Random, tag: str) -> str:
    noun, verb = rng.choice(_WORDS), rng.choice(("fails", "hangs", "returns None", "leaks"))
    if profile == "swe":
        return f"Issue {tag}: `{noun}_{tag}.process()` {verb} when the input is empty. Fix it."
    return f"Request {tag}: plan a trip for {noun.title()} {tag} and notify them when done."


def tool_output_text(rng: random.Random, lines: int, tag: str) -> str:
    """Code-like tool output, unique to the program (no two programs share text)."""
    rows = []
    for number in range(lines):
        a, b = rng.sample(_WORDS, 2)
        rows.append(f"{number + 1:3d}: {a}_{tag}_{number} = {b}({rng.randint(0, 9999)})")
    return "\n".join(rows)


@dataclass
class TraceProgram(AgentProgram):
    turns: int = 1
    tool_latencies_s: list[float] = field(default_factory=list)
    output_lines: list[int] = field(default_factory=list)
    seed: int = 0
    call_max_tokens: int = 64
    answer_max_tokens: int = 48

    def next_request(self) -> TurnRequest | None:
        if self.turns_sent >= self.turns:
            return None
        self.turns_sent += 1
        if self.turns_sent == self.turns:
            return TurnRequest(tool_choice="none", max_tokens=self.answer_max_tokens)
        return TurnRequest(tool_choice="required", max_tokens=self.call_max_tokens)

    def execute(self, call: ToolCall) -> ToolOutcome:
        turn_index = self.turns_sent - 1
        text = tool_output_text(
            random.Random(f"{self.seed}:{self.program_id}:{turn_index}:{call.name}"),
            self.output_lines[turn_index],
            self.program_id.rsplit("-", 1)[-1],
        )
        return checked_call(call, self.tools, lambda _arguments: text)

    def simulated_latency_s(self, turn_index: int) -> float:
        return self.tool_latencies_s[turn_index]


def generate_trace(config: TraceConfig, seed: int) -> list[TraceProgram]:
    """The same seed and config always give the same programs."""
    rng = random.Random(seed)
    arrivals = poisson_arrivals(config.programs, config.arrival_rate_per_s, rng)
    weights = [profile.share for profile in config.profiles]
    programs = []
    for index, arrival in enumerate(arrivals):
        profile = rng.choices(config.profiles, weights=weights)[0]
        turns = max(1, profile.turns.sample_int(rng))
        tag = f"{index:04d}"
        system_prompt, tools = _PROFILE_SETUP[profile.name]
        programs.append(
            TraceProgram(
                program_id=f"trace-{seed}-{tag}",
                agent_type=profile.name,
                arrival_s=arrival,
                tools=tools,
                messages=[
                    {"role": "system", "content": system_prompt},
                    {"role": "user", "content": _task_text(profile.name, rng, tag)},
                ],
                turns=turns,
                tool_latencies_s=[profile.tool_latency_s.sample(rng) for _ in range(turns)],
                output_lines=[
                    max(1, config.tool_output_lines.sample_int(rng)) for _ in range(turns)
                ],
                seed=seed,
                call_max_tokens=config.call_max_tokens,
                answer_max_tokens=config.answer_max_tokens,
                temperature=config.temperature,
            )
        )
    return programs


def _quick_profile_turns(mean: float) -> Distribution:
    return Distribution(kind="normal", mean=mean, sd=1, low=2, high=5)


SHORT_PROGRAM_PROFILES = (
    SWE_BENCH_PROFILE.model_copy(update={"turns": _quick_profile_turns(4)}),
    BFCL_V4_PROFILE.model_copy(update={"turns": _quick_profile_turns(3)}),
)
"""The mix with 2-5 turns a program (the quick size's, and the soak's)."""


def many_agent_plan(size: Size, programs: int | None = None) -> WorkloadPlan:
    """`programs`: that many a round instead of the size's own count (`--programs`)."""
    if size == "quick":
        sized = TraceConfig(
            programs=6,
            arrival_rate_per_s=0.5,
            profiles=SHORT_PROGRAM_PROFILES,
        )
        kv_cache_mib, max_model_len = 128, 2048
    else:
        # Sized so three rounds of the default system set (six systems) fit in about
        # an hour on 2 cores. The engine is busy throughout, so an arm's time goes with
        # the prompt tokens the trace sends (12 programs took 4-6 minutes a system);
        # seed 0's 7 programs send about half of what its 12 do, and their live
        # contexts still outgrow the KV budget about threefold.
        sized = TraceConfig(programs=7, arrival_rate_per_s=0.25)
        kv_cache_mib, max_model_len = 256, 4096
    config = sized.model_copy(
        update=programs_update(sized.programs, sized.arrival_rate_per_s, programs)
    )
    return WorkloadPlan(
        name="many-agent",
        size=size,
        description=(
            f"{config.programs} agent programs, Poisson arrivals at "
            f"{config.arrival_rate_per_s}/s, SWE-bench and BFCL v4 turn and tool-latency "
            "statistics (Continuum, arXiv 2511.02230, Table 1); every non-final turn must "
            "call a tool (tool_choice=required). Not reproduced: program size (about 2k "
            "tokens here, tens of thousands in Continuum's traces; memory pressure comes "
            "from a small KV budget instead) and real tools (simulated latency and output)"
            + programs_note(sized.programs, programs)
        ),
        build=lambda seed: generate_trace(config, seed),
        kv_cache_mib=kv_cache_mib,
        max_model_len=max_model_len,
        programs=config.programs,
    )
