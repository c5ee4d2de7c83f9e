"""Hosted tools: Python callables that declare their schema and properties with
`@hosted_tool`, named in configuration (`tools.hosted`, one by one or as a
`ToolSet`) and resolved into a `ToolRegistry`. Only side-effect-free tools may be
speculated or cached. A stateful tool (a `state_slot`) that is side-effect-free
reads its program's state and changes nothing: its results are cached per state
version (see `toolworkers.execution`); the others never are."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from toolworkers.builtin_tools import openai_function_schema
from toolworkers.partial_input import PartialInput

if TYPE_CHECKING:
    # Tool modules import this one in every sandboxed call's fresh process;
    # the configuration model (pydantic) would add a quarter second to each.
    from cluster.config import ToolsConfig

_SPEC_ATTRIBUTE = "__toolserve_tool__"


class RegistryError(ValueError):
    """A configured tool cannot be resolved or clashes with another."""


class CostClass(StrEnum):
    """How much a call costs to run: speculation starts cheap tools freely and
    expensive ones only on confident predictions."""

    CHEAP = "cheap"
    MODERATE = "moderate"
    EXPENSIVE = "expensive"


@dataclass(frozen=True)
class ToolSpec:
    """What a hosted tool declares about itself."""

    name: str
    description: str
    parameters: dict[str, Any]
    side_effect_free: bool
    cost_class: CostClass = CostClass.CHEAP
    timeout_s: float = 10.0
    partial_input: PartialInput | None = None
    program_scoped: bool = True
    state_slot: str | None = None
    starts_programs: bool = False

    @property
    def reads_state_only(self) -> bool:
        """A stateful tool whose calls read their program's state and change nothing."""
        return self.state_slot is not None and self.side_effect_free

    def openai_schema(self) -> dict[str, Any]:
        return openai_function_schema(self.name, self.description, self.parameters)


F = TypeVar("F", bound=Callable[..., Any])


def hosted_tool(
    *,
    description: str,
    parameters: dict[str, Any],
    side_effect_free: bool,
    name: str | None = None,
    cost_class: CostClass = CostClass.CHEAP,
    timeout_s: float = 10.0,
    partial_input: PartialInput | None = None,
    program_scoped: bool = True,
    state_slot: str | None = None,
    starts_programs: bool = False,
) -> Callable[[F], F]:
    """Declares a function a hosted tool. `program_scoped`: its result depends on
    the calling program's state, so cached results are shared only within that
    program (else within the tenant). `state_slot`: the tool keeps per-program
    state under this name, shared by every tool of the slot; it is called with a
    `state` keyword (`toolworkers.tool_state.ToolState`) and runs one call of the
    program at a time, unless it is also `side_effect_free`: then it only reads the
    state, whatever it leaves is dropped, and its calls run on a snapshot, cached
    per state version. `partial_input`: the tool can start on part of its
    arguments while the call is still being decoded
    (`toolworkers.partial_input`). `starts_programs`: the tool runs programs
    (`execve`, inside the same confinement); refused to every other tool."""

    def declare(function: F) -> F:
        spec = ToolSpec(
            name=name or function.__name__,
            description=description,
            parameters=parameters,
            side_effect_free=side_effect_free,
            cost_class=cost_class,
            timeout_s=timeout_s,
            partial_input=partial_input,
            program_scoped=program_scoped,
            state_slot=state_slot,
            starts_programs=starts_programs,
        )
        setattr(function, _SPEC_ATTRIBUTE, spec)
        return function

    return declare


class ToolSet:
    """Hosted tools configured under one reference (`package.module:set`); each is
    also reachable as `package.module:set.attribute`, which the sandbox imports."""

    def __init__(self, tools: dict[str, Callable[..., Any]]):
        self.attributes = list(tools)
        for attribute, function in tools.items():
            setattr(self, attribute, function)


def resolve_reference(reference: str) -> Any:
    """`package.module:attribute[.attribute...]` to the object it names."""
    module_name, separator, attribute = reference.partition(":")
    if not separator or not module_name or not attribute:
        raise RegistryError(f"{reference!r} is not of the form 'package.module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise RegistryError(f"cannot import {module_name!r} for {reference!r}: {error}") from error
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise RegistryError(f"{module_name!r} has no {attribute!r}") from None
    return target


def resolve_function(reference: str) -> Callable[..., Any]:
    """`package.module:attribute` to the callable it names."""
    target = resolve_reference(reference)
    if not callable(target):
        raise RegistryError(f"{reference!r} is not callable")
    return target  # type: ignore[no-any-return]


def _declared_functions(reference: str) -> list[tuple[str, Callable[..., Any]]]:
    """(reference, function) of a configured tool, or of every tool of a tool set."""
    target = resolve_reference(reference)
    if isinstance(target, ToolSet):
        return [(f"{reference}.{name}", getattr(target, name)) for name in target.attributes]
    if not callable(target):
        raise RegistryError(f"{reference!r} is neither a function nor a ToolSet")
    return [(reference, target)]


def declared_spec(function: Callable[..., Any], reference: str) -> ToolSpec:
    spec = getattr(function, _SPEC_ATTRIBUTE, None)
    if not isinstance(spec, ToolSpec):
        raise RegistryError(f"{reference!r} is not declared with @hosted_tool")
    return spec


@dataclass(frozen=True)
class HostedTool:
    """A registered tool: its spec, the reference the sandbox imports, and the
    keyword options bound to every call (e.g. a data directory)."""

    spec: ToolSpec
    function_reference: str
    options: dict[str, Any]
    keep_alive_s: float


class ToolRegistry:
    """The hosted tools of one deployment, by name."""

    def __init__(self, tools: Iterable[HostedTool]):
        self._tools: dict[str, HostedTool] = {}
        for tool in tools:
            if tool.spec.name in self._tools:
                raise RegistryError(f"two hosted tools are named {tool.spec.name!r}")
            self._tools[tool.spec.name] = tool

    @classmethod
    def from_config(cls, config: ToolsConfig) -> ToolRegistry:
        tools = []
        for entry in config.hosted:
            functions = _declared_functions(entry.function)
            if entry.name is not None and len(functions) != 1:
                raise RegistryError(f"{entry.function!r} is a tool set: it cannot take a `name`")
            for reference, function in functions:
                spec = declared_spec(function, reference)
                spec = replace(
                    spec,
                    name=entry.name or spec.name,
                    timeout_s=entry.timeout_s or spec.timeout_s,
                    side_effect_free=(
                        spec.side_effect_free
                        if entry.side_effect_free is None
                        else entry.side_effect_free
                    ),
                )
                keep_alive = entry.keep_alive_s or config.cache.keep_alive_s
                tools.append(HostedTool(spec, reference, dict(entry.options), keep_alive))
        return cls(tools)

    def get(self, name: str) -> HostedTool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def speculable(self, name: str) -> bool:
        """May this tool run before the model (or client) asks for it?"""
        tool = self._tools.get(name)
        return tool is not None and tool.spec.side_effect_free

    def state_slots(self) -> list[str]:
        """Slots the stateful tools keep per-program state in."""
        return sorted(
            {tool.spec.state_slot for tool in self._tools.values() if tool.spec.state_slot}
        )

    def openai_schemas(self) -> list[dict[str, Any]]:
        return [tool.spec.openai_schema() for tool in self._tools.values()]
