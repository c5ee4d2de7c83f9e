"""Turn options, the `/cache-tool-output` body and the tool-state
body, without a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deployments.api.tool_api import (
    PostedToolOutput,
    TurnOptions,
    parse_tool_outputs,
    parse_tool_state,
    pop_turn_options,
)
from deployments.errors import ApiError, RequestRejected


def test_turn_options_are_removed_from_the_body() -> None:
    body: dict[str, Any] = {"messages": [], "toolserve": {"execute_tools": False}}
    assert pop_turn_options(body) == TurnOptions(execute_tools=False)
    assert "toolserve" not in body
    assert pop_turn_options({"messages": []}) == TurnOptions(execute_tools=True)


@pytest.mark.parametrize(
    "options", [{"execute_tool": False}, {"execute_tools": "maybe"}, "off", [1]]
)
def test_bad_turn_options_are_a_400(options: Any) -> None:
    with pytest.raises(RequestRejected) as raised:
        pop_turn_options({"toolserve": options})
    assert raised.value.error.status == 400
    assert raised.value.error.param == "toolserve"


def test_tool_outputs_parse() -> None:
    raw = json.dumps(
        [
            {"name": "get_weather", "params": {"city": "Paris"}, "output": "sunny"},
            {"name": "now", "output": {"hour": 3}, "keep_alive": 5},
        ]
    ).encode()
    first, second = parse_tool_outputs(raw)
    assert first == PostedToolOutput(name="get_weather", params={"city": "Paris"}, output="sunny")
    assert second.params is None and second.keep_alive == 5
    assert second.output_text() == '{"hour": 3}'
    assert parse_tool_outputs(b"[]") == []


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"name": "f", "output": "x"}', "JSON array"),
        (b'[{"output": "x"}]', "[0].name"),
        (b'[{"name": "f"}]', "[0].output"),
        (b'[{"name": "", "output": "x"}]', "[0].name"),
        (b'[{"name": "f", "output": "x", "params": [1]}]', "[0].params"),
        (b'[{"name": "f", "output": "x", "keep_alive": -1}]', "[0].keep_alive"),
        (b'[{"name": "f", "output": "x", "extra": 1}]', "[0].extra"),
        (b'[{"name": "f", "output": "x"}, 3]', "[1]"),
    ],
)
def test_malformed_tool_outputs_are_a_422(raw: bytes, fragment: str) -> None:
    with pytest.raises(RequestRejected) as raised:
        parse_tool_outputs(raw)
    error: ApiError = raised.value.error
    assert error.status == 422
    assert fragment in error.message
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_a_tool_state_is_a_json_object_for_a_known_slot() -> None:
    scenario = {"root": {"alice": {"type": "directory", "contents": {}}}}
    raw = json.dumps(scenario).encode()
    assert parse_tool_state(raw, "GorillaFileSystem", ["GorillaFileSystem"]) == scenario
    with pytest.raises(RequestRejected) as unknown:
        parse_tool_state(raw, "Nope", ["GorillaFileSystem", "TradingBot"])
    assert unknown.value.error.status == 404
    assert "GorillaFileSystem, TradingBot" in unknown.value.error.message
    for body in (b"[]", b'"text"', b"{", b"\xff"):
        with pytest.raises(RequestRejected) as malformed:
            parse_tool_state(body, "GorillaFileSystem", ["GorillaFileSystem"])
        assert malformed.value.error.status == 422
