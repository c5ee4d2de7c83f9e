"""Limits on what a request may carry, checked before any of it is parsed or
rendered: body size, JSON that Python's decoder accepts but JSON does not
(NaN, Infinity) or that nests too deep, message count and session ids."""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from deployments.errors import ApiError, RequestRejected, invalid_request


@dataclass(frozen=True)
class RequestLimits:
    """The `server` configuration's request limits (plain data: it crosses Ray)."""

    max_request_bytes: int
    max_messages: int
    max_session_id_chars: int


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body exceeds {limit} bytes", "request_too_large")


async def capped_body(
    chunks: AsyncIterator[bytes], declared_length: str | None, limit: int
) -> bytes:
    """The whole body, refused (413) as soon as it is known to exceed `limit`:
    from its declared length, else while it streams in."""
    if declared_length is not None and declared_length.isdigit() and int(declared_length) > limit:
        raise RequestRejected(too_large(limit))
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            raise RequestRejected(too_large(limit))
    return bytes(body)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of a double's range")
    return value


# A `\uD800`-`\uDFFF` escape: half of a UTF-16 surrogate pair. Python's decoder
# pairs them up; one left alone is a string no UTF-8 encoder (tokenizer, Redis,
# logs) can take.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _lone_surrogate_in(value: Any) -> bool:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def decode_json(raw: bytes) -> Any:
    """Strict JSON: no NaN or Infinity (nor a number too large for a double), no
    unpaired surrogate escape; nesting
    deeper than Python's recursion limit is an invalid request, not a server
    error. Raises ValueError."""
    try:
        decoded = json.loads(raw, parse_constant=_not_json, parse_float=_finite_float)
    except RecursionError as error:
        raise ValueError("JSON nested too deeply") from error
    if _SURROGATE_ESCAPE.search(raw) and _lone_surrogate_in(decoded):
        raise ValueError("a string holds an unpaired UTF-16 surrogate escape")
    return decoded


def check_message_count(messages: list[Any], limit: int) -> None:
    if len(messages) > limit:
        raise RequestRejected(
            invalid_request(f"messages has {len(messages)} entries; at most {limit}", "messages")
        )


def check_session_id(program_id: str, limit: int) -> None:
    """A session id names keys and log lines and is echoed in a header: bounded,
    ASCII, without control characters."""
    if len(program_id) > limit:
        raise RequestRejected(
            invalid_request(
                f"session id is {len(program_id)} characters; at most {limit}", "session_id"
            )
        )
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in program_id):
        raise RequestRejected(
            invalid_request("session id contains control characters", "session_id")
        )
    if not program_id.isascii():
        # The reply echoes it in the X-Session-ID header, which is ASCII.
        raise RequestRejected(
            invalid_request("session id must be ASCII (it is echoed in a header)", "session_id")
        )
