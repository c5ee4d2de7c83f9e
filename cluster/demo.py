"""`toolserve up --demo`: a 5-turn tool-calling agent against the running API,
executing real tool functions on a small workspace."""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai import OpenAI

from toolworkers.builtin_tools import Workspace, run_tool_call

WORKSPACE_FILES = {
    "orders.csv": "order,amount_eur\nA-100,12.50\nA-101,7.25\nA-102,30.00\n",
    "notes.txt": "Orders are listed in orders.csv. Amounts are in euros.\n",
}
# Per turn: the tool the agent asks for (the model fills in the arguments), then
# a free choice among the tools, then a final answer without tools.
TURN_TOOL_CHOICE: list[Any] = [
    {"type": "function", "function": {"name": "list_files"}},
    {"type": "function", "function": {"name": "read_file"}},
    {"type": "function", "function": {"name": "calculator"}},
    "required",
    "none",
]
TASK = (
    "What is the total amount of all orders in the workspace? Look at the files, "
    "add the amounts with the calculator, then answer in one sentence."
)


@dataclass
class TurnRecord:
    turn: int
    latency_s: float
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    answer: str | None = None
    cached_prompt_tokens: int | None = None


def run_demo(api_base: str, model: str, log: Callable[[str], None] = print) -> list[TurnRecord]:
    program_id = f"demo-{uuid.uuid4().hex[:8]}"
    client = OpenAI(
        base_url=api_base,
        api_key="toolserve",
        default_headers={"X-Session-ID": program_id},
        max_retries=0,
    )
    records = []
    with tempfile.TemporaryDirectory(prefix="toolserve-demo-") as root:
        for name, text in WORKSPACE_FILES.items():
            (Path(root) / name).write_text(text)
        tools = Workspace(Path(root)).tools()
        tool_schemas: list[Any] = [tool.schema() for tool in tools]
        messages: list[Any] = [
            {"role": "system", "content": "You are a careful assistant that uses tools."},
            {"role": "user", "content": TASK},
        ]
        log(f"demo: program {program_id}, task: {TASK}")
        for turn, tool_choice in enumerate(TURN_TOOL_CHOICE, 1):
            started = time.monotonic()
            response = client.chat.completions.create(
                model=model,
                messages=messages,
                tools=tool_schemas,
                tool_choice=tool_choice,
                parallel_tool_calls=False,
                temperature=0,
                max_tokens=128,
            )
            record = TurnRecord(turn, time.monotonic() - started)
            details = response.usage.prompt_tokens_details if response.usage else None
            record.cached_prompt_tokens = details.cached_tokens if details else None
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                function = getattr(call, "function", None)
                if function is None:
                    continue
                result = run_tool_call(tools, function.name, function.arguments)
                record.tool_calls.append((function.name, function.arguments, result))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if not record.tool_calls:
                record.answer = message.content or ""
            records.append(record)
            log(_describe(record))
    return records


def _describe(record: TurnRecord) -> str:
    cached = (
        f", {record.cached_prompt_tokens} prompt tokens cached"
        if record.cached_prompt_tokens is not None
        else ""
    )
    head = f"turn {record.turn}: {record.latency_s:5.2f}s{cached}"
    if record.answer is not None:
        return f"{head}\n  answer: {record.answer.strip()}"
    lines = [head]
    for name, arguments, result in record.tool_calls:
        shown = result.replace("\n", " | ")
        lines.append(f"  {name}({arguments}) -> {shown[:120]}")
    return "\n".join(lines)
