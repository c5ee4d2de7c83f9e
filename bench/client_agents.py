"""Runs the client-agents workload: each program is an agent written with a client
library (`openai`, `openai-agents`, `langchain-openai`), unmodified but for where
it points and the `X-Session-ID` header every program sends. The libraries build
and send the requests; what went over the wire (the response's headers, usage and
calls) is recorded by the HTTP transport under them (`httpx2`, which openai's SDK
runs on, and both libraries through it), the same for every library, streamed or
not."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
from openai import AsyncOpenAI

from bench.driver import (
    REPLICA_HEADER,
    REQUEST_TIMEOUT_S,
    StallMonitor,
    reply_from_completion,
    reply_from_stream,
)
from bench.records import ClientStall, ProgramRecord, RequestRecord, RunResult
from bench.workloads.client_agents import ClientAgent, ClientAgentsConfig, instructions, run_tool
from cluster.openai_protocol import executed_messages

PREFIX_HEADER = "x-toolserve-prefix"


@dataclass
class Exchange:
    """One chat completion as it went over the wire."""

    sent: float
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    finished: float | None = None
    first_token: float | None = None
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    tool_calls: int = 0
    server_ran_calls: int = 0
    server_ran_rounds: int = 0
    error: str | None = None

    def read_chunk(self, data: dict[str, Any], at: float, streamed: bool = True) -> None:
        """One streamed chunk, or a whole reply (which has no first token of its
        own: its time is the request's latency, not a time to first token)."""
        self.usage = data.get("usage") or self.usage
        calling = [message for message in executed_messages(data) if message.get("tool_calls")]
        self.server_ran_calls += sum(len(message["tool_calls"]) for message in calling)
        self.server_ran_rounds += len(calling)
        for choice in data.get("choices") or ():
            part = choice.get("delta") or choice.get("message") or {}
            calls = part.get("tool_calls") or ()
            if streamed and (part.get("content") or calls) and self.first_token is None:
                self.first_token = at
            self.tool_calls += sum(
                1
                for call in calls
                if "delta" not in choice or (call.get("function") or {}).get("name")
            )
            self.finish_reason = choice.get("finish_reason") or self.finish_reason


class _RecordedBody(httpx2.AsyncByteStream):
    """A response's body passed through to the library, read on the way."""

    def __init__(self, inner: httpx2.AsyncByteStream, exchange: Exchange, streamed: bool):
        self._inner = inner
        self._exchange = exchange
        self._streamed = streamed
        self._pending = b""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._pending += chunk
            if self._streamed:
                self._read_lines(time.monotonic())
            yield chunk
        now = time.monotonic()
        if self._exchange.status >= 400:
            self._exchange.error = self._pending.decode(errors="replace")[:500]
        elif not self._streamed and self._pending:
            self._exchange.read_chunk(json.loads(self._pending), now, streamed=False)
        self._exchange.finished = now

    def _read_lines(self, at: float) -> None:
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            text = line.strip()
            if text.startswith(b"data:") and text[5:].strip() != b"[DONE]":
                self._exchange.read_chunk(json.loads(text[5:]), at)

    async def aclose(self) -> None:
        await self._inner.aclose()


class WireRecorder(httpx2.AsyncBaseTransport):
    """The transport under one program's client: keeps every chat completion."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not request.url.path.endswith("/chat/completions"):
            return await self._inner.handle_async_request(request)
        exchange = Exchange(sent=time.monotonic())
        self.exchanges.append(exchange)
        response = await self._inner.handle_async_request(request)
        exchange.status = response.status_code
        exchange.headers = {name.lower(): value for name, value in response.headers.items()}
        streamed = response.headers.get("content-type", "").startswith("text/event-stream")
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_RecordedBody(response.stream, exchange, streamed),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str
    system: str
    repeat: int


@dataclass(frozen=True)
class Connection:
    """Where one program's library sends its requests, and how."""

    base_url: str
    model: str
    session_id: str
    http: httpx2.AsyncClient
    """Over the program's recording transport."""

    def openai_client(self) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=self.base_url,
            api_key="toolserve-bench",
            max_retries=0,
            timeout=REQUEST_TIMEOUT_S,
            default_headers={"X-Session-ID": self.session_id},
            http_client=self.http,
        )


async def _openai_sdk(
    agent: ClientAgent, config: ClientAgentsConfig, connection: Connection
) -> None:
    """The raw SDK, keeping the conversation as toolserve's API documents: the
    calls the server ran (`toolserve.executed_messages`) go in before the reply."""
    client = connection.openai_client()
    messages: list[Any] = [{"role": "system", "content": instructions()}]
    for question in agent.questions:
        messages.append({"role": "user", "content": question})
        for step in range(config.max_tool_steps):
            arguments: dict[str, Any] = {
                "model": connection.model,
                "messages": messages,
                "tools": agent.tool_schemas(),
                "tool_choice": "required" if step == 0 else "auto",
                "max_tokens": config.max_tokens,
                "temperature": config.temperature,
            }
            if agent.stream:
                chunks = await client.chat.completions.create(
                    **arguments, stream=True, stream_options={"include_usage": True}
                )
                reply = await reply_from_stream(chunks)
            else:
                reply = reply_from_completion(await client.chat.completions.create(**arguments))
            messages += reply.executed_messages
            messages.append(reply.assistant_message())
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                result = run_tool(call.name, call.parsed_arguments() or {})
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


async def _openai_agents(
    agent: ClientAgent, config: ClientAgentsConfig, connection: Connection
) -> None:
    """openai-agents' Runner over the chat completions API, each question's run
    continuing from the last one's `to_input_list()`."""
    from agents import (
        Agent,
        FunctionTool,
        ModelSettings,
        OpenAIChatCompletionsModel,
        RunContextWrapper,
        RunErrorHandlerInput,
        RunErrorHandlerResult,
        RunErrorHandlers,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # traces go to OpenAI's platform, which is not this server

    def tool(schema: dict[str, Any]) -> FunctionTool:
        function = schema["function"]

        async def invoke(context: RunContextWrapper[Any], arguments: str) -> str:
            try:
                parsed = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                return "Error: the arguments are not JSON."
            return run_tool(function["name"], parsed if isinstance(parsed, dict) else {})

        return FunctionTool(
            name=function["name"],
            description=function["description"],
            params_json_schema=function["parameters"],
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )

    assistant = Agent(
        name="support",
        instructions=instructions(),
        model=OpenAIChatCompletionsModel(
            model=connection.model, openai_client=connection.openai_client()
        ),
        model_settings=ModelSettings(
            temperature=config.temperature,
            max_tokens=config.max_tokens,
            tool_choice="required",
            include_usage=True,
        ),
        tools=[tool(schema) for schema in agent.tool_schemas()],
        reset_tool_choice=True,
    )

    def out_of_steps(_: RunErrorHandlerInput[Any]) -> RunErrorHandlerResult:
        # The question ends with the steps it took, as the other libraries' loops
        # end theirs; the library's default raises and would fail the program.
        return RunErrorHandlerResult(final_output="", include_in_history=False)

    ending: RunErrorHandlers[Any] = {"max_turns": out_of_steps}
    history: list[Any] = []
    for question in agent.questions:
        given = [*history, {"role": "user", "content": question}]
        if agent.stream:
            streamed = Runner.run_streamed(
                assistant, given, max_turns=config.max_tool_steps, error_handlers=ending
            )
            async for _ in streamed.stream_events():
                pass
            history = streamed.to_input_list()
        else:
            result = await Runner.run(
                assistant, given, max_turns=config.max_tool_steps, error_handlers=ending
            )
            history = result.to_input_list()


async def _langchain_openai(
    agent: ClientAgent, config: ClientAgentsConfig, connection: Connection
) -> None:
    """langchain-openai's ChatOpenAI with tools bound, its messages kept as
    LangChain's tool-calling loop keeps them."""
    from langchain_core.messages import (
        AIMessage,
        AIMessageChunk,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=connection.model,
        base_url=connection.base_url,
        api_key="toolserve-bench",  # type: ignore[arg-type]
        temperature=config.temperature,
        max_completion_tokens=config.max_tokens,
        max_retries=0,
        stream_usage=True,
        default_headers={"X-Session-ID": connection.session_id},
        http_async_client=connection.http,
    )
    messages: list[BaseMessage] = [SystemMessage(instructions())]
    for question in agent.questions:
        messages.append(HumanMessage(question))
        for step in range(config.max_tool_steps):
            bound = llm.bind_tools(
                agent.tool_schemas(), tool_choice="required" if step == 0 else "auto"
            )
            reply: BaseMessage
            if agent.stream:
                gathered: AIMessageChunk | None = None
                async for chunk in bound.astream(messages):
                    assert isinstance(chunk, AIMessageChunk)
                    gathered = chunk if gathered is None else gathered + chunk
                assert gathered is not None
                reply = gathered
            else:
                reply = await bound.ainvoke(messages)
            messages.append(reply)
            calls = reply.tool_calls if isinstance(reply, AIMessage) else []  # chunks too
            if not calls:
                break
            for call in calls:
                result = run_tool(call["name"], call["args"])
                messages.append(ToolMessage(result, tool_call_id=call["id"] or ""))


LIBRARY_LOOPS = {
    "openai": _openai_sdk,
    "openai-agents": _openai_agents,
    "langchain-openai": _langchain_openai,
}


def exchange_records(
    target: Target, agent: ClientAgent, exchanges: list[Exchange], started: float
) -> list[RequestRecord]:
    """A program's requests as the run's records; the time from one request's end
    to the next one's start is the agent's (tools, the library's own work)."""
    records = []
    for index, exchange in enumerate(exchanges):
        usage = exchange.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        finished = exchange.finished or exchange.sent
        following = exchanges[index + 1].sent if index + 1 < len(exchanges) else finished
        records.append(
            RequestRecord(
                system=target.system,
                repeat=target.repeat,
                program_id=agent.program_id,
                agent_type=agent.agent_type,
                turn_index=index,
                sent_s=exchange.sent - started,
                latency_s=finished - exchange.sent,
                prompt_tokens=usage.get("prompt_tokens") or 0,
                cached_tokens=details.get("cached_tokens"),
                completion_tokens=usage.get("completion_tokens") or 0,
                finish_reason=exchange.finish_reason,
                tool_calls=exchange.tool_calls,
                unusable_calls=0,
                tool_latency_s=following - finished if exchange.tool_calls else 0.0,
                error=exchange.error,
                replica=exchange.headers.get(REPLICA_HEADER),
                first_token_s=(
                    exchange.first_token - exchange.sent if exchange.first_token else None
                ),
                prefix=exchange.headers.get(PREFIX_HEADER),
                server_ran_calls=exchange.server_ran_calls,
                server_ran_rounds=exchange.server_ran_rounds,
            )
        )
    return records


async def _run_agent(
    target: Target, agent: ClientAgent, config: ClientAgentsConfig, started: float
) -> tuple[ProgramRecord, list[RequestRecord]]:
    await asyncio.sleep(max(0.0, agent.arrival_s - (time.monotonic() - started)))
    recorder = WireRecorder()
    http = httpx2.AsyncClient(transport=recorder, timeout=REQUEST_TIMEOUT_S)
    connection = Connection(
        target.base_url, target.model, f"{agent.program_id}.r{target.repeat}", http
    )
    error = None
    try:
        await LIBRARY_LOOPS[agent.library](agent, config, connection)
    except Exception as failure:  # the library's own error, whatever its type
        error = f"{type(failure).__name__}: {failure}"[:500]
    finally:
        await http.aclose()
    finished = time.monotonic() - started
    requests = exchange_records(target, agent, recorder.exchanges, started)
    program = ProgramRecord(
        system=target.system,
        repeat=target.repeat,
        program_id=agent.program_id,
        agent_type=agent.agent_type,
        arrival_s=agent.arrival_s,
        finished_s=finished,
        jct_s=finished - agent.arrival_s,
        turns=len(requests),
        tool_time_s=sum(request.tool_latency_s for request in requests),
        calls=sum(request.tool_calls + request.server_ran_calls for request in requests),
        unusable_calls=0,
        error=error,
    )
    return program, requests


async def run_client_agents(
    config: ClientAgentsConfig, seed: int, base_url: str, model: str, system: str, repeat: int
) -> RunResult:
    target = Target(base_url, model, system, repeat)
    async with AsyncOpenAI(base_url=base_url, api_key="toolserve-bench", max_retries=0) as client:
        await client.chat.completions.create(  # outside the measurement: first-request work
            model=model, messages=[{"role": "user", "content": "Say OK."}], max_tokens=4
        )
    monitor = StallMonitor(system, repeat)
    started = time.monotonic()
    probing = asyncio.create_task(monitor.run(started))
    try:
        outcomes = await asyncio.gather(
            *(_run_agent(target, agent, config, started) for agent in config.agents(seed))
        )
    finally:
        probing.cancel()
    stalls: list[ClientStall] = monitor.stalls
    return RunResult(
        [request for _, requests in outcomes for request in requests],
        [program for program, _ in outcomes],
        time.monotonic() - started,
        stalls,
    )
