"""What every benchmark workload is made of: agent programs that alternate model
turns and tool calls, driven against an OpenAI-compatible API.

A program owns its conversation. The driver asks it for the next request, sends
it, hands back the reply, and lets the program run the tools the reply asked
for (really executing them, sleeping for the simulated part of their latency).
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field

from cluster.openai_protocol import ModelToolCall

ToolChoice = str | dict[str, Any]
Temperature = Annotated[
    float,
    Field(
        ge=0,
        description="Sampling temperature of every turn: the model's calls and answers "
        "vary from program to program and turn to turn, as real agents' do, and drafts "
        "copied from earlier turns are accepted no more often than such text allows. "
        "Turns carry no `seed`: vLLM's CPU engine fails whenever a seeded request's "
        "prefill is split across steps (its CPU generator cannot be rewound), so they "
        "sample from the engine's own seeded generator.",
    ),
]
AGENT_TEMPERATURE = 0.7


def named_tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@dataclass(frozen=True)
class TurnRequest:
    """One model request of a program: the conversation so far is the program's."""

    tool_choice: ToolChoice
    max_tokens: int
    structured_outputs: dict[str, Any] | None = None
    stream: bool = False
    """Ask for the reply as a stream (a server acts on streamed calls as they are
    written: partial tool execution)."""
    exact_length: bool = False
    """Decode exactly `max_tokens` (vLLM's `min_tokens` and `ignore_eos`)."""

    @property
    def expects_tool_call(self) -> bool:
        return self.tool_choice not in ("none", "auto")


@dataclass(frozen=True)
class ToolCall(ModelToolCall):
    def parsed_arguments(self) -> dict[str, Any] | None:
        """The arguments as a JSON object, or None when they are not one."""
        try:
            value = json.loads(self.arguments or "{}")
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Reply:
    """What the model answered to one turn (an OpenAI chat completion, reduced)."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int | None
    completion_tokens: int
    executed_messages: tuple[dict[str, Any], ...] = ()
    """Tool calls the server ran and their results (engine-side continuation),
    to go into the conversation before the reply's own message."""
    replica: str | None = None
    """The model replica that answered (`X-Toolserve-Replica`), where the server says."""
    first_result_s: float | None = None
    """Streamed replies: seconds from sending the request to the first chunk that
    carried tool results the server ran (None: it ran none)."""
    first_token_s: float | None = None
    """Streamed replies: seconds from sending the request to the first chunk that
    carried generated text, content or a call (None: not streamed, or no text)."""

    def assistant_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content or ""}
        if self.tool_calls:
            message["tool_calls"] = [call.as_message_part() for call in self.tool_calls]
        return message


@dataclass(frozen=True)
class ToolOutcome:
    """A tool call as the program executed it."""

    content: str
    usable: bool


@dataclass(frozen=True)
class ToolRound:
    """The tools run after one turn: how long the agent spent on them, and how many
    of the model's calls could not be used (malformed, unknown tool, bad arguments,
    or no call where one was required)."""

    latency_s: float
    calls: int
    unusable_calls: int


@dataclass
class AgentProgram(ABC):
    """One agent run: all its turns share `program_id` (sent as `X-Session-ID`)."""

    program_id: str
    agent_type: str
    arrival_s: float
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns_sent: int = 0
    temperature: float = 0.0
    """Sampling temperature of its turns."""

    @abstractmethod
    def next_request(self) -> TurnRequest | None:
        """The next model request, or None when the program is finished."""

    @abstractmethod
    def execute(self, call: ToolCall) -> ToolOutcome:
        """Run one tool call for real (blocking) and return its result text."""

    @abstractmethod
    def simulated_latency_s(self, turn_index: int) -> float:
        """Extra wall-clock time the tools of this turn take (an API, a test run):
        drawn from the workload's distribution, so every system sees the same."""

    def side_effect_free_tools(self) -> set[str]:
        """Tools a client may run before the model asks (client-side speculation)."""
        return set()

    def tool_state(self) -> dict[str, Any]:
        """Initial state of the server's stateful tools for this program, by slot:
        set before its first turn on a server that hosts them."""
        return {}

    def missing_call_message(self, request: TurnRequest) -> dict[str, Any] | None:
        """What the agent says when a required call did not come; None: say nothing."""
        return {
            "role": "user",
            "content": "You did not call a tool. Call exactly one tool next.",
        }

    async def act(
        self, request: TurnRequest, reply: Reply, ready: dict[str, ToolOutcome] | None = None
    ) -> ToolRound:
        """Record the reply, run the tools it asked for, append their results.
        `ready`: outcomes by call id the client already has (speculated calls)."""
        turn_index = self.turns_sent - 1
        self.messages += reply.executed_messages
        self.messages.append(reply.assistant_message())
        started = time.monotonic()
        ready = ready or {}
        outcomes = [
            ready[call.id] if call.id in ready else await asyncio.to_thread(self.execute, call)
            for call in reply.tool_calls
        ]
        for call, outcome in zip(reply.tool_calls, outcomes, strict=True):
            self.messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": outcome.content}
            )
        unusable = sum(not outcome.usable for outcome in outcomes)
        if request.expects_tool_call and not reply.tool_calls:
            unusable += 1
            nudge = self.missing_call_message(request)
            if nudge is not None:
                self.messages.append(nudge)
        ran_tools = bool(reply.tool_calls) or request.expects_tool_call
        if ran_tools:
            remaining = self.simulated_latency_s(turn_index) - (time.monotonic() - started)
            if remaining > 0:
                await asyncio.sleep(remaining)
        return ToolRound(
            latency_s=time.monotonic() - started if ran_tools else 0.0,
            calls=max(len(reply.tool_calls), int(request.expects_tool_call)),
            unusable_calls=unusable,
        )


def known_tool_names(tools: list[dict[str, Any]]) -> set[str]:
    return {tool["function"]["name"] for tool in tools}


def checked_call(
    call: ToolCall,
    tools: list[dict[str, Any]],
    run: Callable[[dict[str, Any]], str],
) -> ToolOutcome:
    """Validate a call against the declared tools, then run it; errors become the
    tool's result text, as an agent framework would report them to the model."""
    if call.name not in known_tool_names(tools):
        return ToolOutcome(f"Error: there is no tool named {call.name!r}.", usable=False)
    arguments = call.parsed_arguments()
    if arguments is None:
        return ToolOutcome("Error: the arguments are not a JSON object.", usable=False)
    try:
        return ToolOutcome(run(arguments), usable=True)
    except (TypeError, ValueError, KeyError) as error:
        return ToolOutcome(f"Error: {error}", usable=False)
