"""Request limits, without a cluster."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from deployments.api.parsing import parse_chat_body, program_id_for
from deployments.api.request_limits import capped_body, check_session_id, decode_json
from deployments.errors import RequestRejected

MODELS = ["smollm2-135m"]


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _read(parts: list[bytes], declared: str | None, limit: int) -> bytes:
    return asyncio.run(capped_body(_chunks(*parts), declared, limit))


def _status(error: pytest.ExceptionInfo[RequestRejected]) -> tuple[int, str]:
    return error.value.error.status, error.value.error.code


def test_a_body_within_the_limit_is_read_whole() -> None:
    assert _read([b"ab", b"cd"], "4", 4) == b"abcd"
    assert _read([b"ab", b"cd"], None, 4) == b"abcd"


def test_a_body_past_the_limit_is_refused_from_its_length_or_as_it_streams() -> None:
    with pytest.raises(RequestRejected) as declared:
        _read([], str(10 * 1024 * 1024), 1024)
    assert _status(declared) == (413, "request_too_large")
    with pytest.raises(RequestRejected) as streamed:
        _read([b"x" * 600, b"x" * 600], None, 1024)  # no length, or a false one
    assert _status(streamed) == (413, "request_too_large")


def test_json_is_strict_and_deep_nesting_is_a_value_error() -> None:
    assert decode_json(b'{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        with pytest.raises(ValueError, match="not valid JSON"):
            decode_json(b'{"temperature": ' + constant + b"}")
    for overflowing in (b"1e309", b"-2.5e400"):
        with pytest.raises(ValueError, match="out of a double's range"):
            decode_json(b'{"keep_alive": ' + overflowing + b"}")
    assert decode_json(b'{"keep_alive": 1.7e308}') == {"keep_alive": 1.7e308}
    with pytest.raises(ValueError, match="nested too deeply"):
        decode_json(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(ValueError):
        decode_json(b'{"a": "\xff"}')


def test_a_lone_surrogate_escape_is_refused_and_a_paired_one_decoded() -> None:
    assert decode_json(rb'{"a": "\ud83d\ude00"}') == {"a": "\U0001f600"}
    assert decode_json(rb'{"a": "\\ud800"}') == {"a": "\\ud800"}  # an escaped backslash
    for lone in (rb'{"a": "x\ud800"}', rb'{"\udc00": 1}', rb'[[{"a": ["\uDBFFz"]}]]'):
        with pytest.raises(ValueError, match="surrogate"):
            decode_json(lone)


def _chat(**fields: object) -> bytes:
    return json.dumps(
        {"model": MODELS[0], "messages": [{"role": "user", "content": "hi"}]} | fields
    ).encode()


def test_chat_bodies_with_nan_deep_nesting_or_too_many_messages_are_400() -> None:
    for raw in (
        _chat(temperature=0.5).replace(b"0.5", b"NaN"),
        b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        json.dumps({"messages": [{"role": "user", "content": "x"}] * 5}).encode(),
    ):
        with pytest.raises(RequestRejected) as rejected:
            parse_chat_body(raw, MODELS, max_messages=4)
        assert rejected.value.error.status == 400, rejected.value.error


def test_session_ids_are_bounded_ascii_and_printable() -> None:
    check_session_id("agent-7/run 3 ~", 256)
    for bad in ("x" * 257, "agent\n7", "agent\x007", "agent\x7f", "run 3 ✓", "é"):
        with pytest.raises(RequestRejected) as rejected:
            check_session_id(bad, 256)
        assert rejected.value.error.param == "session_id"
    with pytest.raises(RequestRejected):
        program_id_for(None, {"session_id": "y" * 10_000})
    assert program_id_for("agent-7", {}) == "agent-7"
