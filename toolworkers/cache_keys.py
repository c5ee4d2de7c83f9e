"""Pure: the canonical identity of a tool call, shared by the global tool cache,
speculation and the client SDK, so a call predicted, posted by a client or made by
the model finds the same entry however its arguments were written."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

# Integral floats within this bound are exact as integers: 1.0, 1e2 and 100 agree.
_EXACT_INTEGER_BOUND = 2**53


class ArgumentsError(ValueError):
    """Tool-call arguments that are not a JSON object."""


def _normalized(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArgumentsError(f"{value} is not a JSON number")
        if value.is_integer() and abs(value) < _EXACT_INTEGER_BOUND:
            return int(value)
        return value
    if isinstance(value, dict):
        return {str(key): _normalized(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalized(item) for item in value]
    raise ArgumentsError(f"{type(value).__name__} is not a JSON value")


def parse_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """A call's arguments as a dict: OpenAI's JSON string, a dict, or nothing."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError as error:
            raise ArgumentsError(f"arguments are not valid JSON: {error.msg}") from error
    else:
        parsed = arguments
    if not isinstance(parsed, dict):
        raise ArgumentsError("arguments must be a JSON object")
    return parsed


def normalized_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """The arguments with integral numbers as integers: what a tool receives, so
    calls that share a key also share a result."""
    normalized: dict[str, Any] = _normalized(parse_arguments(arguments))
    return normalized


def canonical_arguments(arguments: str | dict[str, Any] | None) -> str:
    """Sorted keys, no insignificant whitespace, integral numbers as integers."""
    return json.dumps(
        normalized_arguments(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


@dataclass(frozen=True)
class CacheScope:
    """Who may see a cached result: one tenant's one program, or (for tools whose
    result does not depend on a program's state) all of a tenant's programs. A
    tool that reads a program's tool state names the `state_version` its result
    was computed on: the result is for that program while its state is unchanged."""

    tenant: str
    program_id: str | None
    state_version: str | None = None

    def prefix(self) -> str:
        program = "*" if self.program_id is None else self.program_id
        prefix = f"{_escaped(self.tenant)}/{_escaped(program)}"
        return prefix if self.state_version is None else f"{prefix}@{self.state_version}"


def _escaped(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


@dataclass(frozen=True)
class ToolCallKey:
    """A tool call's cache identity: scope, tool name and canonical arguments."""

    scope: CacheScope
    tool: str
    arguments: str

    @classmethod
    def of(
        cls, scope: CacheScope, tool: str, arguments: str | dict[str, Any] | None
    ) -> ToolCallKey:
        return cls(scope, tool, canonical_arguments(arguments))

    def digest(self) -> str:
        payload = json.dumps([self.scope.prefix(), self.tool, self.arguments])
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def __str__(self) -> str:
        return f"{self.scope.prefix()}/{_escaped(self.tool)}/{self.digest()}"
