"""Canonical tool-call keys: how arguments are written never changes the key,
what they say always does."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolworkers.cache_keys import (
    ArgumentsError,
    CacheScope,
    ToolCallKey,
    canonical_arguments,
    parse_arguments,
)

SCOPE = CacheScope("tenant-a", "program-1")

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
arguments_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


def shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [shuffled(item, rng) for item in value]
    return value


def loosely_formatted(value: Any, rng: random.Random) -> str:
    """The same JSON with another key order, indentation and separators, and
    integers sometimes written as floats."""

    def floats_for_ints(node: Any) -> Any:
        if isinstance(node, bool):
            return node
        if isinstance(node, int) and abs(node) < 2**53 and rng.random() < 0.5:
            return float(node)
        if isinstance(node, dict):
            return {key: floats_for_ints(item) for key, item in node.items()}
        if isinstance(node, list):
            return [floats_for_ints(item) for item in node]
        return node

    return json.dumps(
        floats_for_ints(shuffled(value, rng)),
        indent=rng.choice([None, 1, 4]),
        separators=rng.choice([(",", ":"), (", ", ": "), (" ,", " : ")]),
        ensure_ascii=rng.random() < 0.5,
    )


@given(arguments_objects, st.integers(min_value=0, max_value=2**32))
def test_formatting_and_key_order_do_not_change_the_key(
    arguments: dict[str, Any], seed: int
) -> None:
    rng = random.Random(seed)
    rewritten = loosely_formatted(arguments, rng)
    assert ToolCallKey.of(SCOPE, "search", rewritten) == ToolCallKey.of(SCOPE, "search", arguments)
    assert str(ToolCallKey.of(SCOPE, "search", rewritten)) == str(
        ToolCallKey.of(SCOPE, "search", arguments)
    )


@given(arguments_objects, st.text(min_size=1, max_size=8), json_scalars)
def test_a_different_value_changes_the_key(
    arguments: dict[str, Any], name: str, value: Any
) -> None:
    changed = dict(arguments)
    changed[name] = [value, "changed"]
    assert str(ToolCallKey.of(SCOPE, "search", changed)) != str(
        ToolCallKey.of(SCOPE, "search", arguments)
    )


@given(arguments_objects)
def test_tool_and_scope_are_part_of_the_key(arguments: dict[str, Any]) -> None:
    key = str(ToolCallKey.of(SCOPE, "search", arguments))
    assert key != str(ToolCallKey.of(SCOPE, "lookup", arguments))
    assert key != str(ToolCallKey.of(CacheScope("tenant-b", "program-1"), "search", arguments))
    assert key != str(ToolCallKey.of(CacheScope("tenant-a", "program-2"), "search", arguments))
    assert key != str(ToolCallKey.of(CacheScope("tenant-a", None), "search", arguments))


def test_numbers_are_normalized() -> None:
    assert canonical_arguments('{"n": 1.0, "m": 1e2}') == canonical_arguments({"m": 100, "n": 1})
    assert canonical_arguments({"n": 0.5}) != canonical_arguments({"n": 1})
    assert canonical_arguments({"n": 1.5}) == '{"n":1.5}'
    assert canonical_arguments({"flag": True}) != canonical_arguments({"flag": 1})


def test_whitespace_inside_strings_is_content() -> None:
    assert canonical_arguments({"q": "a  b"}) != canonical_arguments({"q": "a b"})


def test_scopes_cannot_collide_through_separators() -> None:
    assert CacheScope("a/b", "c").prefix() != CacheScope("a", "b/c").prefix()


@pytest.mark.parametrize("arguments", [None, "", "{}", {}])
def test_no_arguments_is_an_empty_object(arguments: str | dict[str, Any] | None) -> None:
    assert parse_arguments(arguments) == {}


@pytest.mark.parametrize("arguments", ["[1, 2]", '"text"', "{not json", '{"n": NaN}'])
def test_arguments_that_are_not_a_json_object_are_refused(arguments: str) -> None:
    with pytest.raises(ArgumentsError):
        canonical_arguments(arguments)
