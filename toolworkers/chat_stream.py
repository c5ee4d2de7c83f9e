"""Pure: reading a streamed chat completion's SSE chunks, and tool calls as the
model makes them (assembled from their deltas when streamed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelToolCall:
    id: str
    name: str
    arguments: str

    def as_message_part(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


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

    def __bool__(self) -> bool:
        return bool(self._pending)

    def calls(self) -> list[ModelToolCall]:
        return [
            ModelToolCall(call.id, call.name, call.arguments)
            for _, call in sorted(self._pending.items())
        ]
