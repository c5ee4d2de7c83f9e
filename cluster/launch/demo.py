"""`toolserve up --demo`: a 5-turn tool-calling agent against the running API,
executing real tool functions on a small workspace."""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from cluster.openai_protocol import executed_messages
from toolworkers.builtin_tools import ToolError, Workspace, calculate, string_parameter
from toolworkers.registry import ToolSpec

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
# Tools the demo lets the server run when it hosts them (declared with the
# server's schema); the file tools stay the demo's, over its own workspace.
SERVER_TOOLS = ("calculator",)
# The last turn answers in prose: without this the small model often writes
# call markup as its "answer" even when no tool may be called.
PROSE_ONLY = {"structured_outputs": {"regex": "[^<]+"}}
TASK = (
    "What is the total amount of all orders in the workspace? Look at the files, "
    "add the amounts with the calculator, then answer in one sentence."
)


ToolFunction = Callable[..., str]


def choice_parameter(name: str, description: str, choices: list[str]) -> dict[str, Any]:
    """One required string out of `choices`: structured outputs hold a named
    call's arguments to the schema, so the model cannot name a missing file."""
    parameters = string_parameter(name, description)
    parameters["properties"][name]["enum"] = choices
    return parameters


def workspace_tools(workspace: Workspace) -> list[tuple[ToolSpec, ToolFunction]]:
    """The demo's own tools: hosted tools' names with the demo's schemas, so the
    server leaves them to the demo (except `SERVER_TOOLS`, sent with the server's)."""
    return [
        (
            ToolSpec(
                "list_files",
                "List the files in a directory of the workspace.",
                choice_parameter("directory", "Directory relative to the workspace", ["."]),
                side_effect_free=True,
            ),
            workspace.list_files,
        ),
        (
            ToolSpec(
                "read_file",
                "Read a text file of the workspace.",
                choice_parameter(
                    "path", "File path relative to the workspace", sorted(WORKSPACE_FILES)
                ),
                side_effect_free=True,
            ),
            workspace.read_file,
        ),
        (
            ToolSpec(
                "search_files",
                "Find the lines of workspace files that contain a text.",
                string_parameter("text", "Text to look for (case-insensitive)"),
                side_effect_free=True,
            ),
            workspace.search_files,
        ),
        (
            ToolSpec(
                "calculator",
                "Evaluate an arithmetic expression such as '(12.5 + 7) * 3'.",
                string_parameter("expression", "The arithmetic expression"),
                side_effect_free=True,
            ),
            calculate,
        ),
    ]


def run_tool_call(functions: Mapping[str, ToolFunction], name: str, arguments_json: str) -> str:
    """Execute one model tool call; failures come back as text for the model."""
    if name not in functions:
        return f"error: unknown tool {name!r}; tools: {', '.join(functions)}"
    try:
        arguments = json.loads(arguments_json or "{}")
    except json.JSONDecodeError as error:
        return f"error: arguments are not valid JSON: {error}"
    if not isinstance(arguments, dict):
        return "error: arguments must be a JSON object"
    try:
        return functions[name](**arguments)
    except ToolError as error:
        return f"error: {error}"
    except TypeError as error:
        return f"error: bad arguments for {name}: {error}"


@dataclass
class TurnRecord:
    turn: int
    latency_s: float
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    answer: str | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    server_calls: list[tuple[str, str]] = field(default_factory=list)
    server_results: list[str] = field(default_factory=list)


def server_executed_messages(response: Any) -> list[dict[str, Any]]:
    """The tool calls the server ran itself and their results (engine-side
    continuation), to insert before the reply's message in the history."""
    return executed_messages(response.model_extra)


def _server_tools(api_base: str) -> dict[str, Any]:
    try:
        listed = httpx.get(f"{api_base}/tools", timeout=10).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return {}
    return {tool["function"]["name"]: tool for tool in listed}


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
        tools = workspace_tools(Workspace(Path(root)))
        functions = {spec.name: function for spec, function in tools}
        server_tools = _server_tools(api_base)
        tool_schemas: list[Any] = [
            server_tools.get(spec.name, spec.openai_schema())
            if spec.name in SERVER_TOOLS
            else spec.openai_schema()
            for spec, _ in tools
        ]
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
                extra_body=PROSE_ONLY if tool_choice == "none" else None,
            )
            record = TurnRecord(turn, time.monotonic() - started)
            if response.usage is not None:
                record.prompt_tokens = response.usage.prompt_tokens
                details = response.usage.prompt_tokens_details
                record.cached_prompt_tokens = details.cached_tokens if details else None
            message = response.choices[0].message
            for executed in server_executed_messages(response):
                messages.append(executed)
                if executed["role"] == "tool":
                    record.server_results.append(executed["content"])
                else:
                    record.server_calls += [
                        (call["function"]["name"], call["function"]["arguments"])
                        for call in executed.get("tool_calls") or []
                    ]
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                function = getattr(call, "function", None)
                if function is None:
                    continue
                result = run_tool_call(functions, function.name, function.arguments)
                record.tool_calls.append((function.name, function.arguments, result))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if not record.tool_calls:
                record.answer = message.content or ""
            records.append(record)
            log(_describe(record))
    log(_summarize(records))
    return records


def _summarize(records: list[TurnRecord]) -> str:
    returning = records[1:]
    prompt = sum(record.prompt_tokens or 0 for record in returning)
    cached = sum(record.cached_prompt_tokens or 0 for record in returning)
    server_calls = sum(len(record.server_calls) for record in records)
    share = f" ({cached / prompt:.0%})" if prompt else ""
    return (
        f"demo: turns 2-{len(records)} took {cached} of their {prompt} prompt tokens{share} "
        f"from the program's cached prefix; the server ran {server_calls} call(s) itself"
    )


def _describe(record: TurnRecord) -> str:
    cached = (
        f", {record.cached_prompt_tokens} of {record.prompt_tokens} prompt tokens cached"
        if record.cached_prompt_tokens is not None and record.prompt_tokens is not None
        else ""
    )
    lines = [f"turn {record.turn}: {record.latency_s:5.2f}s{cached}"]
    for (name, arguments), result in zip(record.server_calls, record.server_results, strict=False):
        shown = result.replace("\n", " | ")
        lines.append(f"  {name}({arguments}) -> {shown[:120]}  [run by the server]")
    if record.answer is not None:
        return "\n".join([*lines, f"  answer: {record.answer.strip()}"])
    for name, arguments, result in record.tool_calls:
        shown = result.replace("\n", " | ")
        lines.append(f"  {name}({arguments}) -> {shown[:120]}")
    return "\n".join(lines)
