"""Per-program state of stateful hosted tools (BFCL's file system, trading bot, ...).

A tool declares a state slot (`@hosted_tool(state_slot=...)`); all tools of a slot
share one state per program (and tenant). A call sees the state the program's
previous call on the slot left, or, before any call, the slot's scenario: the
initial state the client set (`PUT /v1/sessions/{program}/tool-state/{slot}`).
The executor runs one call of a program at a time and stores the state a call
leaves only when the call succeeded, so a failed call changes nothing.

The state crosses the sandbox boundary pickled (base64 text inside the JSON
request and reply); only the executor's own store ever supplies it (see
`cluster.store.tool_state`).
"""

from __future__ import annotations

import base64
import pickle
from dataclasses import dataclass
from typing import Any


@dataclass
class ToolState:
    """A program's state slot as a stateful tool sees it: `value` is what the
    previous call left (None before the first), `scenario` the initial state the
    client set for the slot (None if none). Assign `value` to keep a new state."""

    value: Any
    scenario: Any


def encode_value(value: Any) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def decode_value(text: str | None) -> Any:
    return None if text is None else pickle.loads(base64.b64decode(text))
