"""Two scripted coding workflows with the turn counts of "Stateful Inference for
Low-Latency Multi-Agent Tool Calling" (arXiv 2605.26289): a 6-turn bug fix and a
35-turn coding session, on which that paper reports its per-turn and median-turn
figures against vLLM and SGLang. Each turn asks for a named tool (the model
writes the arguments); the tools answer from a scripted repository whose file
names are unique per session, so the conversation grows every turn and no
response repeats another session's.

Only the turn counts and the shape (a context that grows by one tool result per
turn, every token generated fresh) follow the paper. Not reproduced: its
workflows' prompts, tools and context sizes, which it does not publish in a
form that can be replayed; the steps here (list, read, edit, test) and the
repository's contents are this project's own, sized so that SmolLM2 on two CPU
cores finishes a session in minutes."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.workloads.coding_tools import EDIT_FILE, LIST_FILES, READ_FILE, RUN_TESTS
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
    named_tool,
)

FINAL_ANSWER = "final_answer"
BUG_FIX_STEPS = ("list_files", "read_test", "read_source", "run_tests", "edit_file", FINAL_ANSWER)
CODING_CYCLES = 11


def coding_steps(rng: random.Random) -> tuple[str, ...]:
    """List the files, then eleven cycles of reading (the source or its tests),
    an edit and a check (the tests, or the source read again), then the summary:
    35 turns, in an order of the session's own."""
    steps = ["list_files"]
    for _ in range(CODING_CYCLES):
        steps += [
            rng.choice(("read_source", "read_test")),
            "edit_file",
            rng.choice(("run_tests", "run_tests", "read_source")),
        ]
    return (*steps, FINAL_ANSWER)


WORKFLOW_STEPS: dict[str, Callable[[random.Random], tuple[str, ...]]] = {
    "bugfix-6": lambda _rng: BUG_FIX_STEPS,
    "coding-35": coding_steps,
}
_STEP_TOOL = {
    "list_files": "list_files",
    "read_test": "read_file",
    "read_source": "read_file",
    "run_tests": "run_tests",
    "edit_file": "edit_file",
}

WORKFLOW_TOOLS = [LIST_FILES, READ_FILE, EDIT_FILE, RUN_TESTS]
SYSTEM_PROMPT = (
    "You are a coding agent in a small Python repository. Work step by step with the "
    "tools: read code, edit it, run the tests. When asked for the summary, answer in "
    "two sentences."
)


class WorkflowConfig(BaseModel):
    """Shape of a workflow workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workflow: str = Field(description=f"Which script: one of {sorted(WORKFLOW_STEPS)}.")
    sessions: int = Field(gt=0, description="Concurrent sessions, each a program.")
    arrival_rate_per_s: float = Field(
        ge=0, description="Poisson rate of session starts; 0 starts all at once."
    )
    tool_latency_s: Distribution = Field(
        default=Distribution(kind="lognormal", mean=0.5, sd=0.5, high=5),
        description="Seconds each tool takes.",
    )
    call_max_tokens: int = Field(
        default=96,
        gt=0,
        description="Token cap of a tool turn: room for a call with two bounded strings "
        "(`coding_tools.MAX_ARGUMENT_CHARS`).",
    )
    answer_max_tokens: int = Field(default=64, gt=0, description="Token cap of the summary.")
    temperature: Temperature = AGENT_TEMPERATURE


@dataclass
class ScriptedRepository:
    """The files one session sees; names carry the session's tag."""

    tag: str
    rng: random.Random
    module: str = ""
    files: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.module = f"{self.rng.choice(('ledger', 'router', 'parser', 'cache'))}_{self.tag}"
        self.files = {
            # 12 lines keep the 35-turn conversation inside SmolLM2's 8k context.
            f"src/{self.module}.py": self._code_lines(12),
            f"tests/test_{self.module}.py": self._test_lines(12),
            f"docs/{self.module}.md": [f"# {self.module}", "Notes on the module."],
        }

    def _code_lines(self, count: int) -> list[str]:
        lines = [f"class {self.module.title().replace('_', '')}:"]
        for number in range(1, count):
            lines.append(
                f"    def step_{self.tag}_{number}(self, x):  # v{self.rng.randint(1, 99)}"
                if number % 3 == 1
                else f"        return x * {self.rng.randint(2, 97)} + {self.rng.randint(0, 999)}"
            )
        return lines

    def _test_lines(self, count: int) -> list[str]:
        lines = [f"from src.{self.module} import *", ""]
        for number in range(1, count - 1):
            lines.append(f"def test_step_{self.tag}_{number}(): assert step({number}) > 0")
        return lines

    def answer(self, step: str, turn_index: int) -> str:
        rng = random.Random(f"{self.tag}:{turn_index}")
        source, test = f"src/{self.module}.py", f"tests/test_{self.module}.py"
        if step == "list_files":
            return "\n".join(sorted(self.files))
        if step in ("read_source", "read_test"):
            path = source if step == "read_source" else test
            return "\n".join(f"{n + 1:3d} {line}" for n, line in enumerate(self.files[path]))
        if step == "edit_file":
            line = rng.randint(2, len(self.files[source]) - 1)
            new = f"        return x * {rng.randint(2, 97)}  # edit {turn_index}"
            self.files[source][line - 1] = new
            return f"Edited {source} line {line}:\n{line:3d} {new}"
        failed = rng.randint(0, 2)
        lines = [f"collected {len(self.files[test]) - 2} items", f"{test} " + "." * 6]
        if failed:
            lines.append(f"FAILED {test}::test_step_{self.tag}_{failed} - AssertionError")
        lines.append(f"{failed} failed, {8 - failed} passed in 0.{rng.randint(10, 99)}s")
        return "\n".join(lines)


@dataclass
class WorkflowProgram(AgentProgram):
    steps: tuple[str, ...] = ()
    latencies_s: list[float] = field(default_factory=list)
    repository: ScriptedRepository | None = None
    call_max_tokens: int = 64
    answer_max_tokens: int = 64

    def next_request(self) -> TurnRequest | None:
        if self.turns_sent >= len(self.steps):
            return None
        step = self.steps[self.turns_sent]
        self.turns_sent += 1
        if step == FINAL_ANSWER:
            self.messages.append(
                {"role": "user", "content": "Summarize what you changed and the test status."}
            )
            return TurnRequest(tool_choice="none", max_tokens=self.answer_max_tokens)
        return TurnRequest(
            tool_choice=named_tool(_STEP_TOOL[step]), max_tokens=self.call_max_tokens
        )

    def execute(self, call: ToolCall) -> ToolOutcome:
        assert self.repository is not None
        repository, turn_index = self.repository, self.turns_sent - 1
        step = self.steps[turn_index]
        return checked_call(
            call, self.tools, lambda _arguments: repository.answer(step, turn_index)
        )

    def simulated_latency_s(self, turn_index: int) -> float:
        return self.latencies_s[turn_index]

    def missing_call_message(self, request: TurnRequest) -> dict[str, Any] | None:
        assert self.repository is not None
        step = self.steps[self.turns_sent - 1]
        return {
            "role": "user",
            "content": f"(no tool was called; here is the {step} output)\n"
            + self.repository.answer(step, self.turns_sent - 1),
        }


def generate_workflows(config: WorkflowConfig, seed: int) -> list[WorkflowProgram]:
    if config.workflow not in WORKFLOW_STEPS:
        raise ValueError(f"unknown workflow {config.workflow!r}; known: {sorted(WORKFLOW_STEPS)}")
    rng = random.Random(seed)
    arrivals = poisson_arrivals(config.sessions, config.arrival_rate_per_s, rng)
    programs = []
    for index, arrival in enumerate(arrivals):
        tag = f"s{seed}x{index:03d}"
        repository = ScriptedRepository(tag=tag, rng=random.Random(f"{seed}:{tag}"))
        steps = WORKFLOW_STEPS[config.workflow](random.Random(f"{seed}:{tag}:steps"))
        programs.append(
            WorkflowProgram(
                program_id=f"{config.workflow}-{seed}-{index:03d}",
                agent_type=config.workflow,
                arrival_s=arrival,
                tools=WORKFLOW_TOOLS,
                messages=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {
                        "role": "user",
                        "content": f"The tests of module {repository.module} fail. "
                        "Find the cause and fix it.",
                    },
                ],
                steps=steps,
                latencies_s=[config.tool_latency_s.sample(rng) for _ in steps],
                repository=repository,
                call_max_tokens=config.call_max_tokens,
                answer_max_tokens=config.answer_max_tokens,
                temperature=config.temperature,
            )
        )
    return programs


def workflow_plan(name: str, size: Size) -> WorkloadPlan:
    if name == "bugfix-6":
        sessions, rate = (3, 0.5) if size == "quick" else (12, 0.2)
        kv_cache_mib, max_model_len = 128, 2048
    else:
        # Four sessions took about 15 minutes a system; two keep three rounds of the
        # default systems near an hour while contexts still outgrow the KV budget.
        sessions, rate = (1, 0.0) if size == "quick" else (2, 0.05)
        kv_cache_mib, max_model_len = 384, 8192
    config = WorkflowConfig(workflow=name, sessions=sessions, arrival_rate_per_s=rate)
    turns = 6 if name == "bugfix-6" else 35
    return WorkloadPlan(
        name=name,
        size=size,
        description=(
            f"{sessions} sessions of the {turns}-turn "
            f"{'bug-fix' if name == 'bugfix-6' else 'coding'} workflow (named tool each "
            "turn, context grows every turn, unique file names per session). Turn count "
            "from arXiv 2605.26289; not reproduced: its prompts, tools and context sizes "
            "(unpublished), the steps and repository here are this project's own"
        ),
        build=lambda seed: generate_workflows(config, seed),
        kv_cache_mib=kv_cache_mib,
        max_model_len=max_model_len,
    )
