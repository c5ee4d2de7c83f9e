"""OpenAI's chat-completions wire format as toolserve reads and writes it, in one
place: tool calls in reply messages and in streamed chunks (reassembled from
their deltas), SSE events, and toolserve's `toolserve` extension of a reply."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

EXTENSION_FIELD = "toolserve"
"""A reply's (or a chunk's) extension: `executed_messages`, the tool calls the
server ran and their results, to insert before the reply's own message."""

SSE_DONE = "data: [DONE]\n\n"

# Engine arguments (`vllm_xargs`) the ingress adds to a turn for the engine's
# scheduler and the router.
LAST_STEP_ARG = "toolserve_last_step"
"""The program's last turn: nothing to pin after it."""
RETAIN_FOR_ARG = "toolserve_retain_for_s"
"""The client's retain-for hint, seconds."""
EXPECTED_TOOL_ARG = "toolserve_expected_tool_s"
"""The client's expected tool time, seconds."""
PARENT_PROGRAM_ARG = "toolserve_parent_program"
"""The program a forked program (a sub-agent) was forked from."""
PREDICTED_CALLS_ARG = "toolserve_predicted_calls"
"""The calls the turn's speculation predicted, each as its JSON object text
(`{"name": ..., "arguments": {...}}`): the engine drafts a call's tokens from them."""


def with_predicted_calls(
    engine_args: dict[str, Any] | None, predicted: list[str]
) -> dict[str, Any] | None:
    """A request's engine arguments with the server's predicted calls (if any) in
    place of any the client sent: the engine tokenizes them in its scheduler's
    loop, so only the server's own are drafted from."""
    kept = {
        name: value for name, value in (engine_args or {}).items() if name != PREDICTED_CALLS_ARG
    }
    if predicted:
        kept[PREDICTED_CALLS_ARG] = predicted
    return kept or None


@dataclass(frozen=True)
class ModelToolCall:
    """One call as the model made it; `arguments` is the model's JSON text."""

    id: str
    name: str
    arguments: str

    def as_message_part(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def message_tool_calls(message: Any) -> list[ModelToolCall]:
    """The calls of a message (a reply's `message` or a history entry), in order;
    entries without a function name are skipped."""
    if not isinstance(message, dict):
        return []
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            arguments = function.get("arguments") or ""
            if not isinstance(arguments, str):  # a client's history may hold an object
                arguments = json.dumps(arguments)
            calls.append(ModelToolCall(str(call.get("id") or ""), function["name"], arguments))
    return calls


def reply_tool_calls(reply: dict[str, Any]) -> list[ModelToolCall]:
    """The calls of every choice of a non-streamed reply."""
    return [
        call
        for choice in reply.get("choices") or []
        for call in message_tool_calls(choice.get("message"))
    ]


def executed_messages(extended: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The messages of a reply's or chunk's extension (for the `openai` SDK's
    objects, pass their `model_extra`)."""
    extension = (extended or {}).get(EXTENSION_FIELD) or {}
    return list(extension.get("executed_messages") or [])


def with_executed_messages(reply: dict[str, Any], executed: list[dict[str, Any]]) -> dict[str, Any]:
    reply[EXTENSION_FIELD] = {"executed_messages": executed}
    return reply


def sse_event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def sse_payloads(sse: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a chunk's `data:` events (`[DONE]` left out)."""
    for event in sse.split("\n\n"):
        payload = event.strip().removeprefix("data:").strip()
        if payload.startswith("{"):
            yield json.loads(payload)


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class ToolCallDeltas:
    """Tool calls assembled from `delta.tool_calls` fragments, by their index."""

    _pending: dict[int, _PendingCall] = field(default_factory=dict)

    def feed(self, parts: list[dict[str, Any]]) -> None:
        for part in parts:
            pending = self._pending.setdefault(int(part.get("index", 0)), _PendingCall())
            pending.id = part.get("id") or pending.id
            function = part.get("function") or {}
            pending.name = function.get("name") or pending.name
            pending.arguments += function.get("arguments") or ""

    def feed_chunk(self, data: dict[str, Any]) -> None:
        """Every choice's call fragments of one parsed chunk."""
        for choice in data.get("choices") or []:
            self.feed((choice.get("delta") or {}).get("tool_calls") or [])

    def feed_sse(self, sse: str) -> None:
        """The call fragments of an SSE chunk; most chunks are text and are not parsed."""
        if '"tool_calls"' in sse:
            for data in sse_payloads(sse):
                self.feed_chunk(data)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def calls(self) -> list[ModelToolCall]:
        return [
            ModelToolCall(call.id, call.name, call.arguments)
            for _, call in sorted(self._pending.items())
        ]

    def drop_from(self, index: int) -> None:
        """Forgets the call `index` and every later one."""
        self._pending = {at: call for at, call in self._pending.items() if at < index}


@dataclass
class StreamedReply:
    """The non-streamed chat completion a single-choice stream adds up to: fed its
    SSE chunks in order (the server's extension's executed messages included)."""

    id: str = ""
    created: int = 0
    model: str = ""
    content: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    executed: list[dict[str, Any]] = field(default_factory=list)
    _calls: ToolCallDeltas = field(default_factory=ToolCallDeltas)

    def feed_sse(self, sse: str) -> None:
        for data in sse_payloads(sse):
            if "error" in data:
                self.error = data["error"]
                continue
            self.id = data.get("id") or self.id
            self.created = data.get("created") or self.created
            self.model = data.get("model") or self.model
            self.usage = data.get("usage") or self.usage
            self.executed += executed_messages(data)
            for choice in data.get("choices") or []:
                delta = choice.get("delta") or {}
                self.content += delta.get("content") or ""
                self._calls.feed(delta.get("tool_calls") or [])
                self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def body(self) -> dict[str, Any]:
        calls = self._calls.calls()
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.content or None,
            "tool_calls": [call.as_message_part() for call in calls],
        }
        reply = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": self.usage,
        }
        return with_executed_messages(reply, self.executed) if self.executed else reply
