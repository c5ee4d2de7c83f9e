"""BFCL's multi-turn backends (the `bfcl-eval` package) as hosted tools.

Each backend class is a tool set, `toolworkers.bfcl_tools:<Class>` (e.g.
`GorillaFileSystem`, `TradingBot`), whose tools are the class's documented
functions with BFCL's own descriptions and parameter schemas. A program's
backend object is its state slot (named after the class): the first call builds
it from the slot's scenario (BFCL's `initial_config` entry for the class, set
with `PUT /v1/sessions/{program}/tool-state/{Class}`), later calls find it as
the previous call left it. A call runs the named function with the model's JSON
arguments as keywords; BFCL's own checker `eval`s a Python expression instead.
The functions that only read their backend (`READER_FUNCTIONS`) are declared
side-effect-free: they run on a snapshot of the state and may be speculated.
Option `latency_s`: seconds each call waits before it runs (the backends answer
at once; the services they stand for do not).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import time
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

# Functions that read their backend and change nothing: side-effect-free, so they
# may be speculated and cached per state version. BFCL does not declare this; the
# list is checked against every call of BFCL's multi-turn ground truth (the state
# after such a call pickles as before, and a copy of the state gives the same
# result). `get_flight_cost` and `get_outside_temperature_from_google` are
# absent on purpose: BFCL's backends change their state in them.
READER_FUNCTIONS: dict[str, frozenset[str]] = {
    class_name: frozenset(names.split())
    for class_name, names in {
        "GorillaFileSystem": "cat diff du find grep ls pwd sort tail wc",
        "MathAPI": "absolute_value add divide imperial_si_conversion logarithm max_value mean "
        "min_value multiply percentage power round_number si_unit_conversion square_root "
        "standard_deviation subtract sum_values",
        "MessageAPI": "get_message_stats get_user_id list_users message_get_login_status "
        "search_messages view_messages_sent",
        "TwitterAPI": "get_tweet get_tweet_comments get_user_stats get_user_tweets "
        "list_all_following posting_get_login_status search_tweets",
        "TicketAPI": "get_ticket get_user_tickets ticket_get_login_status",
        "TradingBot": "filter_stocks_by_price get_account_info get_available_stocks "
        "get_current_time get_order_details get_order_history get_stock_info get_symbol_by_name "
        "get_transaction_history get_watchlist trading_get_login_status",
        "TravelAPI": "compute_exchange_rate get_all_credit_cards get_booking_history "
        "get_budget_fiscal_year get_credit_card_balance get_nearest_airport_by_city "
        "list_all_airports retrieve_invoice travel_get_login_status verify_traveler_information",
        "VehicleControlAPI": "check_tire_pressure displayCarStatus display_log estimate_distance "
        "estimate_drive_feasibility_by_mileage find_nearest_tire_shop gallon_to_liter "
        "get_current_speed get_outside_temperature_from_weather_com get_zipcode_based_on_city "
        "liter_to_gallon",
    }.items()
}


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
        side_effect_free=function_name in READER_FUNCTIONS[class_name],
        state_slot=class_name,
    )
    def call(*, state: ToolState, latency_s: float = 0.0, **arguments: Any) -> str:
        time.sleep(latency_s)
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
