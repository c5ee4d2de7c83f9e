"""Partial tool execution's workloads (Conveyor, arXiv 2406.00059, §4), re-created
on the embedded model: CodeGen (a script that computes and draws a sine plot,
written statement by statement), Search (a query, then the result count),
Planning (a plan of calculator and search stages), Validation (a call whose first
argument breaks its tool's schema, followed by a long one), and the Calculator and
Database as the null cases (their tools take no partial input).

Each turn the model writes one call of a hosted tool, its text fixed by
structured outputs: every system decodes the same tokens, so the comparison is
of when the tool runs, not of what a 135M model manages to write. The reply is
streamed (a server can act on a call only as it streams). A server that runs the
tool continues the turn itself; otherwise the agent runs the call, with the
same function, and asks for the answer in a second request."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.workloads.distributions import poisson_arrivals
from bench.workloads.embedded_tokenizer import embedded_token_count
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
from toolworkers.builtin_tools import calculate
from toolworkers.database_tool import query_database
from toolworkers.plan_tool import run_plan
from toolworkers.python_tool import python
from toolworkers.registry import ToolRegistry
from toolworkers.search_tool import search

TOOL_FUNCTIONS = {
    "python": "toolworkers.python_tool:python",
    "search": "toolworkers.search_tool:search",
    "run_plan": "toolworkers.plan_tool:run_plan",
    "calculator": "toolworkers.hosted_tools:calculator",
    "query_database": "toolworkers.database_tool:query_database",
}
TASKS = ("codegen", "search", "planning", "validation", "calculator", "database")
TOOL_OF_TASK = {
    "codegen": "python",
    "search": "search",
    "planning": "run_plan",
    "validation": "calculator",
    "calculator": "calculator",
    "database": "query_database",
}
_VALIDATION_NOTE = (
    "the sum is checked again before the result is written to the ledger and every "
    "figure is rounded to two places so the totals agree with the monthly report"
)
CONVEYOR_REFERENCE = (
    "toolserve@tools.continuation.partial_execution=false"
    "@tools.continuation.stop_invalid_calls=false"
)
"""toolserve acting on calls only once they are written: no partial runs, no
validator on the stream."""
SYSTEM_PROMPT = "You are an agent. Use the tool, then answer in one short sentence."


class ConveyorConfig(BaseModel):
    """Shape of a partial-execution workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    programs_per_task: int = Field(gt=0, description="Programs of each task kind.")
    turns: int = Field(default=2, gt=0, description="Tool-calling turns of each program.")
    arrival_rate_per_s: float = Field(ge=0, description="Poisson rate of program arrivals.")
    answer_max_tokens: int = Field(
        default=24, gt=0, description="Token cap of the answer after the tool's result."
    )
    call_token_margin: float = Field(
        default=1.6,
        ge=1,
        description="A call's budget over its text's tokenization: the engine, held to "
        "the text by a grammar, writes it in more tokens than the tokenizer makes of it "
        "(measured on the embedded model: up to 1.48x on the CodeGen script, 1.07-1.21x "
        "on the other calls).",
    )
    note_token_margin: float = Field(
        default=3.5,
        ge=1,
        description="The same for a Validation call, whose prose note inside a JSON "
        "string the engine writes in far smaller pieces (2.6-3.2x measured).",
    )


def hosted_conveyor_tools() -> list[dict[str, Any]]:
    """`tools.hosted` entries for the workload's tools (the python tool is not in the
    embedded default's)."""
    return [{"function": function} for function in TOOL_FUNCTIONS.values()]


def conveyor_tool_schemas() -> dict[str, dict[str, Any]]:
    """The tools' schemas exactly as the server lists them, by name."""
    entries = [HostedToolConfig.model_validate(entry) for entry in hosted_conveyor_tools()]
    schemas = ToolRegistry.from_config(ToolsConfig(hosted=entries)).openai_schemas()
    return {schema["function"]["name"]: schema for schema in schemas}


def codegen_script(periods: int, limit: int) -> str:
    """The sine-plot task: count primes (work for the first statements to do while
    the rest is written), sample a sine, draw it into a PNG with the standard
    library, and print what was made."""
    lines = [
        "import math, struct, zlib",
        f"limit = {limit}",
        "primes = [n for n in range(2, limit) if all(n % d for d in range(2, math.isqrt(n) + 1))]",
        "print('primes below', limit, ':', len(primes))",
        "width, height = 480, 240",
        f"samples = [math.sin(2 * math.pi * {periods} * x / width) for x in range(width)]",
        "rows = [bytearray(b'\\xff' * width * 3) for _ in range(height)]",
        "for x, value in enumerate(samples):",
        "    y = int((1 - value) / 2 * (height - 1))",
        "    rows[y][3 * x : 3 * x + 3] = b'\\x00\\x00\\xff'",
        "raw = b''.join(b'\\x00' + bytes(row) for row in rows)",
        "def png_chunk(kind, data):",
        "    size = struct.pack('>I', len(data))",
        "    return size + kind + data + struct.pack('>I', zlib.crc32(kind + data))",
        "header = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)",
        "image = png_chunk(b'IHDR', header) + png_chunk(b'IDAT', zlib.compress(raw, 9))",
        f"print('sine plot of {periods} periods:', len(image), 'bytes')",
    ]
    return "\n".join(lines) + "\n"


def _task_arguments(task: str, rng: random.Random) -> dict[str, Any]:
    if task == "codegen":
        return {"code": codegen_script(rng.randint(1, 5), rng.randint(150_000, 300_000))}
    if task == "search":
        topics = ["exception handling", "for statement loop", "class definitions", "lambda"]
        return {"query": rng.choice(topics), "max_results": rng.randint(2, 4)}
    if task == "planning":
        return {
            "stages": [
                {"tool": "calculator", "input": f"{rng.randint(10, 99)} * {rng.randint(10, 99)}"},
                {"tool": "search", "input": rng.choice(["while loop", "import system"])},
                {"tool": "calculator", "input": f"2 ** {rng.randint(8, 16)} - 1"},
                {"tool": "search", "input": rng.choice(["with statement", "generators"])},
            ]
        }
    if task == "validation":
        # A number where the schema wants a string, then a long note: a validator on the
        # stream rejects the call when `expression` closes; otherwise the tool rejects it
        # once the whole call is written.
        words = _VALIDATION_NOTE.split()
        note = " ".join(words[i % len(words)] for i in range(rng.randint(40, 70)))
        return {"expression": rng.randint(100, 999), "note": note}
    if task == "database":
        return {
            "sql": f"SELECT name, words FROM topics WHERE words > {rng.randint(200, 2000)} "
            f"ORDER BY words DESC LIMIT {rng.randint(3, 8)}"
        }
    return {"expression": f"({rng.randint(100, 999)} + {rng.randint(100, 999)}) * 7"}


def forced_call(tool: str, arguments: dict[str, Any]) -> str:
    """The turn's fixed text: a lead sentence, then the call as SmolLM2's template
    has the model write one (hermes). Under `tool_choice: auto` vLLM 0.32 lets the
    reply be a call its tools' structural tag allows or the structured output; a
    text that starts with content can only be the structured output."""
    call = json.dumps({"name": tool, "arguments": arguments})
    return f"I will run it.\n<tool_call>\n{call}\n</tool_call>"


def conveyor_run(tool: str, arguments: dict[str, Any]) -> str:
    """A call run by the agent: the hosted tool's own function, whole."""
    return str(_RUNS[tool](arguments))


_RUNS = {
    "python": lambda arguments: python(str(arguments["code"])),
    "search": lambda arguments: search(str(arguments["query"]), int(arguments["max_results"])),
    "run_plan": lambda arguments: run_plan(list(arguments["stages"])),
    "calculator": lambda arguments: calculate(arguments["expression"]),
    "query_database": lambda arguments: query_database(str(arguments["sql"])),
}


@dataclass
class ConveyorProgram(AgentProgram):
    """Turns of one task kind: a streamed call (fixed text), its result, an answer."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    """Each turn's arguments."""
    call_tokens: list[int] = field(default_factory=list)
    """Each turn's call budget: its text's tokens times the margin. A server that
    continues the turn has the rest of the request's budget for the answer, and so
    has the agent that runs the call itself: the answer's cap is the same whoever
    runs the tool."""
    tool: str = ""
    answer_max_tokens: int = 24
    _answering: bool = False
    _budget_left: int = 0

    def next_request(self) -> TurnRequest | None:
        if self._answering:
            # The agent ran the call itself: the answer is a request of its own, with
            # what the call left of the turn's budget (as a server continuing has).
            self._answering = False
            self.turns_sent += 1
            return TurnRequest(tool_choice="auto", max_tokens=self._budget_left, stream=True)
        turn = sum(1 for message in self.messages if message["role"] == "user")
        if turn >= len(self.calls):
            return None
        self.turns_sent += 1
        self.messages.append(
            {"role": "user", "content": f"Task {turn + 1}: use the {self.tool} tool."}
        )
        self._budget_left = self.call_tokens[turn] + self.answer_max_tokens
        return TurnRequest(
            tool_choice="auto",
            max_tokens=self._budget_left,
            structured_outputs={"choice": [forced_call(self.tool, self.calls[turn])]},
            stream=True,
        )

    async def act(
        self, request: TurnRequest, reply: Reply, ready: dict[str, ToolOutcome] | None = None
    ) -> ToolRound:
        self._budget_left = max(1, self._budget_left - reply.completion_tokens)
        return await super().act(request, reply, ready)

    def execute(self, call: ToolCall) -> ToolOutcome:
        self._answering = True
        return checked_call(call, self.tools, lambda arguments: conveyor_run(call.name, arguments))

    def simulated_latency_s(self, turn_index: int) -> float:
        return 0.0

    def missing_call_message(self, request: TurnRequest) -> dict[str, Any] | None:
        return None


def generate_conveyor(
    config: ConveyorConfig, seed: int, count_tokens: Callable[[str], int]
) -> list[ConveyorProgram]:
    """`count_tokens`: a tokenizer's count, for the calls' budgets (the workload's
    plan uses the embedded default's; another `--model` may need a larger margin)."""
    rng = random.Random(seed)
    schemas = conveyor_tool_schemas()
    kinds = [task for task in TASKS for _ in range(config.programs_per_task)]
    rng.shuffle(kinds)
    arrivals = poisson_arrivals(len(kinds), config.arrival_rate_per_s, rng)
    programs = []
    for index, (task, arrival) in enumerate(zip(kinds, arrivals, strict=True)):
        tool = TOOL_OF_TASK[task]
        calls = [_task_arguments(task, rng) for _ in range(config.turns)]
        margin = config.note_token_margin if task == "validation" else config.call_token_margin
        programs.append(
            ConveyorProgram(
                program_id=f"conveyor-{seed}-{index:03d}",
                agent_type=task,
                arrival_s=arrival,
                tools=[schemas[tool]],
                messages=[{"role": "system", "content": SYSTEM_PROMPT}],
                calls=calls,
                call_tokens=[
                    math.ceil(count_tokens(forced_call(tool, arguments)) * margin)
                    for arguments in calls
                ],
                tool=tool,
                answer_max_tokens=config.answer_max_tokens,
            )
        )
    return programs


def conveyor_plan(size: Size) -> WorkloadPlan:
    config = (
        ConveyorConfig(programs_per_task=1, turns=2, arrival_rate_per_s=0.5)
        if size == "quick"
        else ConveyorConfig(programs_per_task=3, turns=3, arrival_rate_per_s=0.1)
    )
    return WorkloadPlan(
        name="conveyor",
        size=size,
        description=(
            f"partial tool execution (Conveyor, arXiv 2406.00059, §4): {config.programs_per_task} "
            f"program(s) of each task ({', '.join(TASKS)}), {config.turns} turns each, "
            f"Poisson arrivals at {config.arrival_rate_per_s}/s; each turn one streamed call of "
            "a hosted tool whose text structured outputs fix (the same tokens for every "
            f"system), then an answer of up to {config.answer_max_tokens} tokens. CodeGen: a "
            "script that counts primes and draws a sine plot into a PNG (the paper's plot, "
            "with the standard library); Validation: a calculator call whose first argument "
            "is a number where a string belongs, followed by a note of forty to seventy words; "
            "Calculator and Database (a read-only SQL query over the Python reference's "
            "topics): the null cases (no partial input). Not reproduced: the paper's models "
            "and GPU decoding speed"
        ),
        build=lambda seed: generate_conveyor(config, seed, embedded_token_count()),
        # Three CodeGen turns (each call some 600 tokens as the engine writes it)
        # outgrow 2048 tokens by the last one.
        kv_cache_mib=128 if size == "quick" else 256,
        max_model_len=2048 if size == "quick" else 4096,
        toolserve_overrides={"tools.hosted": hosted_conveyor_tools()},
        reference_system=CONVEYOR_REFERENCE,
        # Validation's calls are rejected, not run: no overlap bound applies.
        tool_of_agent_type={
            task: tool for task, tool in TOOL_OF_TASK.items() if task != "validation"
        },
    )
