"""Engine-side continuation: when a round of the model's reply ends in tool calls
the server can answer (hosted tools, or client tools whose results the client
posted), the server appends the calls and their results to the conversation and
runs the next round on the same replica, whose prefix cache (and pin) still holds
the conversation's KV. `Continuation` runs a turn's rounds; the engine is reached
only through the request function the replica gives it.

What the client receives, documented in the README:
- non-streaming: the last round's reply, with `usage` summed over the rounds and
  `toolserve.executed_messages`: the assistant tool-call messages and tool
  messages the server added, in order, to insert before the reply's message;
- streaming: content deltas as they come. A round whose first call is a client
  tool's (declared, not hosted) streams its call deltas as the model writes them
  and goes to the client (`stream_client_calls`); in any other round the
  tool-call deltas are held until it ends, then either sent whole (the call goes
  to the client) or replaced by a chunk whose `toolserve.executed_messages` holds
  that round's messages.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from cluster.config import ContinuationConfig
from cluster.openai_protocol import (
    SSE_DONE,
    ModelToolCall,
    message_tool_calls,
    sse_event,
    sse_payloads,
    with_executed_messages,
)
from deployments.errors import ApiError
from deployments.turn import TurnContext
from toolworkers.call_stream import (
    ArgumentCompleted,
    CallEvent,
    CallStarted,
    ToolCallDeltaParser,
)
from toolworkers.call_validation import CallRejected, CallValidator

if TYPE_CHECKING:
    from ray.serve.metrics import Counter

    from toolworkers.execution import ToolExecutor
    from toolworkers.partial_execution import PartialExecution

logger = logging.getLogger("toolserve.continuation")

# Constraints on the call-making step (vLLM implements a required or named
# tool_choice with structured outputs too); the rounds the server adds after
# answering a call leave the choice to the model. `response_format`, the shape
# of the final answer, stays.
_FIRST_ROUND_ONLY = ("tool_choice", "structured_outputs")


def stops_invalid_calls(turn: TurnContext, config: ContinuationConfig) -> bool:
    """Does the turn's continuation stop a call as soon as it cannot be valid?"""
    chosen = turn.stop_invalid_calls
    return config.stop_invalid_calls if chosen is None else chosen


def streams_client_calls(turn: TurnContext, config: ContinuationConfig) -> bool:
    """Does the turn stream a client tool's call as the model writes it?"""
    chosen = turn.stream_client_calls
    return config.stream_client_calls if chosen is None else chosen


def continuation_possible(tools: Sequence[Any] | None, n: int | None, tool_choice: Any) -> bool:
    """Single-choice requests whose model may call tools."""
    return bool(tools) and n in (None, 1) and tool_choice != "none"


def _schema_identity(function: dict[str, Any]) -> tuple[Any, ...]:
    return (
        function.get("name"),
        function.get("description"),
        json.dumps(function.get("parameters"), sort_keys=True),
    )


def declared_hosted_tools(
    declared: list[dict[str, Any]], hosted_schemas: list[dict[str, Any]]
) -> set[str]:
    """Names of the request's tools the server may run: those declared with the
    hosted tool's own schema (as `GET /v1/tools` lists it). A client's own tool
    that merely shares a hosted tool's name stays the client's."""
    hosted = {
        schema["function"]["name"]: _schema_identity(schema["function"])
        for schema in hosted_schemas
    }
    names = set()
    for tool in declared:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and hosted.get(function.get("name")) == _schema_identity(
            function
        ):
            names.add(function["name"])
    return names


def calls_complete(finish_reason: str | None) -> bool:
    """Did the round end having made its calls (vLLM ends a named tool choice with
    `stop`), rather than cut off mid-call at the token limit?"""
    return finish_reason in ("tool_calls", "stop")


def round_messages(
    content: str | None, calls: list[ModelToolCall], outputs: list[str]
) -> list[dict[str, Any]]:
    """The assistant message that made the calls, then one tool message per call."""
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [call.as_message_part() for call in calls],
    }
    tools = [
        {"role": "tool", "tool_call_id": call.id, "content": output}
        for call, output in zip(calls, outputs, strict=True)
    ]
    return [assistant, *tools]


_TOKEN_LIMIT_FIELDS = ("max_completion_tokens", "max_tokens")


def next_round_body(
    body: dict[str, Any],
    executed: list[dict[str, Any]],
    completion_tokens_so_far: int,
    round_index: int,
) -> dict[str, Any] | None:
    """The request of the next round: the conversation so far, what is left of
    the token budget, its own engine request id, the model free to call a tool
    or answer. None: the budget is spent."""
    following = {key: value for key, value in body.items() if key not in _FIRST_ROUND_ONLY}
    following["messages"] = [*body["messages"], *executed]
    for name in _TOKEN_LIMIT_FIELDS:
        limit = body.get(name)
        if limit is not None:
            remaining = int(limit) - completion_tokens_so_far
            if remaining <= 0:
                return None
            following[name] = remaining
    if body.get("request_id"):
        following["request_id"] = f"{body['request_id']}-r{round_index}"
    return following


def summed_usage(
    total: dict[str, Any] | None, usage: dict[str, Any] | None
) -> dict[str, Any] | None:
    if usage is None:
        return total
    if total is None:
        return copy.deepcopy(usage)
    summed = copy.deepcopy(total)
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        summed[name] = (summed.get(name) or 0) + (usage.get(name) or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        details = summed.get("prompt_tokens_details") or {}
        details["cached_tokens"] = (details.get("cached_tokens") or 0) + cached
        summed["prompt_tokens_details"] = details
    return summed


@dataclass
class ReplyRound:
    """One round answered whole: the engine's non-streamed reply."""

    reply: dict[str, Any]
    failed: ClassVar[bool] = False

    @property
    def content(self) -> str:
        return str(self.reply["choices"][0]["message"].get("content") or "")

    @property
    def finish_reason(self) -> str | None:
        reason: str | None = self.reply["choices"][0].get("finish_reason")
        return reason

    @property
    def usage(self) -> dict[str, Any] | None:
        usage: dict[str, Any] | None = self.reply.get("usage")
        return usage

    @property
    def tool_calls(self) -> list[ModelToolCall]:
        return message_tool_calls(self.reply["choices"][0]["message"])

    def closing_reply(
        self, response_id: str, total_usage: dict[str, Any] | None, executed: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The reply the client gets: this last round's, under the first round's id,
        with the usage of every round and the messages the server added."""
        if not executed:
            return self.reply
        reply = self.reply | {"id": response_id, "usage": total_usage}
        return with_executed_messages(reply, executed)


@dataclass
class StreamRound:
    """One round of a streamed reply. `feed` returns what to send on at once:
    every chunk rewritten to the response's id, content deltas as they are,
    tool-call deltas (but those of a round that forwards its calls), the finish
    chunk, usage and `[DONE]` held back."""

    response_id: str
    keep_chunk_usage: bool = True
    """False: the engine reports usage in every chunk for the round's own
    accounting (a round stopped early has no final usage), not for the client."""
    scan_calls: bool = False
    """Read the round's calls as they stream (`take_call_events`), not only whole."""
    client_tools: frozenset[str] = frozenset()
    """Tools the client runs: a round whose first call is one of theirs forwards
    its call deltas as they come (`forwards_calls`), and goes to the client."""
    content: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    failed: bool = False
    forwards_calls: bool = False
    _holds_calls: bool = False
    _calls: ToolCallDeltaParser = field(init=False)
    _new_call_events: list[CallEvent] = field(default_factory=list)
    _finish_chunk: dict[str, Any] | None = None
    _template: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self._calls = ToolCallDeltaParser(scan=self.scan_calls)

    async def read(
        self, stream: AsyncIterator[str], watch: RoundCalls | None
    ) -> AsyncIterator[str]:
        """The round's chunks to send on, as `feed` gives them; the round stops being
        read (and the engine's request is aborted) at a call the watch rejects."""
        async for chunk in stream:
            for forwarded in self.feed(chunk):
                yield forwarded
            if watch is not None and await watch.feed(self.take_call_events()):
                await _close(stream)
                return
        if watch is not None:
            await watch.end(self._calls.finish())

    def feed(self, sse: str) -> list[str]:
        forward = []
        for data in sse_payloads(sse):
            if "error" in data and "choices" not in data:
                self.failed = True
                forward.append(sse_event(data))
                continue
            data["id"] = self.response_id
            if self._template is None:
                self._template = {k: v for k, v in data.items() if k not in ("choices", "usage")}
            if not data.get("choices"):
                self.usage = data.get("usage") or self.usage
                continue
            chunk_usage = data.get("usage") if self.keep_chunk_usage else data.pop("usage", None)
            self.usage = chunk_usage or self.usage
            if self._take(data):
                forward.append(sse_event(data))
        return forward

    def _take(self, data: dict[str, Any]) -> bool:
        """Records the chunk's calls and finish; True when something is left to send."""
        choice = data["choices"][0]
        delta = choice.get("delta") or {}
        fragments = delta.pop("tool_calls", None) or []
        self._new_call_events += self._calls.feed(fragments)
        if fragments and self._forwards(fragments):
            delta["tool_calls"] = fragments
        self.content += delta.get("content") or ""
        if choice.get("finish_reason") is None:
            return bool(delta)
        self.finish_reason = choice["finish_reason"]
        self._finish_chunk = copy.deepcopy(data)
        self._finish_chunk["choices"][0]["delta"] = {}
        choice["finish_reason"] = None
        return bool(delta.get("content") or delta.get("tool_calls"))

    def _forwards(self, fragments: list[dict[str, Any]]) -> bool:
        """Whether these call fragments go on now: the round's first call decides,
        by its name, for the whole round."""
        if not (self.forwards_calls or self._holds_calls):
            first = (fragments[0].get("function") or {}).get("name")
            if first in self.client_tools:
                self.forwards_calls = True
            elif first:
                self._holds_calls = True
        return self.forwards_calls

    @property
    def tool_calls(self) -> list[ModelToolCall]:
        return self._calls.assembled.calls()

    def take_call_events(self) -> list[CallEvent]:
        """The call events of the fragments fed since the last take."""
        events, self._new_call_events = self._new_call_events, []
        return events

    def stopped_at(self, index: int) -> None:
        """The round was stopped while the model wrote call `index`: the calls before
        it stand, and the round finishes as a reply that made them (or none)."""
        self._calls.assembled.drop_from(index)
        self.finish_reason = "tool_calls" if self._calls.assembled else "stop"
        self._finish_chunk = self._chunk({}, self.finish_reason)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        base = dict(self._template or {"id": self.response_id, "object": "chat.completion.chunk"})
        return base | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    def executed_chunk(self, executed: list[dict[str, Any]]) -> str:
        """Stands in for the round's tool calls when the server answered them."""
        return sse_event(with_executed_messages(self._chunk({}), executed))

    def closing_chunks(self, total_usage: dict[str, Any] | None) -> list[str]:
        """The end of the reply: held tool calls (whole), the finish chunk, the
        usage summed over all rounds when the client asked for it, `[DONE]`."""
        chunks = []
        if self._calls.assembled and not self.forwards_calls:
            parts = [
                {"index": index} | call.as_message_part()
                for index, call in enumerate(self.tool_calls)
            ]
            chunks.append(sse_event(self._chunk({"tool_calls": parts})))
        if self._finish_chunk is not None:
            chunks.append(sse_event(self._finish_chunk))
        if total_usage is not None and self.usage is not None:
            chunks.append(
                sse_event(dict(self._template or {}) | {"choices": [], "usage": total_usage})
            )
        chunks.append(SSE_DONE)
        return chunks


class RoundCalls:
    """One streamed round's call events, for every consumer: the round's partial
    runs get them, and the validator
    stops the round at the first call that can never be valid, when the server
    would answer it (a hosted tool's call, or a tool the request does not
    declare) and every call before it. A declared client tool's call is the
    client's to judge."""

    def __init__(
        self,
        partial: PartialExecution | None,
        validator: CallValidator | None,
        client_tools: set[str],
    ):
        self._partial = partial
        self._validator = validator
        self._client_tools = client_tools
        self._names: dict[int, str] = {}
        self._arguments: dict[int, dict[str, Any]] = {}
        self.rejected: CallRejected | None = None

    async def feed(self, events: list[CallEvent]) -> bool:
        """The round's next events; True: stop the round (see `rejected`)."""
        if events:
            await self._handle(events)
        return self.rejected is not None

    async def end(self, events: list[CallEvent]) -> None:
        """The round's stream ended, with these last events."""
        await self._handle(events)

    async def _handle(self, events: list[CallEvent]) -> None:
        if self._partial is not None:
            await self._partial.handle(events)
        if self._validator is None or self.rejected is not None:
            return
        for event in events:
            if isinstance(event, CallStarted):
                self._names[event.index] = event.name
            elif isinstance(event, ArgumentCompleted):
                self._arguments.setdefault(event.index, {})[event.name] = event.value
            rejection = self._validator.check(event)
            if rejection is not None and self._server_answers(rejection.index):
                self.rejected = rejection
                return

    def through_rejected(self, calls: list[ModelToolCall]) -> list[ModelToolCall]:
        """The round's calls up to the rejected one, which keeps the arguments
        whose values were written whole (its text is cut inside its object)."""
        assert self.rejected is not None
        stopped = calls[self.rejected.index]
        written = json.dumps(self._arguments.get(self.rejected.index, {}))
        return [*calls[: self.rejected.index], ModelToolCall(stopped.id, stopped.name, written)]

    def _server_answers(self, through: int) -> bool:
        return all(self._names.get(index) not in self._client_tools for index in range(through + 1))


@functools.cache
def _stopped_calls() -> Counter:
    from ray.serve.metrics import Counter

    return Counter(
        "toolserve_tool_calls_stopped",
        description="Streamed calls whose decoding was stopped as soon as they could no "
        "longer be valid, by reason; the model was told why and wrote the call again.",
        tag_keys=("reason",),
    )


async def _close(stream: AsyncIterator[str]) -> None:
    """Stops reading a round: closing vLLM's stream aborts its request."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


CreateCompletion = Callable[[dict[str, Any]], Awaitable[Any]]
"""One request to the engine through vLLM's chat front end: a reply (a pydantic
model), an async iterator of SSE chunks, or an `ApiError`."""


class Continuation:
    """One turn's rounds, streamed or not, in one loop: while a round ends in calls
    the server can answer, answer them and run the next round, up to `max_rounds`.
    `turn_ended` hears the tool each round called, the first included (None: the
    turn is not tracked)."""

    def __init__(
        self,
        body: dict[str, Any],
        turn: TurnContext,
        tools: ToolExecutor,
        config: ContinuationConfig,
        create: CreateCompletion,
        turn_ended: Callable[[str | None], None] | None,
    ):
        self._body = body
        self._turn = turn
        self._tools = tools
        self._config = config
        self._create = create
        self._turn_ended = turn_ended
        self.calls_made: list[ModelToolCall] = []
        """Every call of the reply once it ended: those the server ran, then those
        that went to the client."""

    async def reply(self, reply: dict[str, Any]) -> dict[str, Any]:
        """The non-streamed reply once no round is left to run, given the first."""
        async for part in self._rounds(reply):
            if isinstance(part, dict):
                return part
        raise AssertionError("the rounds of a non-streamed turn end in its reply")

    async def stream(
        self,
        stream: AsyncIterator[str],
        client_wants_usage: bool,
        client_wants_chunk_usage: bool = False,
    ) -> AsyncIterator[str]:
        """The streamed reply's SSE chunks, given the first round's. With
        `stops_invalid_calls`, the engine's chunks carry usage; the client sees it
        there only if it asked (`client_wants_chunk_usage`)."""
        async for part in self._rounds(stream, client_wants_usage, client_wants_chunk_usage):
            if isinstance(part, str):
                yield part

    async def _rounds(
        self,
        first: dict[str, Any] | AsyncIterator[str],
        client_wants_usage: bool = False,
        client_wants_chunk_usage: bool = False,
    ) -> AsyncIterator[str | dict[str, Any]]:
        """The turn's rounds, streamed or not: each round's chunks to send on as it
        streams, then the reply's end (the closing chunks, or the reply itself)."""
        streamed = not isinstance(first, dict)
        response_id = (
            str(first["id"]) if isinstance(first, dict) else f"chatcmpl-{self._body['request_id']}"
        )
        usage: dict[str, Any] | None = None
        executed: list[dict[str, Any]] = []
        result: Any = first
        round_index = 1
        while True:
            partial = watch = None
            current: ReplyRound | StreamRound
            if streamed:
                partial = self._partial_execution()
                validator = self._validator(round_index)
                if partial is not None or validator is not None:
                    watch = RoundCalls(partial, validator, self._client_tools)
                current = StreamRound(
                    response_id,
                    client_wants_chunk_usage,
                    scan_calls=watch is not None,
                    client_tools=self._streamed_client_tools,
                )
            else:
                current = ReplyRound(result)
            rejected = None
            try:
                if isinstance(current, StreamRound):
                    async for forwarded in current.read(result, watch):
                        yield forwarded
                usage = summed_usage(usage, current.usage)
                calls = current.tool_calls
                if watch is not None and watch.rejected is not None:
                    rejected = watch.rejected
                    _stopped_calls().inc(tags={"reason": rejected.kind.value})
                    calls = watch.through_rejected(calls)
                if self._turn_ended is not None:
                    self._turn_ended(calls[0].name if calls else None)
                following = None
                if (
                    not current.failed
                    and (rejected is not None or calls_complete(current.finish_reason))
                    and calls
                    and round_index <= self._config.max_rounds
                    and not (isinstance(current, StreamRound) and current.forwards_calls)
                ):
                    outputs = await self._answer_calls(calls, partial, rejected)
                    if outputs is not None:
                        messages = round_messages(current.content, calls, outputs)
                        following = next_round_body(
                            self._body,
                            executed + messages,
                            (usage or {}).get("completion_tokens", 0),
                            round_index,
                        )
            finally:
                if partial is not None:
                    await partial.abandon()
            if following is not None:
                created = await self._create(following)
                if not isinstance(created, ApiError):
                    executed += messages
                    self.calls_made += calls
                    if isinstance(current, StreamRound):
                        yield current.executed_chunk(messages)
                        result = created
                    else:
                        result = created.model_dump(mode="json")
                    round_index += 1
                    continue
                logger.warning("continuation stopped: %s", created.message)
            if isinstance(current, ReplyRound):
                self.calls_made += calls
                yield current.closing_reply(response_id, usage, executed)
                return
            if rejected is not None:
                current.stopped_at(rejected.index)
                calls = current.tool_calls
            self.calls_made += calls
            for closing in current.closing_chunks(usage if client_wants_usage else None):
                yield closing
            return

    def _validator(self, round_index: int) -> CallValidator | None:
        """The round's validator: none once no further round may follow, where a
        stopped call could not be written again."""
        if (
            not stops_invalid_calls(self._turn, self._config)
            or round_index > self._config.max_rounds
        ):
            return None
        return self._declared_tools_validator.next_reply()

    @functools.cached_property
    def _declared_tools_validator(self) -> CallValidator:
        return CallValidator(self._body["tools"])

    @functools.cached_property
    def _client_tools(self) -> set[str]:
        declared = {
            tool["function"]["name"]
            for tool in self._body["tools"]
            if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
        }
        return declared - self._hosted_names

    @functools.cached_property
    def _streamed_client_tools(self) -> frozenset[str]:
        """The client tools whose calls stream as they are written (none when the
        turn holds every call to its round's end)."""
        if not streams_client_calls(self._turn, self._config):
            return frozenset()
        return frozenset(self._client_tools)

    @functools.cached_property
    def _hosted_names(self) -> set[str]:
        return declared_hosted_tools(self._body["tools"], self._tools.registry.openai_schemas())

    def _partial_execution(self) -> PartialExecution | None:
        """A round's partial runs, when some declared hosted tool takes partial input."""
        if not self._tools.runs_partial_calls:
            return None
        hosted = self._hosted_names
        if not any(self._tools.takes_partial_input(name) for name in hosted):
            return None
        from toolworkers.partial_execution import PartialExecution

        return PartialExecution(self._tools, hosted)

    async def _answer_calls(
        self,
        calls: list[ModelToolCall],
        partial: PartialExecution | None = None,
        rejected: CallRejected | None = None,
    ) -> list[str] | None:
        """Tool messages for every call, or None when any must go to the client.
        Client tools are checked first, so no hosted tool runs for a round that
        goes back to the client anyway (a partial run already started is then
        abandoned: partial-input tools keep their effects inside their sandbox).
        A `rejected` call is answered with the reason it was stopped."""
        tools = self._tools
        program_id = str(self._body.get("session_id") or "")
        hosted_names = self._hosted_names
        is_hosted = [
            call.name in hosted_names or (rejected is not None and index == rejected.index)
            for index, call in enumerate(calls)
        ]

        async def answer(index: int) -> str | None:
            if rejected is not None and index == rejected.index:
                return f"error: invalid call, stopped while it was written: {rejected.reason}"
            if partial is not None and is_hosted[index]:
                ran = await partial.outcome(index, calls[index].arguments)
                if ran is not None:
                    return ran.result.for_model()
            outcome = await tools.resolve(
                calls[index].name,
                calls[index].arguments,
                tenant=self._turn.tenant,
                program_id=program_id,
                client_result_wait_s=self._config.client_result_wait_s,
                hosted=is_hosted[index],
            )
            return None if outcome is None else outcome.result.for_model()

        async def answer_in_order(indices: list[int]) -> list[str | None]:
            return [await answer(index) for index in indices]

        answers: dict[int, str | None] = {}
        for hosted_pass in (False, True):
            indices = [i for i, hosted in enumerate(is_hosted) if hosted is hosted_pass]
            # Calls on a program's tool state see each other's effects in the
            # order the model wrote them, as BFCL's executor runs them.
            stateful = [i for i in indices if self._keeps_state(calls[i].name)]
            concurrent = [i for i in indices if i not in stateful]
            in_order, outputs = await asyncio.gather(
                answer_in_order(stateful), asyncio.gather(*(answer(i) for i in concurrent))
            )
            answers |= dict(zip(stateful, in_order, strict=True))
            answers |= dict(zip(concurrent, outputs, strict=True))
            if None in answers.values():
                return None
        return [answers[i] or "" for i in range(len(calls))]

    def _keeps_state(self, name: str) -> bool:
        tool = self._tools.registry.get(name)
        return tool is not None and tool.spec.state_slot is not None
