"""`POST /v1/chat/completions`: a turn parsed, its program and tenant applied,
answered from the response cache or sent to a model (with the speculator's
predictions), its reply relayed (JSON or SSE) and its speculation settled."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cluster.openai_protocol import PARENT_PROGRAM_ARG, with_predicted_calls
from cluster.policies.program_clock import turn_bucket
from cluster.policies.tenancy import scoped_program_id
from cluster.store.response_cache import StoredReply
from cluster.store.responses import ResponseOwner
from deployments.api.keep_alive import with_keep_alive
from deployments.api.model_client import ReplyStream, reply_head
from deployments.api.parsing import (
    ONESHOT_PREFIX,
    SESSION_HEADER,
    ParsedChat,
    apply_agent_hints,
    mark_last_step,
    parse_chat_body,
    program_id_for,
)
from deployments.api.request_limits import check_session_id
from deployments.api.response_cache import (
    CacheableRequest,
    StreamRecorder,
    keepable_body,
    served_body,
    served_stream,
)
from deployments.api.routes import api_route, app, error_response
from deployments.api.speculator import SpeculationTurn
from deployments.api.state import IngressState
from deployments.api.tenants import cache_salt
from deployments.errors import RequestRejected, engine_not_ready, rate_limited
from deployments.turn import ReplyHead, ReplyTail, TurnContext, is_last_step
from toolworkers.predictor import ObservedCall
from toolworkers.speculation import observed_calls, reply_calls

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

logger = logging.getLogger("toolserve.ingress")

REPLICA_HEADER = "X-Toolserve-Replica"
CACHE_HEADER = "X-Toolserve-Cache"
PREFIX_HEADER = "X-Toolserve-Prefix"


def prefix_header(check: dict[str, Any]) -> str:
    """A turn's prefix check as its response header says it: `held; tokens=N`, or
    `broken` / `repaired` with the cause, the first divergent position and the
    held tokens computed again."""
    position = check["first_divergent_position"]
    if position is None:
        return f"held; tokens={check['held_tokens']}"
    state = "repaired" if check["repaired"] else "broken"
    return (
        f"{state}; cause={check['cause']}; position={position}; "
        f"recomputed={check['tokens_recomputed']}"
    )


# A turn whose replica died before answering is sent again (nothing reached the
# client yet); the router then picks a live replica.
_REPLICA_LOSS_RETRIES = 2


def _nothing() -> None:
    pass


async def _relay(
    stream: AsyncIterator[ReplyHead | str | ReplyTail], tail: list[ReplyTail] | None = None
) -> AsyncIterator[str]:
    """The stream's SSE chunks; its ReplyTail goes to `tail`."""
    try:
        async for chunk in stream:
            if isinstance(chunk, ReplyTail):
                if tail is not None:
                    tail.append(chunk)
            else:
                yield str(chunk)
    except Exception as error:
        lost = engine_not_ready(f"model replica lost mid-stream: {type(error).__name__}")
        yield f"data: {json.dumps(lost.body())}\n\n"
        yield "data: [DONE]\n\n"


class ChatRoutes(IngressState):
    @app.post("/v1/chat/completions")
    @api_route("chat_completions")
    async def chat_completions(self, request: Request, tenant: str) -> Response:
        started = time.monotonic()
        route = "chat_completions"
        parsed = parse_chat_body(
            await self._body(request),
            self._model_names(),
            self._limits.max_messages,
            request.headers,
        )
        client_program_id = program_id_for(
            request.headers.get(SESSION_HEADER),
            parsed.body,
            self._limits.max_session_id_chars,
            parsed.hints.session_id,
            self._derive_program_ids,
        )
        if parsed.hints.parent_session_id:
            check_session_id(parsed.hints.parent_session_id, self._limits.max_session_id_chars)
        program_id = scoped_program_id(tenant, client_program_id)
        chat = parsed.request
        to_draft = self._draft_model is not None and chat.model == self._draft_model
        self._check_quotas(tenant, program_id, starts_programs=not to_draft)
        chat.session_id = program_id
        salt = cache_salt(tenant, chat.cache_salt, self._tenancy.shared_prefix_cache)
        chat.cache_salt = salt
        parsed.body["cache_salt"] = salt
        apply_agent_hints(chat, parsed.hints, self._schedules_by_priority)
        for hint in parsed.hints.given:
            self._metrics.hints.inc(tags={"hint": hint})
        records: list[Awaitable[object]] = []
        if client_program_id.startswith(ONESHOT_PREFIX):
            mark_last_step(chat)
        else:
            hinted_parent = parsed.hints.parent_session_id
            parent_id = scoped_program_id(tenant, hinted_parent) if hinted_parent else None
            records.append(self._record_session(chat, program_id, parent_id))
        headers = {SESSION_HEADER: client_program_id}
        if chat.tools:  # a reply can only make calls, whose outputs come back, with tools
            owner = ResponseOwner(f"chatcmpl-{chat.request_id}", tenant, program_id)
            owner_ttl_s = self._tools_config.cache.response_owner_ttl_s
            records.append(self._response_owners.record(owner, owner_ttl_s))
        await asyncio.gather(*records)
        execute_tools = parsed.options.execute_tools
        cacheable = self._cacheable(parsed, tenant, client_program_id, request.headers)
        if cacheable is not None:
            assert self._response_cache is not None
            if cacheable.derived_seed is not None:
                chat.seed = cacheable.derived_seed
            stored = (
                await self._response_cache.lookup(cacheable.digest, cacheable.request_chars)
                if cacheable.serve_kept
                else None
            )
            self._metrics.response_cache_lookups.inc(tags={"result": "hit" if stored else "miss"})
            if stored is not None:
                if not to_draft:
                    self._turn_started(program_id, tenant, started, is_last_step(chat))()
                return self._cached_reply(stored, chat, started, headers)
            headers[CACHE_HEADER] = "miss"
        speculation = (
            None
            if to_draft
            else self._speculator.start(parsed.body, program_id, tenant, launch=execute_tools)
        )
        predicted = (
            speculation.issued_call_texts()
            if speculation is not None and self._drafts_predicted_calls
            else []
        )
        chat.vllm_xargs = with_predicted_calls(chat.vllm_xargs, predicted)
        turn = TurnContext(
            tenant=tenant,
            execute_tools=execute_tools,
            wants_calls=speculation is not None,
            stop_invalid_calls=parsed.options.stop_invalid_calls,
            stream_client_calls=parsed.options.stream_client_calls,
        )
        turn_ended = (
            _nothing
            if to_draft
            else self._turn_started(program_id, tenant, started, is_last_step(chat))
        )

        try:
            stream, head = await self._start_chat(chat, program_id, turn, to_draft)
        except Exception as error:
            logger.exception("turn of %s not started", program_id)
            turn_ended()
            self._settle(speculation, [])
            unavailable = engine_not_ready(f"model replica unavailable: {type(error).__name__}")
            return error_response(unavailable, headers)
        headers[REPLICA_HEADER] = head.replica_id
        if head.prefix is not None and not to_draft:
            headers[PREFIX_HEADER] = prefix_header(head.prefix)
            await self._sessions.record_prefix(program_id, head.prefix, self._tenancy.session_ttl_s)
        self._metrics.latency.observe(time.monotonic() - started, tags={"route": route})
        if head.error is not None:
            turn_ended()
            self._settle(speculation, [])
            return error_response(head.error, headers)
        if not head.streaming:
            turn_ended()
            self._settle(speculation, reply_calls(head.body or {}))
            if (
                cacheable is not None
                and head.body is not None
                and keepable_body(head.body, cacheable.execute_tools)
            ):
                await self._keep_reply(cacheable, head.body)
            return JSONResponse(head.body, headers=headers)
        chunks = self._relay_settling(stream, speculation, turn_ended, cacheable)
        if self._stream_keep_alive_s is not None:
            chunks = with_keep_alive(chunks, self._stream_keep_alive_s)
        return StreamingResponse(
            chunks,
            media_type="text/event-stream",
            headers=headers,
        )

    def _cacheable(
        self,
        parsed: ParsedChat,
        tenant: str,
        client_program_id: str,
        headers: Mapping[str, str],
    ) -> CacheableRequest | None:
        if self._response_cache is None:
            return None
        session = None if client_program_id.startswith(ONESHOT_PREFIX) else client_program_id
        return self._response_policy.cacheable(
            parsed.body,
            parsed.options.execute_tools,
            tenant,
            session,
            headers.get("cache-control"),
            parsed.options.stop_invalid_calls,
        )

    def _cached_reply(
        self,
        stored: StoredReply,
        chat: ChatCompletionRequest,
        started: float,
        headers: dict[str, str],
    ) -> Response:
        headers[CACHE_HEADER] = "hit"
        response_id = f"chatcmpl-{chat.request_id}"
        created = int(time.time())
        self._metrics.latency.observe(
            time.monotonic() - started, tags={"route": "chat_completions"}
        )
        if stored.streamed:
            return StreamingResponse(
                served_stream(stored.chunks, response_id, created),
                media_type="text/event-stream",
                headers=headers,
            )
        assert stored.body is not None
        return JSONResponse(served_body(stored.body, response_id, created), headers=headers)

    async def _keep_reply(
        self,
        cacheable: CacheableRequest,
        body: dict[str, Any] | None,
        chunks: tuple[dict[str, Any], ...] = (),
    ) -> None:
        """Keeps a reply: a JSON `body`, or a stream's `chunks`."""
        assert self._response_cache is not None
        if not cacheable.keep:
            return
        reply = StoredReply(cacheable.request_chars, body is None, body, chunks)
        if await self._response_cache.store(cacheable.digest, reply):
            self._metrics.response_cache_kept.inc()

    async def _record_session(
        self, chat: ChatCompletionRequest, program_id: str, parent_id: str | None
    ) -> None:
        """Records the session's turn; a fork's turns name its parent to the
        router and the engine (from the hint, or as recorded when it was forked)."""
        if parent_id == program_id:
            parent_id = None
        parent = await self._sessions.touch(program_id, self._tenancy.session_ttl_s, parent_id)
        if parent is not None:
            chat.vllm_xargs = (chat.vllm_xargs or {}) | {PARENT_PROGRAM_ARG: parent}

    def _check_quotas(self, tenant: str, program_id: str, starts_programs: bool) -> None:
        """Raises RequestRejected (429) past one of the tenant's quotas."""
        refusal = self._quotas.admit(
            tenant,
            time.monotonic(),
            new_program=starts_programs and not self._programs.is_running(program_id),
            running_programs=self._programs.running_programs(tenant),
        )
        if refusal is not None:
            self._metrics.quota_refusals.inc(tags={"quota": refusal.quota})
            raise RequestRejected(rate_limited(refusal.message, refusal.retry_after_s))

    def _turn_started(
        self, program_id: str, tenant: str, arrived: float, last_step: bool
    ) -> Callable[[], None]:
        """Counts the turn in its program; returns what to call once (more calls do
        nothing) when its reply has ended."""
        turn_index, evicted = self._programs.turn_started(program_id, arrived, tenant)
        self._program_metrics.ended(evicted)
        pending = [True]

        def ended() -> None:
            if not pending:
                return
            pending.clear()
            now = time.monotonic()
            self._program_metrics.turn_latency.observe(
                now - arrived, tags={"turn": turn_bucket(turn_index)}
            )
            program = self._programs.turn_finished(program_id, now, last_step)
            self._program_metrics.ended([program] if program else [])

        return ended

    def _settle(self, speculation: SpeculationTurn | None, calls: list[ObservedCall]) -> None:
        if speculation is not None:
            self._speculator.settle(speculation, calls)

    async def _relay_settling(
        self,
        stream: ReplyStream,
        speculation: SpeculationTurn | None,
        turn_ended: Callable[[], None],
        cacheable: CacheableRequest | None = None,
    ) -> AsyncIterator[str]:
        tail: list[ReplyTail] = []
        recorder = StreamRecorder() if cacheable is not None and cacheable.keep else None
        try:
            async for chunk in _relay(stream, tail):
                if recorder is not None:
                    recorder.feed(chunk)
                yield chunk
        finally:
            turn_ended()
            if speculation is not None:
                made = [call for ended in tail for call in ended.tool_calls]
                self._settle(speculation, observed_calls(made))
        if recorder is not None and cacheable is not None:
            whole = recorder.whole(cacheable.execute_tools)
            if whole is not None:
                await self._keep_reply(cacheable, None, whole)

    async def _start_chat(
        self, chat: ChatCompletionRequest, program_id: str, turn: TurnContext, to_draft: bool
    ) -> tuple[ReplyStream, ReplyHead]:
        """Sends the turn to the main model (a replica the router picks by the program
        id, or the one in this replica), or to the draft when the request names the
        draft model, and waits for its reply head."""
        model = self._draft_target if to_draft and self._draft_target else self._main
        retries_left = _REPLICA_LOSS_RETRIES
        while True:
            stream = model.chat(chat, turn, program_id)
            try:
                head = await reply_head(stream)
            except model.replica_loss_errors:
                stream.cancel()
                if retries_left == 0:
                    raise
                retries_left -= 1
                self._metrics.turn_resends.inc()
            except BaseException:
                stream.cancel()
                raise
            else:
                return stream, head
