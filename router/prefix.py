"""The shared prompt prefix of a chat request: its leading system and developer
messages plus its tool schemas, which agents of one kind repeat verbatim."""

from __future__ import annotations

import hashlib
import json
from typing import Any

_INSTRUCTION_ROLES = ("system", "developer")


def shared_prefix_key(messages: Any, tools: Any, min_chars: int) -> str | None:
    """A digest of a request's shared prefix (its messages and its tools' JSON
    schemas), or None when it is too short to be worth co-locating programs for
    (or absent)."""
    if not isinstance(messages, list):
        return None
    instructions = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in _INSTRUCTION_ROLES:
            break
        instructions.append(message.get("content"))
    prefix = {"instructions": instructions, "tools": tools or []}
    canonical = json.dumps(prefix, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if len(canonical) < min_chars:
        return None
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]
