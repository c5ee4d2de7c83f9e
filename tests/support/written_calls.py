"""Turns whose reply text is fixed, so the real engine streams a chosen tool call
(well-formed or not) through vLLM's own parser."""

from __future__ import annotations

import json
from typing import Any

from openai import OpenAI

# vLLM 0.32 lets a `tool_choice: auto` reply with structured outputs be either a call
# its tools' structural tag allows or the structured output; a fixed text that starts
# with content (not with `<tool_call>`) can only be the latter, so the model writes
# exactly this text, and vLLM's hermes parser streams its call as it is written.
LEAD = "Sure.\n"


def written_turn(
    client: OpenAI,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    call: str,
    options: dict[str, Any] | None = None,
    stream: bool = True,
) -> list[dict[str, Any]]:
    """A `tool_choice: auto` turn (streamed unless told) whose text is LEAD and
    `call` (a hermes call of one of `tools`, which the server hosts): the messages
    the server added."""
    reply = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        tool_choice="auto",
        temperature=0,
        max_tokens=160,
        stream=stream,
        extra_body={"structured_outputs": {"choice": [LEAD + call]}}
        | ({"toolserve": options} if options else {}),
    )
    parts = reply if stream else [reply]
    executed: list[dict[str, Any]] = []
    for part in parts:
        executed += ((part.model_extra or {}).get("toolserve") or {}).get("executed_messages", [])
    return executed


def invalid_calculator_call() -> str:
    """A calculator call whose first argument is a number where a string belongs,
    followed by a long argument the model never needs to write once the call is
    stopped."""
    tail = " ".join(["then some further words the model never needs to write"] * 8)
    return (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": 42, "note": "'
        + tail
        + '"}}\n</tool_call>'
    )


def calculator_called(index: int, expression: str) -> dict[str, Any]:
    """An assistant message that called the calculator."""
    arguments = json.dumps({"expression": expression})
    function = {"name": "calculator", "arguments": arguments}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": f"call-{index}", "type": "function", "function": function}],
    }


CALCULATOR_FEW_SHOT = [
    {"role": "system", "content": "You answer with one calculator call."},
    {"role": "user", "content": "What is 12 * 7?"},
    calculator_called(1, "12 * 7"),
    {"role": "user", "content": "And 300 / 4?"},
    calculator_called(2, "300 / 4"),
    {"role": "user", "content": "How many minutes are in a week?"},
]
"""Shown two calculator calls, SmolLM2 (greedy, embedded tools template) answers
with a call of its own in hermes text, whose expression is nowhere in the prompt."""
