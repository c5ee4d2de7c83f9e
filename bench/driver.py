"""Runs a workload's programs concurrently against one OpenAI-compatible endpoint
and records every request and every program."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from openai import APIError, AsyncOpenAI, NotFoundError
from tqdm import tqdm

from bench.records import (
    ClientStall,
    ProgramRecord,
    RequestRecord,
    RunResult,
    program_record,
    request_record,
)
from bench.workloads.program import AgentProgram, Reply, ToolCall, ToolOutcome, TurnRequest
from cluster.openai_protocol import ToolCallDeltas, executed_messages
from toolworkers.client import SpeculativeToolClient

REQUEST_TIMEOUT_S = 900.0


STALL_PROBE_INTERVAL_S = 0.25
STALL_THRESHOLD_S = 0.5


class StallMonitor:
    """Probes the client's event loop and default thread pool every `interval_s`
    and keeps each probe that came back more than `threshold_s` late."""

    def __init__(
        self,
        system: str,
        repeat: int,
        interval_s: float = STALL_PROBE_INTERVAL_S,
        threshold_s: float = STALL_THRESHOLD_S,
    ):
        self._system = system
        self._repeat = repeat
        self._interval_s = interval_s
        self._threshold_s = threshold_s
        self.stalls: list[ClientStall] = []

    async def run(self, started: float) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self._interval_s)
            self._keep(started, before, time.monotonic() - before - self._interval_s, "loop")
            before = time.monotonic()
            await asyncio.to_thread(time.monotonic)
            self._keep(started, before, time.monotonic() - before, "threads")

    def _keep(self, started: float, at: float, lag: float, where: str) -> None:
        if lag > self._threshold_s:
            self.stalls.append(ClientStall(self._system, self._repeat, at - started, lag, where))


REPLICA_HEADER = "x-toolserve-replica"


def reply_from_completion(completion: Any, replica: str | None = None) -> Reply:
    choice = completion.choices[0]
    message = choice.message
    return Reply(
        content=message.content,
        tool_calls=tuple(
            ToolCall(call.id, call.function.name, call.function.arguments)
            for call in message.tool_calls or ()
        ),
        finish_reason=choice.finish_reason,
        **_token_counts(completion.usage),
        executed_messages=tuple(executed_messages(completion.model_extra)),
        replica=replica,
    )


def _token_counts(usage: Any) -> dict[str, Any]:
    """A reply's `usage` as `Reply`'s token fields."""
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    return {
        "prompt_tokens": usage.prompt_tokens if usage else 0,
        "cached_tokens": getattr(details, "cached_tokens", None) if details else None,
        "completion_tokens": usage.completion_tokens if usage else 0,
    }


async def reply_from_stream(
    chunks: Any, replica: str | None = None, sent: float | None = None
) -> Reply:
    """The reply a streamed chat completion adds up to (sent with usage reported);
    `sent`: when the request was sent (`time.monotonic()`), to time its first
    token and its first server-run tool result."""
    content, finish_reason, usage = "", None, None
    calls = ToolCallDeltas()
    executed: list[dict[str, Any]] = []
    first_result_s = first_token_s = None
    async for chunk in chunks:
        executed += executed_messages(chunk.model_extra)
        if executed and first_result_s is None and sent is not None:
            first_result_s = time.monotonic() - sent
        usage = chunk.usage or usage
        if chunk.choices:
            choice = chunk.choices[0]
            wrote = bool(choice.delta.content or choice.delta.tool_calls)
            if wrote and first_token_s is None and sent is not None:
                first_token_s = time.monotonic() - sent
            content += choice.delta.content or ""
            finish_reason = choice.finish_reason or finish_reason
            calls.feed([call.model_dump() for call in choice.delta.tool_calls or ()])
    return Reply(
        content=content or None,
        tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in calls.calls()),
        finish_reason=finish_reason,
        **_token_counts(usage),
        executed_messages=tuple(executed),
        replica=replica,
        first_result_s=first_result_s,
        first_token_s=first_token_s,
    )


def _tool_function(program: AgentProgram, name: str) -> Callable[..., str]:
    def run(**arguments: Any) -> str:
        return program.execute(ToolCall("speculative", name, json.dumps(arguments))).content

    return run


class Driver:
    """Sends the agents' requests; `X-Session-ID` carries the program id. With a
    `draft_model`, the client speculates tool calls itself (toolserve's client
    SDK, `toolworkers/client.py`). `hosts_tools`: the server runs hosted tools, so
    a program's tool state is set there before its first turn."""

    def __init__(
        self,
        base_url: str,
        model: str,
        system: str,
        repeat: int,
        draft_model: str | None = None,
        hosts_tools: bool = False,
    ):
        self._model = model
        self._draft_model = draft_model
        self._hosts_tools = hosts_tools
        self._system = system
        self._repeat = repeat
        self._client = AsyncOpenAI(
            base_url=base_url,
            api_key="toolserve-bench",
            max_retries=0,
            timeout=REQUEST_TIMEOUT_S,
        )

    async def close(self) -> None:
        await self._client.close()

    async def complete(
        self, program: AgentProgram, request: TurnRequest, session_id: str
    ) -> tuple[Reply, dict[str, ToolOutcome]]:
        """The reply, and the outcomes of its calls the client already ran."""
        arguments: dict[str, Any] = {
            "model": self._model,
            "messages": program.messages,
            "max_tokens": request.max_tokens,
            "temperature": program.temperature,
            "extra_headers": {"X-Session-ID": session_id},
        }
        if program.tools:
            arguments["tools"] = program.tools
            arguments["tool_choice"] = request.tool_choice
        extra_body: dict[str, Any] = {}
        if request.structured_outputs is not None:
            extra_body["structured_outputs"] = request.structured_outputs
        if request.exact_length:
            extra_body |= {"min_tokens": request.max_tokens, "ignore_eos": True}
        if extra_body:
            arguments["extra_body"] = extra_body
        if request.stream:
            arguments |= {"stream": True, "stream_options": {"include_usage": True}}
            sent = time.monotonic()
            raw = await self._client.chat.completions.with_raw_response.create(**arguments)
            reply = await reply_from_stream(raw.parse(), raw.headers.get(REPLICA_HEADER), sent)
            return reply, {}
        speculable = program.side_effect_free_tools()
        if self._draft_model is None or not speculable:
            raw = await self._client.chat.completions.with_raw_response.create(**arguments)
            return reply_from_completion(raw.parse(), raw.headers.get(REPLICA_HEADER)), {}
        sdk = SpeculativeToolClient(
            self._client,
            tools={name: _tool_function(program, name) for name in speculable},
            side_effect_free=speculable,
            draft_model=self._draft_model,
            post_outputs=False,
        )
        turn = await sdk.create(**arguments)
        ready = {
            result.call_id: ToolOutcome(result.output, usable=not result.output.startswith("error"))
            for result in turn.tool_results
        }
        return reply_from_completion(turn.completion), ready

    async def warm_up(self) -> None:
        """One small request outside the measurement (first-request imports, caches)."""
        try:
            await self._client.chat.completions.create(
                model=self._model,
                messages=[{"role": "user", "content": "Say OK."}],
                max_tokens=4,
                temperature=0.0,
            )
        except APIError as error:
            raise RuntimeError(f"warm-up request failed: {error}") from error

    async def run_program(
        self, program: AgentProgram, started: float, requests: list[RequestRecord]
    ) -> ProgramRecord:
        await asyncio.sleep(max(0.0, program.arrival_s - (time.monotonic() - started)))
        session_id = self._session_id(program)
        tool_time = 0.0
        calls = unusable = 0
        error: str | None = None
        try:
            await self._set_tool_state(program, session_id)
        except APIError as failure:
            error = f"tool state: {type(failure).__name__}: {failure}"[:500]
        while error is None and (request := program.next_request()) is not None:
            sent = time.monotonic()
            try:
                reply, ready = await self.complete(program, request, session_id)
            except APIError as failure:
                error = f"{type(failure).__name__}: {failure}"[:500]
                requests.append(
                    request_record(
                        self._system,
                        self._repeat,
                        program,
                        sent - started,
                        time.monotonic() - sent,
                        None,
                        None,
                        error,
                    )
                )
                break
            latency = time.monotonic() - sent
            tool_round = await program.act(request, reply, ready)
            tool_time += tool_round.latency_s
            calls += tool_round.calls
            unusable += tool_round.unusable_calls
            requests.append(
                request_record(
                    self._system,
                    self._repeat,
                    program,
                    sent - started,
                    latency,
                    reply,
                    tool_round,
                    None,
                )
            )
        return program_record(
            self._system,
            self._repeat,
            program,
            time.monotonic() - started,
            tool_time,
            calls,
            unusable,
            error,
        )

    def _session_id(self, program: AgentProgram) -> str:
        return f"{program.program_id}.r{self._repeat}"

    async def end_session(self, program: AgentProgram) -> None:
        """Ends the program's session as a client that closes its sessions does (a
        session its last turn already ended is gone: 404)."""
        with contextlib.suppress(NotFoundError):
            await self._client.delete(
                f"/sessions/{self._session_id(program)}", cast_to=httpx.Response
            )

    async def _set_tool_state(self, program: AgentProgram, session_id: str) -> None:
        if not self._hosts_tools:
            return
        for slot, scenario in program.tool_state().items():
            await self._client.put(
                f"/sessions/{session_id}/tool-state/{slot}", body=scenario, cast_to=httpx.Response
            )


async def run_workload(
    programs: Sequence[AgentProgram],
    base_url: str,
    model: str,
    system: str,
    repeat: int,
    show_progress: bool = True,
    draft_model: str | None = None,
    hosts_tools: bool = False,
) -> RunResult:
    driver = Driver(base_url, model, system, repeat, draft_model, hosts_tools)
    monitor = StallMonitor(system, repeat)
    requests: list[RequestRecord] = []
    probing: asyncio.Task[None] | None = None
    try:
        await driver.warm_up()
        started = time.monotonic()
        probing = asyncio.create_task(monitor.run(started))
        with tqdm(
            total=len(programs),
            desc=f"{system} #{repeat}",
            unit="program",
            disable=not show_progress,
            leave=True,
        ) as bar:

            async def tracked(program: AgentProgram) -> ProgramRecord:
                record = await driver.run_program(program, started, requests)
                bar.update(1)
                bar.set_postfix(requests=len(requests))
                return record

            records = await asyncio.gather(*(tracked(program) for program in programs))
        wall = time.monotonic() - started
    finally:
        if probing is not None:
            probing.cancel()
        await driver.close()
    return RunResult(requests, list(records), wall, monitor.stalls)
