"""Pure: which chat requests the response cache answers and under which key,
which replies it may keep, and a kept reply served again as a new response."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cluster.openai_protocol import EXTENSION_FIELD, SSE_DONE, sse_event, sse_payloads

IGNORED_FIELDS = frozenset(
    {"user", "session_id", "request_id", "metadata", "cache_salt", "priority"}
)
"""Request fields that do not change the reply: who asks (the key's scope names
the tenant and the session), the request's id, and scheduling."""
FINISHED = frozenset({"stop", "length", "tool_calls"})
"""Finish reasons of a whole reply (not one aborted or cut by an error)."""
ANSWERED = frozenset({"stop", "length"})
"""Finish reasons of a reply kept when the server may run tools for the request:
one that ends in calls is not kept, as the next time the server may continue
it with a result the tool cache has by then (posted by the client, speculated)."""
SEED_BITS = 31


@dataclass(frozen=True)
class CacheableRequest:
    """A request the cache may answer: the key of its reply, the length of the
    canonical request (the guard against a digest collision) and, for a sampled
    request without a seed, the seed derived from its prompt."""

    digest: str
    request_chars: int
    execute_tools: bool
    derived_seed: int | None = None
    serve_kept: bool = True
    """False: the client asked for a fresh reply (`Cache-Control: no-cache`)."""
    keep: bool = True
    """False: the client asked that its reply not be kept (`Cache-Control: no-store`)."""


class ResponseCachePolicy:
    """A request is cacheable when its reply is a function of the request: greedy
    (`temperature` 0) or seeded, or, with `seed_sampled_requests`, any request,
    which is then seeded from its own digest. Keys are scoped by the deployment
    (a redeployment, perhaps of other weights, starts empty), the tenant and the
    session: a session's repeats hit only within it; requests outside any
    session are shared by their tenant. The request's `Cache-Control` header may
    say `no-cache` (ask the engine, keep its reply) or `no-store` (keep nothing)."""

    def __init__(self, namespace: str, seed_sampled_requests: bool = False):
        self._namespace = namespace
        self._seed_sampled_requests = seed_sampled_requests

    def cacheable(
        self,
        body: dict[str, Any],
        execute_tools: bool,
        tenant: str,
        session: str | None,
        cache_control: str | None = None,
        stop_invalid_calls: bool | None = None,
    ) -> CacheableRequest | None:
        """`body`: the request as validated, without toolserve's options and hints;
        the options that change the reply come as arguments."""
        deterministic = greedy(body) or body.get("seed") is not None
        if not (deterministic or self._seed_sampled_requests):
            return None
        directives = {part.strip().lower() for part in (cache_control or "").split(",")}
        serve_kept, keep = "no-cache" not in directives, "no-store" not in directives
        request = {key: value for key, value in body.items() if key not in IGNORED_FIELDS}
        options: dict[str, Any] = {"execute_tools": execute_tools}
        if stop_invalid_calls is not None:
            options["stop_invalid_calls"] = stop_invalid_calls
        canonical = json.dumps(
            {"request": request} | options,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        scope = json.dumps([self._namespace, tenant, session or ""])
        digest = hashlib.sha256(f"{scope}\n{canonical}".encode()).hexdigest()
        derived_seed = None if deterministic else int(digest[:8], 16) % (1 << SEED_BITS)
        return CacheableRequest(
            digest, len(canonical), execute_tools, derived_seed, serve_kept, keep
        )


def greedy(body: dict[str, Any]) -> bool:
    temperature = body.get("temperature")
    return (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and (temperature == 0)
    )


def keepable_body(body: dict[str, Any], execute_tools: bool) -> bool:
    """A whole reply the engine alone made: no hosted tool ran for it (a tool may
    act on the world, and its next run may answer otherwise)."""
    choices = body.get("choices") or []
    finished = ANSWERED if execute_tools else FINISHED
    return (
        bool(choices)
        and "error" not in body
        and EXTENSION_FIELD not in body
        and all(choice.get("finish_reason") in finished for choice in choices)
    )


@dataclass
class StreamRecorder:
    """A relayed stream's chunk payloads, kept if the stream turns out whole
    (every choice finished, `[DONE]` sent, no error, no hosted tool ran)."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    _finished: dict[int, str | None] = field(default_factory=dict)
    _done: bool = False
    _spoiled: bool = False

    def feed(self, sse: str) -> None:
        if self._spoiled:
            return
        for payload in sse_payloads(sse):
            if "error" in payload or EXTENSION_FIELD in payload:
                self._spoiled = True
                return
            for choice in payload.get("choices") or []:
                reason = choice.get("finish_reason")
                if reason is not None or int(choice.get("index", 0)) not in self._finished:
                    self._finished[int(choice.get("index", 0))] = reason
            self.chunks.append(payload)
        if SSE_DONE.strip() in sse:
            self._done = True

    def whole(self, execute_tools: bool) -> tuple[dict[str, Any], ...] | None:
        """The chunks, if the stream is a reply `keepable_body` would keep."""
        if self._spoiled or not self._done or not self._finished:
            return None
        finished = ANSWERED if execute_tools else FINISHED
        if not all(reason in finished for reason in self._finished.values()):
            return None
        return tuple(self.chunks)


def served_body(stored: dict[str, Any], response_id: str, created: int) -> dict[str, Any]:
    """A stored reply as the response to a new request."""
    body = copy.deepcopy(stored)
    body["id"] = response_id
    body["created"] = created
    return body


def served_stream(
    chunks: tuple[dict[str, Any], ...], response_id: str, created: int
) -> Iterator[str]:
    """A stored stream's SSE events as the response to a new request."""
    for chunk in chunks:
        yield sse_event({**chunk, "id": response_id, "created": created})
    yield SSE_DONE
