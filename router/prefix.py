"""The shared prompt prefix of a chat request (its leading system and developer
messages plus its tool schemas, which agents of one kind repeat verbatim), and
the opening of its conversation (that prefix and the first user message)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

_INSTRUCTION_ROLES = ("system", "developer")


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _instructions(messages: list[Any]) -> list[Any]:
    instructions = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in _INSTRUCTION_ROLES:
            break
        instructions.append(message.get("content"))
    return instructions


def conversation_key(messages: Any, tools: Any) -> str | None:
    """A digest of how a conversation opens (its instructions, first user
    message and tools' schemas), the same on every later turn of it; None
    without a user message after the instructions."""
    if not isinstance(messages, list):
        return None
    instructions = _instructions(messages)
    opening = messages[len(instructions) : len(instructions) + 1]
    if not opening or not isinstance(opening[0], dict) or opening[0].get("role") != "user":
        return None
    return _digest(
        {"instructions": instructions, "user": opening[0].get("content"), "tools": tools or []}
    )


def shared_prefix_key(messages: Any, tools: Any, min_chars: int) -> str | None:
    """A digest of a request's shared prefix (its messages and its tools' JSON
    schemas), or None when it is too short to be worth co-locating programs for
    (or absent)."""
    if not isinstance(messages, list):
        return None
    prefix = {"instructions": _instructions(messages), "tools": tools or []}
    canonical = json.dumps(prefix, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(canonical) < min_chars:
        return None
    return _digest(prefix)
