"""Streaming tool-call validation: a reply's calls judged against the request's
declared tools while they stream (`toolworkers.call_stream` events), so that a
call that can never be valid is known the moment the text that breaks it is
decoded, not after the whole reply: a call of a tool the request did not
declare, an argument its schema rejects or does not know, a string argument
that has already outgrown its `maxLength` or left every `enum` value, and at
the call's close a missing required argument."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from toolworkers.call_stream import (
    ArgumentCompleted,
    ArgumentGrowing,
    ArgumentItemCompleted,
    CallClosed,
    CallEvent,
    CallMalformed,
    CallStarted,
)


class RejectionKind(StrEnum):
    UNDECLARED_TOOL = "undeclared_tool"
    UNKNOWN_ARGUMENT = "unknown_argument"
    BAD_ARGUMENT = "bad_argument"
    MISSING_ARGUMENT = "missing_argument"
    MALFORMED = "malformed"


@dataclass(frozen=True)
class CallRejected:
    """A call that cannot be valid, and why (for the model or the client)."""

    index: int
    kind: RejectionKind
    reason: str


@dataclass
class _ToolSchema:
    parameters: dict[str, Any] | None
    """None: the declared schema is not valid JSON Schema, so nothing is checked."""

    def argument_schema(self, name: str) -> dict[str, Any] | None:
        properties = (self.parameters or {}).get("properties")
        found = properties.get(name) if isinstance(properties, dict) else None
        return found if isinstance(found, dict) else None

    def closed(self) -> bool:
        return (self.parameters or {}).get("additionalProperties") is False


def _declared(tools: list[dict[str, Any]]) -> dict[str, _ToolSchema]:
    declared: dict[str, _ToolSchema] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        if not isinstance(parameters, dict):
            parameters = {"type": "object"}
        try:
            Draft202012Validator.check_schema(parameters)
        except SchemaError:
            declared[function["name"]] = _ToolSchema(None)
        else:
            declared[function["name"]] = _ToolSchema(parameters)
    return declared


def _first_error(schema: dict[str, Any], instance: Any) -> str | None:
    error = next(iter(Draft202012Validator(schema).iter_errors(instance)), None)
    return None if error is None else error.message


class CallValidator:
    """Fed one reply's call events in order; `check` answers the first event that
    makes a call invalid with a `CallRejected` (later events of that call are
    ignored), every other event with None. `tools`: the request's OpenAI `tools`."""

    def __init__(self, tools: list[dict[str, Any]]):
        self._tools = _declared(tools)
        self._calls: dict[int, _ToolSchema] = {}
        self._growing: dict[tuple[int, str], str] = {}
        self._rejected: set[int] = set()

    def next_reply(self) -> CallValidator:
        """A validator for another reply to the same request: the declared tools'
        schemas, checked once, are shared."""
        fresh = copy.copy(self)
        fresh._calls, fresh._growing, fresh._rejected = {}, {}, set()
        return fresh

    def check(self, event: CallEvent) -> CallRejected | None:
        if event.index in self._rejected:
            return None
        rejection = self._judge(event)
        if rejection is not None:
            self._rejected.add(event.index)
        return rejection

    def _judge(self, event: CallEvent) -> CallRejected | None:
        if isinstance(event, CallStarted):
            tool = self._tools.get(event.name)
            if tool is None:
                known = ", ".join(sorted(self._tools)) or "none"
                return CallRejected(
                    event.index,
                    RejectionKind.UNDECLARED_TOOL,
                    f"the request declares no tool {event.name!r} (declared: {known})",
                )
            self._calls[event.index] = tool
            return None
        if isinstance(event, CallMalformed):
            return CallRejected(event.index, RejectionKind.MALFORMED, event.reason)
        tool = self._calls.get(event.index)
        if tool is None or tool.parameters is None:
            return None  # before its name (judged once it is known), or unchecked
        if isinstance(event, ArgumentGrowing):
            return self._check_growing(event, tool)
        if isinstance(event, ArgumentCompleted):
            return self._check_argument(event.index, event.name, event.value, tool)
        if isinstance(event, ArgumentItemCompleted):
            return None  # judged with its whole list
        assert isinstance(event, CallClosed)
        error = _first_error(tool.parameters, event.arguments)
        if error is None:
            return None
        required = tool.parameters.get("required") or []
        missing = [name for name in required if name not in event.arguments]
        kind = RejectionKind.MISSING_ARGUMENT if missing else RejectionKind.BAD_ARGUMENT
        return CallRejected(event.index, kind, error)

    def _check_argument(
        self, index: int, name: str, value: Any, tool: _ToolSchema
    ) -> CallRejected | None:
        schema = tool.argument_schema(name)
        if schema is None:
            if tool.closed():
                return CallRejected(
                    index, RejectionKind.UNKNOWN_ARGUMENT, f"the tool takes no argument {name!r}"
                )
            return None
        # The argument alone, checked within its tool's schema (so `$ref`s resolve).
        alone = dict(tool.parameters or {})
        alone["properties"] = {name: schema}
        alone.pop("required", None)
        alone.pop("additionalProperties", None)
        error = _first_error(alone, {name: value})
        if error is None:
            return None
        return CallRejected(index, RejectionKind.BAD_ARGUMENT, f"argument {name!r}: {error}")

    def _check_growing(self, event: ArgumentGrowing, tool: _ToolSchema) -> CallRejected | None:
        key = (event.index, event.name)
        text = self._growing[key] = self._growing.get(key, "") + event.text
        schema = tool.argument_schema(event.name)
        if schema is None:
            return None
        reason = None
        if schema.get("type") not in (None, "string") and not (
            isinstance(schema.get("type"), list) and "string" in schema["type"]
        ):
            reason = f"argument {event.name!r} is a string, not {schema['type']}"
        elif isinstance(schema.get("maxLength"), int) and len(text) > schema["maxLength"]:
            reason = f"argument {event.name!r} is longer than {schema['maxLength']} characters"
        elif isinstance(schema.get("enum"), list) and not any(
            isinstance(value, str) and value.startswith(text) for value in schema["enum"]
        ):
            reason = f"argument {event.name!r} starts {text[:40]!r}, which no allowed value does"
        if reason is None:
            return None
        return CallRejected(event.index, RejectionKind.BAD_ARGUMENT, reason)
