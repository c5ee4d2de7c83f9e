"""Hosted tools for the tool-cache tests; each run leaves a line in a ledger file."""

from __future__ import annotations

import time
from pathlib import Path

from toolworkers.builtin_tools import ToolError
from toolworkers.registry import hosted_tool

_ANY_OBJECT = {"type": "object", "properties": {}}


@hosted_tool(description="Looks a city up slowly.", parameters=_ANY_OBJECT, side_effect_free=True)
def slow_lookup(city: str, days: int, *, ledger: str) -> str:
    with Path(ledger).open("a") as log:
        log.write("ran\n")
    time.sleep(0.5)
    return f"{city} for {days} days"


@hosted_tool(description="Appends a line.", parameters=_ANY_OBJECT, side_effect_free=False)
def append_line(text: str, *, ledger: str) -> str:
    with Path(ledger).open("a") as log:
        log.write(text + "\n")
    return "appended"


@hosted_tool(description="Always fails.", parameters=_ANY_OBJECT, side_effect_free=True)
def always_fails() -> str:
    raise ToolError("the backend is down")
