"""Trace replay: agent programs whose turns are given as token counts, not content.

Each turn appends a given number of tokens to the conversation (the tool output
or user text the agent got since its last turn) and decodes exactly a given
number of tokens (`min_tokens` = `max_tokens`, `ignore_eos`), and turns are
separated by tool pauses. What the model happens to write can neither shorten
nor lengthen the work, so every system does the same prefill and decode; the
sampled text (temperature 0.7) does not repeat itself, so n-gram
drafts are accepted at the rate unrepetitive text gives them. Turns are
streamed, usage reported in the last chunk, so each records its time to the
first token.

Shapes, per agent kind (sources):
- `coding`: a SWE-bench-style coding agent. Turns 10.9 ± 2.1 and tool pauses
  925 ± 3550 ms (lognormal) from Continuum's SWE-bench trace statistics (Li et
  al., arXiv 2511.02230, Table 1). Contexts grow by file reads and test logs
  toward the model's limit, as in the coding-agent traces of vLLM's AgentX
  write-up (2026-09: median 43 turns and 142k input tokens per session, over 96%
  prefix hits) and Mooncake's SWE-bench traces; scaled here to an 8k-token model:
  a turn adds 350 ± 400 tokens (lognormal) and writes 50 ± 40 (a call and a
  line of reasoning; an assumption, as the sources give no per-turn output).
- `assistant`: a BFCL v4-style tool assistant. Turns 6.3 ± 2.3 and tool pauses
  1923 ± 2133 ms from the same table; short tool results (120 ± 80 tokens) and
  calls or answers of 30 ± 20 tokens (assumed likewise).
`trace-replay-tools`: the same kinds, each turn a call of a tool drawn from the
kind's mix, whose own duration is the pause after it (milliseconds for a file
read, seconds for a search, tens of seconds for a test run), so a server that
prices retention by the tool being called can; the turn's text is fixed (a line
of drawn length, then the call), the same for every system.
A program ends at its drawn turn count or before a turn would pass `max_context`
tokens. Not reproduced: the content of real tools and calls (word lists of the
model's vocabulary stand in), sub-agents and parallel calls.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.workloads.distributions import Distribution, poisson_arrivals
from bench.workloads.embedded_tokenizer import embedded_vocabulary_words
from bench.workloads.plan import Size, WorkloadPlan, programs_note, programs_update
from bench.workloads.program import (
    AGENT_TEMPERATURE,
    AgentProgram,
    Reply,
    Temperature,
    ToolCall,
    ToolOutcome,
    ToolRound,
    TurnRequest,
)
from bench.workloads.trace import BFCL_V4_PROFILE, SWE_BENCH_PROFILE

TokenText = Callable[[random.Random, int], str]
"""Text of about the given number of tokens, drawn with the given generator."""


class ReplayTool(BaseModel):
    """A tool of a replayed agent kind: how often turns call it and how long the
    agent is away while it runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The tool's name, as the model's call names it.")
    share: float = Field(gt=0, description="Relative share of the kind's calls.")
    pause_s: Distribution = Field(description="Seconds it runs (the pause after the turn).")


class ReplayProfile(BaseModel):
    """One kind of agent in the replayed mix, by its turns' token counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Agent kind, reported per kind.")
    share: float = Field(gt=0, description="Relative share of programs of this kind.")
    turns: Distribution = Field(description="Model turns per program (rounded).")
    first_prompt_tokens: int = Field(
        gt=0, description="Tokens of the first prompt (system prompt, tool docs, task)."
    )
    appended_tokens: Distribution = Field(
        description="Tokens each later turn adds (tool output, user text)."
    )
    output_tokens: Distribution = Field(description="Tokens each turn decodes, exactly.")
    tool_pause_s: Distribution = Field(description="Seconds between a turn and the next.")
    tools: tuple[ReplayTool, ...] = Field(
        default=(),
        description="Tools the kind's turns call, each turn one drawn by share, the pause "
        "after it the tool's own (`tool_pause_s` unused); none: turns write text, the "
        "pause drawn from `tool_pause_s`.",
    )


CODING_PROFILE = ReplayProfile(
    name="coding",
    share=1.0,
    turns=SWE_BENCH_PROFILE.turns,
    first_prompt_tokens=1500,
    appended_tokens=Distribution(kind="lognormal", mean=350, sd=400, low=16, high=2500),
    output_tokens=Distribution(kind="lognormal", mean=50, sd=40, low=12, high=300),
    tool_pause_s=SWE_BENCH_PROFILE.tool_latency_s,
)
ASSISTANT_PROFILE = ReplayProfile(
    name="assistant",
    share=1.0,
    turns=BFCL_V4_PROFILE.turns,
    first_prompt_tokens=900,
    appended_tokens=Distribution(kind="lognormal", mean=120, sd=80, low=16, high=800),
    output_tokens=Distribution(kind="lognormal", mean=30, sd=20, low=8, high=150),
    tool_pause_s=BFCL_V4_PROFILE.tool_latency_s,
)


def _lognormal(mean: float, sd: float, high: float) -> Distribution:
    return Distribution(kind="lognormal", mean=mean, sd=sd, low=0.001, high=high)


# The tool mixes below split each kind's pauses by tool; the split is an
# assumption (the sources give the pause distribution, not its tools), chosen so
# that the mix keeps the source's mean: coding about 0.9 s, assistant about 1.9 s.
CODING_TOOLS_PROFILE = CODING_PROFILE.model_copy(
    update={
        "tools": (
            ReplayTool(name="read_file", share=50, pause_s=_lognormal(0.05, 0.03, 1.0)),
            ReplayTool(name="edit_file", share=25, pause_s=_lognormal(0.1, 0.05, 1.0)),
            ReplayTool(name="search_code", share=15, pause_s=_lognormal(0.4, 0.3, 3.0)),
            ReplayTool(name="run_tests", share=10, pause_s=_lognormal(8.0, 6.0, 40.0)),
        )
    }
)
ASSISTANT_TOOLS_PROFILE = ASSISTANT_PROFILE.model_copy(
    update={
        "tools": (
            ReplayTool(name="calculator", share=10, pause_s=_lognormal(0.01, 0.005, 0.1)),
            ReplayTool(name="call_api", share=60, pause_s=_lognormal(1.0, 0.5, 5.0)),
            ReplayTool(name="web_search", share=30, pause_s=_lognormal(4.0, 3.0, 30.0)),
        )
    }
)


class ReplayConfig(BaseModel):
    """Shape of a replayed trace."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    programs: int = Field(gt=0, description="Number of agent programs.")
    arrival_rate_per_s: float = Field(
        ge=0, description="Poisson rate of program arrivals; 0 starts all at once."
    )
    max_context: int = Field(
        gt=0, description="A program ends before a turn's prompt and output would pass this."
    )
    profiles: tuple[ReplayProfile, ...] = Field(
        default=(CODING_PROFILE, ASSISTANT_PROFILE), description="The agent mix."
    )
    temperature: Temperature = AGENT_TEMPERATURE


@dataclass(frozen=True)
class TurnShape:
    """One turn: the text appended before it (empty for the first), the tokens it
    decodes, and the pause after it; a turn that calls a tool writes `call_text`,
    fixed, instead of `output_tokens` sampled ones."""

    appended_text: str
    output_tokens: int
    pause_s: float
    call_text: str | None = None
    appended_tokens: int = 0
    """The drawn length of `appended_text`, in tokens."""
    tool: str | None = None
    """The tool `call_text` calls."""


CALL_MARGIN_TOKENS = 64
"""Room beyond a fixed call text's drawn length (its markup and the tokenizer's
merges); the text ends the turn."""


def replay_tool_schema(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The agent's {name.replace('_', ' ')} tool.",
            "parameters": {
                "type": "object",
                "properties": {"target": {"type": "string"}},
                "required": ["target"],
            },
        },
    }


def fixed_call_text(lead: str, tool: str, target: str) -> str:
    """A turn's whole text: a line of reasoning, then the call as SmolLM2's tool
    template has the model write one (hermes)."""
    call = json.dumps({"name": tool, "arguments": {"target": target}})
    return f"{lead.strip()}\n<tool_call>\n{call}\n</tool_call>"


@dataclass
class ReplayProgram(AgentProgram):
    shapes: list[TurnShape] = field(default_factory=list)
    first_prompt_tokens: int = 0
    """The drawn length of the first message, in tokens."""

    pending_call_id: str | None = None
    """The call the last turn made, whose result the next turn's text is."""

    def next_request(self) -> TurnRequest | None:
        if self.turns_sent >= len(self.shapes):
            return None
        shape = self.shapes[self.turns_sent]
        if shape.appended_text:
            if self.pending_call_id is not None:
                self.messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": self.pending_call_id,
                        "content": shape.appended_text,
                    }
                )
            else:
                self.messages.append({"role": "user", "content": shape.appended_text})
        self.pending_call_id = None
        self.turns_sent += 1
        # Streamed for the time to each turn's first token (the reply is the same).
        if shape.call_text is not None:
            # The text is fixed: a call of the tool, which the server parses as one.
            return TurnRequest(
                tool_choice="auto",
                max_tokens=shape.output_tokens + CALL_MARGIN_TOKENS,
                structured_outputs={"choice": [shape.call_text]},
                stream=True,
            )
        return TurnRequest(
            tool_choice="none", max_tokens=shape.output_tokens, exact_length=True, stream=True
        )

    def execute(self, call: ToolCall) -> ToolOutcome:
        raise NotImplementedError("a replayed program's tools are its pauses")

    def simulated_latency_s(self, turn_index: int) -> float:
        return self.shapes[turn_index].pause_s

    async def act(
        self, request: TurnRequest, reply: Reply, ready: dict[str, ToolOutcome] | None = None
    ) -> ToolRound:
        """Record the reply, then wait out the tool pause (none after the last turn)."""
        self.messages.append(reply.assistant_message())
        self.pending_call_id = reply.tool_calls[0].id if reply.tool_calls else None
        if self.turns_sent >= len(self.shapes):
            return ToolRound(latency_s=0.0, calls=0, unusable_calls=0)
        started = time.monotonic()
        await asyncio.sleep(self.simulated_latency_s(self.turns_sent - 1))
        return ToolRound(latency_s=time.monotonic() - started, calls=1, unusable_calls=0)


def program_shapes(
    profile: ReplayProfile, max_context: int, rng: random.Random, text: TokenText
) -> tuple[str, list[TurnShape]]:
    """The first prompt's text and the program's turns, stopped before the context
    would pass `max_context` (every program keeps at least one turn)."""
    turns = max(1, profile.turns.sample_int(rng))
    context = profile.first_prompt_tokens
    shapes: list[TurnShape] = []
    weights = [tool.share for tool in profile.tools]
    for index in range(turns):
        appended = 0 if index == 0 else max(1, profile.appended_tokens.sample_int(rng))
        output = max(1, profile.output_tokens.sample_int(rng))
        call_text = tool_name = None
        if profile.tools:
            tool = rng.choices(profile.tools, weights=weights)[0]
            pause = tool.pause_s.sample(rng)
            call_text = fixed_call_text(text(rng, output), tool.name, text(rng, 3))
            tool_name = tool.name
        else:
            pause = profile.tool_pause_s.sample(rng)
        written = output + (CALL_MARGIN_TOKENS if call_text is not None else 0)
        if shapes and context + appended + written > max_context:
            break
        context += appended + written
        shapes.append(
            TurnShape(
                text(rng, appended) if appended else "",
                output,
                pause,
                call_text,
                appended_tokens=appended,
                tool=tool_name,
            )
        )
    return text(rng, profile.first_prompt_tokens), shapes


def generate_replay(config: ReplayConfig, seed: int, text: TokenText) -> list[ReplayProgram]:
    """The same seed, config and text source always give the same programs."""
    rng = random.Random(seed)
    arrivals = poisson_arrivals(config.programs, config.arrival_rate_per_s, rng)
    weights = [profile.share for profile in config.profiles]
    programs = []
    for index, arrival in enumerate(arrivals):
        profile = rng.choices(config.profiles, weights=weights)[0]
        first_prompt, shapes = program_shapes(profile, config.max_context, rng, text)
        messages: list[dict[str, Any]] = [{"role": "user", "content": first_prompt}]
        programs.append(
            ReplayProgram(
                program_id=f"replay-{seed}-{index:04d}",
                agent_type=profile.name,
                arrival_s=arrival,
                tools=[replay_tool_schema(tool.name) for tool in profile.tools],
                messages=messages,
                shapes=shapes,
                temperature=config.temperature,
                first_prompt_tokens=profile.first_prompt_tokens,
            )
        )
    return programs


def vocabulary_text(words: Sequence[str]) -> TokenText:
    """Text drawn from `words`, each of which the model's tokenizer reads as one
    token when it follows a space: `count` tokens, give or take the tokenizer's
    merges across a line break."""

    def text(rng: random.Random, count: int) -> str:
        parts = []
        left = count
        while left > 0:
            # A line: up to 11 words, then its line break: 12 tokens.
            drawn = rng.choices(words, k=min(11, left))
            parts += [" " + word for word in drawn]
            left -= len(drawn)
            if left > 0:
                parts.append("\n")
                left -= 1
        return "".join(parts)

    return text


def trace_replay_plan(size: Size, programs: int | None = None) -> WorkloadPlan:
    """`programs`: that many a round instead of the size's own count (`--programs`)."""
    return _replay_plan("trace-replay", size, programs, (CODING_PROFILE, ASSISTANT_PROFILE))


def trace_replay_tools_plan(size: Size, programs: int | None = None) -> WorkloadPlan:
    """Trace replay whose turns call tools of mixed durations (milliseconds to tens
    of seconds), named in each call, so a server can tell which tool is running."""
    return _replay_plan(
        "trace-replay-tools", size, programs, (CODING_TOOLS_PROFILE, ASSISTANT_TOOLS_PROFILE)
    )


def _replay_plan(
    name: str, size: Size, programs: int | None, profiles: tuple[ReplayProfile, ...]
) -> WorkloadPlan:
    if size == "quick":
        sized = ReplayConfig(
            programs=6, arrival_rate_per_s=0.5, max_context=3072, profiles=profiles
        )
        kv_cache_mib, max_model_len = 384, 4096
    else:
        # 24 programs so that the KV pool is under pressure without thrashing: 16
        # over the same 80 s of arrivals peaked at 0.9x the pool, 32 at 2.4x.
        # The chat template's markup comes on top of the content's tokens.
        sized = ReplayConfig(
            programs=24, arrival_rate_per_s=0.3, max_context=7680, profiles=profiles
        )
        kv_cache_mib, max_model_len = 1536, 8192
    config = sized.model_copy(
        update=programs_update(sized.programs, sized.arrival_rate_per_s, programs)
    )
    calls = any(profile.tools for profile in profiles)
    turn_text = (
        "each turn appends a drawn number of tokens and writes a fixed call of a tool drawn "
        "from its kind's mix (a line of drawn length, then the call; structured outputs' "
        "`choice`), the pause after it the tool's own: coding agents read_file ~50 ms, "
        "edit_file ~0.1 s, search_code ~0.4 s, run_tests ~8 s; assistants calculator ~10 "
        "ms, call_api ~1 s, web_search ~4 s"
        if calls
        else "each turn appends a drawn number of tokens and decodes exactly a drawn number "
        "(min_tokens = max_tokens, ignore_eos; temperature "
        f"{config.temperature}), tool pauses between turns"
    )
    return WorkloadPlan(
        name=name,
        size=size,
        description=(
            f"{config.programs} agent programs replayed by token counts, Poisson arrivals "
            f"at {config.arrival_rate_per_s}/s, contexts up to {config.max_context} tokens: "
            f"{turn_text}. Coding "
            "agents and tool assistants with Continuum's SWE-bench and BFCL v4 turn and "
            "pause statistics (arXiv 2511.02230, Table 1), coding contexts growing toward "
            "the model's limit (vLLM's AgentX write-up, Mooncake's SWE-bench traces); "
            "sources and token counts in bench/workloads/replay.py"
            + programs_note(sized.programs, programs)
        ),
        build=lambda seed: generate_replay(
            config, seed, vocabulary_text(embedded_vocabulary_words())
        ),
        kv_cache_mib=kv_cache_mib,
        max_model_len=max_model_len,
        programs=config.programs,
    )
