"""Drives the hot-path workload (`bench/workloads/hot_path.py`) with the `openai`
SDK: its phases one after another against one endpoint, every request recorded."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

from openai import APIError, AsyncOpenAI, omit
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from bench.records import ProgramRecord, RequestRecord, RunResult
from bench.workloads.hot_path import (
    AGENT_TYPE,
    BURST,
    REPEATED,
    SEQUENTIAL,
    STREAMED,
    HotPathConfig,
    concurrent_phase,
    latency_figures,
    throughput_figure,
)

_REQUEST_TIMEOUT_S = 300.0
_SYSTEM_PROMPT = "You are a terse assistant. Answer with one word."


def _messages(index: int) -> list[ChatCompletionMessageParam]:
    return [
        {"role": "system", "content": _SYSTEM_PROMPT},
        {"role": "user", "content": f"Question {index}: is {index} an even number?"},
    ]


_REPEATED_QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "In two sentences, why do agents call tools?"},
]


_BURST_GUIDELINES = (
    "Work in small, verifiable steps. Before editing a file, read it. Prefer the "
    "repository's own helpers to new code. Run the tests after every change and "
    "report failures verbatim. Never delete files you did not create. Keep answers "
    "short: name the file, the function and the change. "
) * 6
_BURST_TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    argument: {"type": "string", "description": f"The {argument} to use."}
                    for argument in arguments
                },
                "required": list(arguments),
            },
        },
    }
    for name, description, arguments in (
        ("read_file", "Read a file of the repository and return its text.", ("path",)),
        ("write_file", "Replace a file's text.", ("path", "content")),
        ("search_code", "Search the repository for a regular expression.", ("pattern", "glob")),
        ("run_command", "Run a shell command in the repository.", ("command", "workdir")),
        ("get_diagnostics", "Type checker and linter findings for a file.", ("path",)),
        ("list_files", "List the files under a directory.", ("directory",)),
        ("git_diff", "The working tree's changes against a revision.", ("revision",)),
        ("open_issue", "Open an issue with a title and a body.", ("title", "body")),
    )
]


def _burst_messages(team: int, agent: int) -> list[ChatCompletionMessageParam]:
    """An agent of a team: the team's preamble, then a question of its own."""
    return [
        {
            "role": "system",
            "content": f"You are agent team {team} of a coding assistant. {_BURST_GUIDELINES}",
        },
        {"role": "user", "content": f"Agent {agent}: which tool lists the files of src/{agent}?"},
    ]


class _Phase:
    """One phase's requests and its record of them."""

    def __init__(self, name: str, system: str, repeat: int, run_started: float):
        self.name = name
        self._system = system
        self._repeat = repeat
        self._run_started = run_started
        self.requests: list[RequestRecord] = []
        self.latencies_s: list[float] = []
        self.first_token_s: list[float] = []

    async def send(
        self, index: int, request: Callable[[], Awaitable[tuple[int, int, float | None]]]
    ) -> None:
        sent = time.monotonic()
        error: str | None = None
        prompt_tokens = completion_tokens = 0
        first_token: float | None = None
        try:
            prompt_tokens, completion_tokens, first_token = await request()
        except APIError as failure:
            error = f"{type(failure).__name__}: {failure}"[:500]
        latency = time.monotonic() - sent
        if error is None:
            self.latencies_s.append(latency)
            if first_token is not None:
                self.first_token_s.append(first_token - sent)
        self.requests.append(
            RequestRecord(
                system=self._system,
                repeat=self._repeat,
                program_id=self.name,
                agent_type=AGENT_TYPE,
                turn_index=index,
                sent_s=sent - self._run_started,
                latency_s=latency,
                prompt_tokens=prompt_tokens,
                cached_tokens=None,
                completion_tokens=completion_tokens,
                finish_reason=None,
                tool_calls=0,
                unusable_calls=0,
                tool_latency_s=0.0,
                error=error,
            )
        )

    def record(self, started: float, finished: float) -> ProgramRecord:
        failed = [request.error for request in self.requests if request.error]
        return ProgramRecord(
            system=self._system,
            repeat=self._repeat,
            program_id=self.name,
            agent_type=AGENT_TYPE,
            arrival_s=started - self._run_started,
            finished_s=finished - self._run_started,
            jct_s=finished - started,
            turns=len(self.requests),
            tool_time_s=0.0,
            calls=0,
            unusable_calls=0,
            error=f"{len(failed)} failed requests, first: {failed[0]}" if failed else None,
        )


async def run_hot_path(
    config: HotPathConfig, base_url: str, model: str, system: str, repeat: int
) -> tuple[RunResult, dict[str, float]]:
    """The run's records (one program per phase) and its figures."""
    client = AsyncOpenAI(
        base_url=base_url, api_key="toolserve-bench", max_retries=0, timeout=_REQUEST_TIMEOUT_S
    )
    next_index = 0

    async def completion(
        messages: list[ChatCompletionMessageParam],
        max_tokens: int,
        tools: list[ChatCompletionToolParam] | None = None,
    ) -> tuple[int, int, float | None]:
        reply = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0.0,
            tools=tools if tools else omit,
        )
        usage = reply.usage
        return (usage.prompt_tokens, usage.completion_tokens, None) if usage else (0, 0, None)

    async def complete() -> tuple[int, int, float | None]:
        nonlocal next_index
        next_index += 1
        return await completion(_messages(next_index), 1)

    async def ask_again() -> tuple[int, int, float | None]:
        return await completion(_REPEATED_QUESTION, config.repeated_max_tokens)

    async def stream() -> tuple[int, int, float | None]:
        nonlocal next_index
        next_index += 1
        first_token: float | None = None
        chunks = await client.chat.completions.create(
            model=model,
            messages=_messages(next_index),
            max_tokens=config.streamed_max_tokens,
            temperature=0.0,
            stream=True,
        )
        generated = 0
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                generated += 1
                if first_token is None:
                    first_token = time.monotonic()
        return 0, generated, first_token

    requests: list[RequestRecord] = []
    programs: list[ProgramRecord] = []
    figures: dict[str, float] = {}
    try:
        await complete()  # warm-up, outside the measurement
        run_started = time.monotonic()

        async def run_phase(
            name: str,
            count: int,
            in_flight: int,
            request: Callable[[], Awaitable[tuple[int, int, float | None]]],
        ) -> _Phase:
            phase = _Phase(name, system, repeat, run_started)
            indices = iter(range(count))

            async def client_loop() -> None:
                for index in indices:  # shared: each loop takes the next index
                    await phase.send(index, request)

            started = time.monotonic()
            await asyncio.gather(*(client_loop() for _ in range(in_flight)))
            finished = time.monotonic()
            requests.extend(phase.requests)
            programs.append(phase.record(started, finished))
            figures.update(latency_figures(name, phase.latencies_s))
            if in_flight > 1:
                figures.update(throughput_figure(name, len(phase.latencies_s), finished - started))
            return phase

        if config.sequential_requests:
            await run_phase(SEQUENTIAL, config.sequential_requests, 1, complete)
        for in_flight in config.concurrency if config.requests_per_phase else ():
            await run_phase(
                concurrent_phase(in_flight), config.requests_per_phase, in_flight, complete
            )
        if config.streamed_requests:
            streamed = await run_phase(STREAMED, config.streamed_requests, 1, stream)
            figures.update(latency_figures("ttft", streamed.first_token_s))
        if config.repeated_requests:
            await run_phase(REPEATED, config.repeated_requests, 1, ask_again)
        if config.burst_width and config.burst_iterations:
            burst = _Phase(BURST, system, repeat, run_started)
            started = time.monotonic()
            for team in range(config.burst_iterations):
                await asyncio.gather(
                    *(
                        burst.send(
                            team * config.burst_width + agent,
                            functools.partial(
                                completion,
                                _burst_messages(team, agent),
                                config.burst_max_tokens,
                                _BURST_TOOLS,
                            ),
                        )
                        for agent in range(config.burst_width)
                    )
                )
            requests.extend(burst.requests)
            programs.append(burst.record(started, time.monotonic()))
            figures.update(latency_figures(BURST, burst.latencies_s))
        wall = time.monotonic() - run_started
    finally:
        await client.close()
    return RunResult(requests, programs, wall), figures
