"""Helpers for tests of tools fed a streamed call: a reply's call text in the
hermes format, and a tool run's outcome as the model would read it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from toolworkers.builtin_tools import ToolError


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def outcome(run: Callable[[], str]) -> tuple[bool, str]:
    """(True, the result) or (False, the tool error's message)."""
    try:
        return True, run()
    except ToolError as error:
        return False, str(error)
