"""BFCL's multi-turn backends (the `bfcl-eval` package) as hosted tools.

Each backend class is a tool set, `toolworkers.bfcl_tools:<Class>` (e.g.
`GorillaFileSystem`, `TradingBot`), whose tools are the class's documented
functions with BFCL's own descriptions and parameter schemas. A program's
backend object is its state slot (named after the class): the first call builds
it from the slot's scenario (BFCL's `initial_config` entry for the class, set
with `PUT /v1/sessions/{program}/tool-state/{Class}`), later calls find it as
the previous call left it. A call runs the named function with the model's JSON
arguments as keywords; BFCL's own checker `eval`s a Python expression instead.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
from functools import cache
from importlib import resources
from typing import Any

from toolworkers.builtin_tools import ToolError
from toolworkers.registry import ToolSet, hosted_tool
from toolworkers.tool_state import ToolState

# The multi-turn classes whose backends run in-process; BFCL's web search needs
# the network and its memory backends need packages bfcl-eval does not install.
BACKEND_CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)
MAX_RESULT_CHARS = 2000


def backend_modules() -> dict[str, str]:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return dict(CLASS_FILE_PATH_MAPPING)


def data_file(relative: str) -> str:
    return resources.files("bfcl_eval").joinpath("data", relative).read_text()


@cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's documentation of the class's functions: name, description, parameters."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    text = data_file(f"multi_turn_func_doc/{MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]}")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


@cache
def _gorilla_to_json_schema_types() -> dict[str, str]:
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    return dict(GORILLA_TO_OPENAPI)


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """A BFCL parameter description (Gorilla types) as JSON Schema."""
    type_map = _gorilla_to_json_schema_types()
    schema: dict[str, Any] = {}
    if "type" in node:
        schema["type"] = type_map.get(node["type"], "string")
    for key in ("description", "enum", "required", "default"):
        if key in node:
            schema[key] = node[key]
    if "items" in node:
        schema["items"] = to_json_schema(node["items"])
    if "properties" in node:
        schema["properties"] = {
            name: to_json_schema(child) for name, child in node["properties"].items()
        }
    return schema


def short_description(text: str) -> str:
    # BFCL prefixes every function with its class's paragraph; the part after
    # "Tool description:" is what distinguishes the function.
    return text.split("Tool description:", 1)[-1].strip()


def new_backend(class_name: str, scenario: dict[str, Any] | None) -> Any:
    """A fresh backend object, loaded with the scenario (BFCL's default state if None)."""
    backend = getattr(importlib.import_module(backend_modules()[class_name]), class_name)()
    if hasattr(backend, "_load_scenario"):
        backend._load_scenario(copy.deepcopy(scenario or {}))
    return backend


def run_backend_function(backend: Any, name: str, arguments: dict[str, Any]) -> str:
    """Calls a documented function; an exception inside the backend is reported to
    the model as BFCL reports it (an `error` result), arguments that do not fit
    the function are a tool error."""
    function = getattr(backend, name)
    try:
        inspect.signature(function).bind(**arguments)
    except TypeError as error:
        raise ToolError(f"bad arguments for {name}: {error}") from error
    try:
        result = function(**arguments)
    except Exception as error:
        result = {"error": f"{type(error).__name__}: {error}"}
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    return text[:MAX_RESULT_CHARS]


def _backend_tool(class_name: str, doc: dict[str, Any]) -> Any:
    function_name = doc["name"]

    @hosted_tool(
        name=function_name,
        description=short_description(doc["description"]),
        parameters=to_json_schema(doc["parameters"]),
        side_effect_free=False,
        state_slot=class_name,
    )
    def call(*, state: ToolState, **arguments: Any) -> str:
        if state.value is None:
            state.value = new_backend(class_name, state.scenario)
        return run_backend_function(state.value, function_name, arguments)

    call.__qualname__ = call.__name__ = f"{class_name}.{function_name}"
    return call


@cache
def tool_set(class_name: str) -> ToolSet:
    if class_name not in BACKEND_CLASSES:
        raise AttributeError(f"no BFCL backend class {class_name!r}; known: {BACKEND_CLASSES}")
    return ToolSet(
        {doc["name"]: _backend_tool(class_name, doc) for doc in function_docs(class_name)}
    )


def __getattr__(name: str) -> ToolSet:
    """`toolworkers.bfcl_tools:<Class>` names the class's tool set, built on first use."""
    if name.startswith("__"):
        raise AttributeError(name)
    return tool_set(name)
