"""Code generation: the model writes a multi-line Python script as the argument
of a `run_python` call, the tool really runs it (isolated interpreter, temporary
directory, timeout), and the model explains the output. The long argument that
streams line by line is what partial tool execution will work on."""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from bench.workloads.distributions import poisson_arrivals
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
from toolworkers.builtin_tools import openai_function_schema

_OUTPUT_CHARS = 1500
RUN_PYTHON = openai_function_schema(
    "run_python",
    "Run a Python 3 script and return what it prints.",
    {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The whole script."}},
        "required": ["code"],
    },
)
SYSTEM_PROMPT = (
    "You write short Python scripts and run them with the run_python tool. Write the "
    "script over several lines: a function, a loop, and print statements."
)
_TASKS = (
    "print the first {n} prime numbers",
    "print the squares of the numbers from 1 to {n}",
    "print the Fibonacci numbers below {n}",
    "count the vowels in the words of 'agents call tools {n} times' and print each count",
    "print a multiplication table from 1 to {n}",
    "print the sum of the digits of every number from {n} to {n} + 10",
    "print the factorials of 1 to {n}",
    "print every year between 2000 and 2000 + {n} that is a leap year",
)


class CodegenConfig(BaseModel):
    """Shape of a code-generation workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    programs: int = Field(gt=0, description="Number of programs.")
    tasks_per_program: int = Field(default=2, gt=0, description="Scripts each program writes.")
    arrival_rate_per_s: float = Field(ge=0, description="Poisson rate of program arrivals.")
    code_max_tokens: int = Field(default=192, gt=0, description="Token cap of a script turn.")
    answer_max_tokens: int = Field(default=48, gt=0, description="Token cap of an explanation.")
    timeout_s: float = Field(default=5, gt=0, description="Wall-clock limit of one script.")
    temperature: Temperature = AGENT_TEMPERATURE


def run_python(code: str, timeout_s: float) -> str:
    """Run a script in an isolated interpreter in a fresh temporary directory."""
    with tempfile.TemporaryDirectory(prefix="toolserve-bench-") as workdir:
        try:
            finished = subprocess.run(
                [sys.executable, "-I", "-c", code],
                cwd=workdir,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"Error: the script ran longer than {timeout_s:g}s and was stopped."
    output = finished.stdout + (f"\n[stderr]\n{finished.stderr}" if finished.stderr else "")
    if finished.returncode:
        output += f"\n[exit code {finished.returncode}]"
    return output[:_OUTPUT_CHARS] or "(no output)"


@dataclass
class CodegenProgram(AgentProgram):
    tasks: list[str] = field(default_factory=list)
    code_max_tokens: int = 192
    answer_max_tokens: int = 48
    timeout_s: float = 5.0

    def next_request(self) -> TurnRequest | None:
        task_index, explaining = divmod(self.turns_sent, 2)
        if task_index >= len(self.tasks):
            return None
        self.turns_sent += 1
        if explaining:
            self.messages.append({"role": "user", "content": "Explain the output in one sentence."})
            return TurnRequest(tool_choice="none", max_tokens=self.answer_max_tokens)
        self.messages.append(
            {"role": "user", "content": f"Write and run a script to {self.tasks[task_index]}."}
        )
        return TurnRequest(tool_choice=named_tool("run_python"), max_tokens=self.code_max_tokens)

    def execute(self, call: ToolCall) -> ToolOutcome:
        return checked_call(
            call, self.tools, lambda arguments: run_python(str(arguments["code"]), self.timeout_s)
        )

    def simulated_latency_s(self, turn_index: int) -> float:
        return 0.0


def generate_codegen(config: CodegenConfig, seed: int) -> list[CodegenProgram]:
    rng = random.Random(seed)
    arrivals = poisson_arrivals(config.programs, config.arrival_rate_per_s, rng)
    return [
        CodegenProgram(
            program_id=f"codegen-{seed}-{index:03d}",
            agent_type="codegen",
            arrival_s=arrival,
            tools=[RUN_PYTHON],
            messages=[{"role": "system", "content": SYSTEM_PROMPT}],
            tasks=[
                rng.choice(_TASKS).format(n=rng.randint(5, 40))
                for _ in range(config.tasks_per_program)
            ],
            code_max_tokens=config.code_max_tokens,
            answer_max_tokens=config.answer_max_tokens,
            timeout_s=config.timeout_s,
            temperature=config.temperature,
        )
        for index, arrival in enumerate(arrivals)
    ]


def codegen_plan(size: Size) -> WorkloadPlan:
    config = CodegenConfig(
        programs=3 if size == "quick" else 8,
        tasks_per_program=1 if size == "quick" else 2,
        arrival_rate_per_s=0.5 if size == "quick" else 0.2,
    )
    return WorkloadPlan(
        name="codegen",
        size=size,
        description=(
            f"{config.programs} programs writing {config.tasks_per_program} Python "
            "script(s) each, run by a real interpreter"
        ),
        build=lambda seed: generate_codegen(config, seed),
        kv_cache_mib=128,
        max_model_len=2048,
    )
