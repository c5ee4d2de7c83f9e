"""The speculative-tool-calls workload: records agents that explain their plan
in one sentence, call a slow records service, then answer. The service's
latency is set per agent kind (0.1 s to 3 s) so tool time can be set against
the model's generation time.

Each program is one task: a ticket key in the user message, a first request
whose output is held to the shape "plan sentence, then a lookup" (a structured
output, since the 135M model rarely calls tools of its own accord), the tool,
and a final answer. The shape fixes only the format: the model writes the key
itself, and at greedy decoding the 135M model copies the ticket in only some
tasks (4 of 16 when this was written), writing the chat template's example key
or an invented one otherwise. A predictor that copies the ticket is therefore
right only as often as the model is, and the speculation figures measure that,
not a workload built for the predictor. The records tools are hosted by
toolserve with the same schema the program declares, so a server that runs
them itself continues the turn in one request (engine-side); a server that
does not hands the call back and the program runs it, sleeping the same
latency.

Not reproduced: the speculative tool calls papers' tasks (BFCL and agent
traces with a capable model); the shape here is this project's own."""

from __future__ import annotations

import random
import time
from typing import Any

from pydantic import BaseModel, Field

from bench.tools import record_text
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
from cluster.config import HostedToolConfig, ToolsConfig
from toolworkers.registry import ToolRegistry

TOOL_FUNCTION = "bench.tools:lookup_record"


def plan_and_call_regex(tool_name: str) -> str:
    """One plan sentence, then a call of `tool_name` with a key of the model's
    choosing, in the chat template's `<tool_call>` format (read back by the
    hermes parser). Tool names here are `[a-z0-9_]`: nothing to escape."""
    return (
        r"[A-Z][A-Za-z0-9 ,'\-]{15,150}\.\n<tool_call>\n"
        r'\{"name": "' + tool_name + r'", "arguments": \{"key": "[A-Za-z0-9\-]{1,24}"\}\}'
        r"\n</tool_call>"
    )


def records_tool_name(latency_s: float) -> str:
    return f"lookup_record_{round(latency_s * 1000)}ms"


def hosted_records_tools(latencies_s: tuple[float, ...]) -> list[dict[str, Any]]:
    """`tools.hosted` entries for the records service at each latency."""
    return [
        {
            "function": TOOL_FUNCTION,
            "name": records_tool_name(latency),
            "options": {"latency_s": latency},
        }
        for latency in latencies_s
    ]


def records_tool_schema(latency_s: float) -> dict[str, Any]:
    """The tool's schema exactly as the server lists it in `GET /v1/tools`."""
    entry = HostedToolConfig.model_validate(hosted_records_tools((latency_s,))[0])
    (schema,) = ToolRegistry.from_config(ToolsConfig(hosted=[entry])).openai_schemas()
    return schema


class RecordsTaskConfig(BaseModel):
    """Shape of the speculation workload's records tasks."""

    latencies_s: tuple[float, ...] = Field(
        default=(0.1, 0.5, 1.0, 3.0), description="Records-service latency per agent kind."
    )
    programs_per_latency: int = Field(
        default=8,
        ge=1,
        description="Tasks per agent kind; the first of each kind teach the learned predictor "
        "(as many as the shipped `learned_min_support` asks).",
    )
    arrival_gap_s: float = Field(
        default=12.0,
        gt=0,
        description="Seconds between task arrivals: a steady trickle that leaves the two "
        "cores room, so the run measures latency rather than queueing.",
    )
    max_tokens: int = Field(
        default=96, description="Budget of a task: plan and call, then the answer."
    )


class RecordsProgram(AgentProgram):
    def __init__(
        self,
        program_id: str,
        arrival_s: float,
        latency_s: float,
        ticket: str,
        max_tokens: int,
    ):
        tool = records_tool_schema(latency_s)
        super().__init__(
            program_id=program_id,
            agent_type=f"records-{latency_s:g}s",
            arrival_s=arrival_s,
            tools=[tool],
            messages=[
                {
                    "role": "system",
                    "content": "You are a support assistant. Records live in the records "
                    f"service; look them up with {tool['function']['name']}.",
                },
                {
                    "role": "user",
                    "content": f"Ticket {ticket} needs attention. Say in one sentence what "
                    "you will do, then look up its record.",
                },
            ],
        )
        self._latency_s = latency_s
        self._tool_name = tool["function"]["name"]
        self._max_tokens = max_tokens
        self._spent_tokens = 0
        self._answered = False

    def next_request(self) -> TurnRequest | None:
        if self._answered:
            return None
        self.turns_sent += 1
        if self.turns_sent == 1:
            return TurnRequest(
                tool_choice="auto",
                max_tokens=self._max_tokens,
                structured_outputs={"regex": plan_and_call_regex(self._tool_name)},
            )
        return TurnRequest(tool_choice="none", max_tokens=self._remaining_tokens())

    def _remaining_tokens(self) -> int:
        return max(8, self._max_tokens - self._spent_tokens)

    async def act(
        self, request: TurnRequest, reply: Reply, ready: dict[str, ToolOutcome] | None = None
    ) -> ToolRound:
        # The task ends with the first reply that calls no tool.
        self._spent_tokens += reply.completion_tokens
        self._answered = not reply.tool_calls
        return await super().act(request, reply, ready)

    def side_effect_free_tools(self) -> set[str]:
        return {self._tool_name}

    def execute(self, call: ToolCall) -> ToolOutcome:
        def lookup(arguments: dict[str, Any]) -> str:
            time.sleep(self._latency_s)
            return record_text(str(arguments["key"]))

        return checked_call(call, self.tools, lookup)

    def simulated_latency_s(self, turn_index: int) -> float:
        return 0.0  # `execute` takes the service's latency itself


def generate_speculation(config: RecordsTaskConfig, seed: int) -> list[RecordsProgram]:
    rng = random.Random(seed)
    programs = []
    for index in range(config.programs_per_latency * len(config.latencies_s)):
        latency = config.latencies_s[index % len(config.latencies_s)]
        ticket = f"{rng.choice(('INC', 'REQ', 'BUG'))}-{rng.randrange(1000, 9999)}"
        programs.append(
            RecordsProgram(
                program_id=f"records-{index:03d}",
                arrival_s=index * config.arrival_gap_s,
                latency_s=latency,
                ticket=ticket,
                max_tokens=config.max_tokens,
            )
        )
    return programs


def speculation_plan(size: Size) -> WorkloadPlan:
    config = (
        RecordsTaskConfig(latencies_s=(0.1, 1.0), programs_per_latency=3, arrival_gap_s=6.0)
        if size == "quick"
        else RecordsTaskConfig()
    )
    programs = config.programs_per_latency * len(config.latencies_s)
    return WorkloadPlan(
        name="speculation",
        size=size,
        description=(
            f"{programs} records tasks (plan sentence, a records lookup with a key the "
            f"model writes, answer), one every "
            f"{config.arrival_gap_s:g}s, records-service latency "
            + ", ".join(f"{latency:g}s" for latency in config.latencies_s)
        ),
        build=lambda seed: generate_speculation(config, seed),
        kv_cache_mib=128,
        max_model_len=2048,
        toolserve_overrides={
            "tools.hosted": hosted_records_tools(config.latencies_s),
        },
        reference_system="toolserve-no-speculation",
    )
