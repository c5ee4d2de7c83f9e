"""The response cache: which requests it answers and under which key (pure), which
replies it keeps, and its store against a real Redis."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from cluster.openai_protocol import SSE_DONE, sse_event, sse_payloads
from cluster.store.response_cache import ResponseCache, StoredReply
from deployments.api.response_cache import (
    SEED_BITS,
    ResponseCachePolicy,
    StreamRecorder,
    keepable_body,
    served_body,
    served_stream,
)

REQUEST: dict[str, Any] = {
    "model": "smollm2-135m",
    "messages": [{"role": "user", "content": "Weather in Oslo?"}],
    "temperature": 0,
    "max_tokens": 16,
}
POLICY = ResponseCachePolicy("deployment-a")


@pytest.fixture()
def cache_url(redis_url: str) -> Iterator[str]:
    """A database of its own: the bound test evicts by the cache's one index."""
    url = f"{redis_url.rpartition('/')[0]}/11"
    redis.Redis.from_url(url).flushdb()
    yield url
    redis.Redis.from_url(url).flushdb()


def key(body: dict[str, Any], tenant: str = "t", session: str | None = None) -> str:
    cacheable = POLICY.cacheable(body, True, tenant, session)
    assert cacheable is not None
    return cacheable.digest


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@given(st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=6))
def test_the_key_does_not_depend_on_the_order_of_fields(extra: dict[str, Any]) -> None:
    body = {**extra, **REQUEST}
    reordered = dict(reversed(list(body.items())))
    assert key(body) == key(reordered)


def test_only_requests_whose_reply_the_request_determines_are_cacheable() -> None:
    sampled = {**REQUEST, "temperature": 0.7}
    assert POLICY.cacheable(sampled, True, "t", None) is None
    assert (
        POLICY.cacheable({k: v for k, v in REQUEST.items() if k != "temperature"}, True, "t", None)
        is None
    )
    seeded = POLICY.cacheable({**sampled, "seed": 7}, True, "t", None)
    assert seeded is not None and seeded.derived_seed is None
    greedy = POLICY.cacheable(REQUEST, True, "t", None)
    assert greedy is not None and greedy.derived_seed is None
    assert POLICY.cacheable({**REQUEST, "temperature": False}, True, "t", None) is None


def test_a_sampled_request_is_seeded_from_its_own_digest_only_when_the_deployment_says() -> None:
    sampled = {**REQUEST, "temperature": 0.7}
    seeding = ResponseCachePolicy("deployment-a", seed_sampled_requests=True)
    first = seeding.cacheable(sampled, True, "t", None)
    again = seeding.cacheable(dict(sampled), True, "t", None)
    other = seeding.cacheable({**sampled, "max_tokens": 17}, True, "t", None)
    assert first is not None and again is not None and other is not None
    assert first.derived_seed is not None and 0 <= first.derived_seed < 1 << SEED_BITS
    assert first == again
    assert other.digest != first.digest


def test_what_changes_the_reply_changes_the_key_and_who_asks_scopes_it() -> None:
    base = key(REQUEST)
    changed = [
        key({**REQUEST, "max_tokens": 17}),
        key({**REQUEST, "model": "smollm2-135m-draft"}),
        key({**REQUEST, "messages": [{"role": "user", "content": "Weather in Rome?"}]}),
        key({**REQUEST, "tools": [{"type": "function", "function": {"name": "f"}}]}),
        key({**REQUEST, "stream": True}),
        key(REQUEST, tenant="other"),
        key(REQUEST, session="s1"),
        ResponseCachePolicy("deployment-b").cacheable(REQUEST, True, "t", None).digest,  # type: ignore[union-attr]
        POLICY.cacheable(REQUEST, False, "t", None).digest,  # type: ignore[union-attr]
        POLICY.cacheable(REQUEST, True, "t", None, None, False).digest,  # type: ignore[union-attr]
        POLICY.cacheable(REQUEST, True, "t", None, None, True).digest,  # type: ignore[union-attr]
    ]
    assert base not in changed and len(set(changed)) == len(changed)
    assert key(REQUEST, session="s1") != key(REQUEST, session="s2")
    unchanged = {**REQUEST, "user": "u", "request_id": "r", "cache_salt": "x", "priority": 3}
    assert key(unchanged) == base


def test_cache_control_asks_for_a_fresh_reply_or_that_nothing_be_kept() -> None:
    def directives(header: str | None) -> tuple[bool, bool]:
        cacheable = POLICY.cacheable(REQUEST, True, "t", None, header)
        assert cacheable is not None and cacheable.digest == key(REQUEST)
        return cacheable.serve_kept, cacheable.keep

    assert directives(None) == (True, True)
    assert directives("No-Cache") == (False, True)
    assert directives("no-store") == (True, False)
    assert directives("max-age=0, no-cache , no-store") == (False, False)


def reply(finish_reason: str | None = "stop", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "created": 1,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": finish_reason,
            }
        ],
        **extra,
    }


def test_only_whole_replies_the_engine_alone_made_are_kept() -> None:
    assert keepable_body(reply(), execute_tools=True)
    assert keepable_body(reply("length"), execute_tools=True)
    assert not keepable_body(reply("abort"), execute_tools=False)
    assert not keepable_body(reply(None), execute_tools=False)
    ran = reply(toolserve={"executed_messages": [{"role": "tool"}]})
    assert not keepable_body(ran, execute_tools=True)
    assert not keepable_body({"error": {"message": "x"}}, execute_tools=False)
    assert not keepable_body({"choices": []}, execute_tools=False)


def test_a_reply_ending_in_calls_is_kept_only_when_the_server_runs_no_tools() -> None:
    """With tools on, the next time the tool cache may hold the call's result (the
    client posted it, a speculation ran it) and the server would continue."""
    assert keepable_body(reply("tool_calls"), execute_tools=False)
    assert not keepable_body(reply("tool_calls"), execute_tools=True)
    recorder = StreamRecorder()
    recorder.feed(chunk("", "tool_calls") + SSE_DONE)
    assert recorder.whole(execute_tools=False) is not None
    assert recorder.whole(execute_tools=True) is None


def chunk(content: str, finish_reason: str | None = None, **extra: Any) -> str:
    return sse_event(
        {
            "id": "chatcmpl-1",
            "created": 1,
            "choices": [
                {"index": 0, "delta": {"content": content}, "finish_reason": finish_reason}
            ],
            **extra,
        }
    )


def test_a_stream_is_kept_only_when_whole() -> None:
    whole = StreamRecorder()
    for sse in (chunk("he"), chunk("llo"), chunk("", "stop") + SSE_DONE):
        whole.feed(sse)
    kept = whole.whole(True)
    assert kept is not None and [c["choices"][0]["delta"]["content"] for c in kept] == [
        "he",
        "llo",
        "",
    ]

    cut = StreamRecorder()
    cut.feed(chunk("he"))
    assert cut.whole(True) is None  # no [DONE]
    unfinished = StreamRecorder()
    unfinished.feed(chunk("he") + SSE_DONE)
    assert unfinished.whole(True) is None
    failed = StreamRecorder()
    failed.feed(chunk("he"))
    failed.feed(sse_event({"error": {"message": "lost"}}) + SSE_DONE)
    assert failed.whole(True) is None
    ran_tools = StreamRecorder()
    ran_tools.feed(chunk("", toolserve={"executed_messages": []}))
    ran_tools.feed(chunk("", "stop") + SSE_DONE)
    assert ran_tools.whole(True) is None


def test_a_kept_reply_is_served_as_the_new_requests_response() -> None:
    stored = reply()
    body = served_body(stored, "chatcmpl-new", 99)
    assert (body["id"], body["created"]) == ("chatcmpl-new", 99)
    assert stored["id"] == "chatcmpl-1"
    events = "".join(served_stream((json.loads(chunk("hi")[6:]),), "chatcmpl-new", 99))
    assert [(p["id"], p["created"]) for p in sse_payloads(events)] == [("chatcmpl-new", 99)]
    assert events.endswith(SSE_DONE)


def test_the_store_answers_the_same_request_and_guards_against_a_collision(
    cache_url: str,
) -> None:
    digest = f"test-{uuid.uuid4().hex}"

    async def scenario() -> list[StoredReply | None]:
        cache = ResponseCache(cache_url, max_entries=10_000, ttl_s=60, max_entry_bytes=1 << 20)
        seen = [await cache.lookup(digest, 10)]
        assert await cache.store(digest, StoredReply(10, False, reply()))
        seen += [await cache.lookup(digest, 10), await cache.lookup(digest, 11)]
        await cache.close()
        return seen

    missing, found, collided = asyncio.run(scenario())
    assert missing is None and collided is None
    assert found == StoredReply(10, False, reply())


def test_a_stream_round_trips_through_the_store(cache_url: str) -> None:
    digest = f"test-{uuid.uuid4().hex}"
    chunks = tuple(json.loads(sse[6:]) for sse in (chunk("a"), chunk("b", "stop")))

    async def scenario() -> StoredReply | None:
        cache = ResponseCache(cache_url, max_entries=10_000, ttl_s=60, max_entry_bytes=1 << 20)
        await cache.store(digest, StoredReply(5, True, None, chunks))
        found = await cache.lookup(digest, 5)
        await cache.close()
        return found

    assert asyncio.run(scenario()) == StoredReply(5, True, None, chunks)


def test_the_least_recently_used_reply_goes_first_past_the_bound(cache_url: str) -> None:
    digests = [f"test-{uuid.uuid4().hex}" for _ in range(3)]

    async def scenario() -> list[bool]:
        cache = ResponseCache(cache_url, max_entries=2, ttl_s=60, max_entry_bytes=1 << 20)
        await cache.store(digests[0], StoredReply(1, False, reply()))
        await asyncio.sleep(0.01)
        await cache.store(digests[1], StoredReply(1, False, reply()))
        await asyncio.sleep(0.01)
        await cache.lookup(digests[0], 1)  # the first is used again: the second is oldest
        await asyncio.sleep(0.01)
        await cache.store(digests[2], StoredReply(1, False, reply()))
        present = [await cache.lookup(digest, 1) is not None for digest in digests]
        await cache.close()
        return present

    assert asyncio.run(scenario()) == [True, False, True]


def test_an_oversized_reply_is_not_kept(cache_url: str) -> None:
    digest = f"test-{uuid.uuid4().hex}"
    large = reply(padding="x" * 2048)

    async def scenario() -> tuple[bool, StoredReply | None]:
        cache = ResponseCache(cache_url, max_entries=10_000, ttl_s=60, max_entry_bytes=1024)
        kept = await cache.store(digest, StoredReply(1, False, large))
        found = await cache.lookup(digest, 1)
        await cache.close()
        return kept, found

    assert asyncio.run(scenario()) == (False, None)


def test_without_redis_nothing_is_found_or_kept() -> None:
    async def scenario() -> tuple[StoredReply | None, bool]:
        cache = ResponseCache("redis://127.0.0.1:1/0", 10, 60, 1 << 20)
        found = await cache.lookup("d", 1)
        kept = await cache.store("d", StoredReply(1, False, reply()))
        await cache.close()
        return found, kept

    assert asyncio.run(scenario()) == (None, False)
