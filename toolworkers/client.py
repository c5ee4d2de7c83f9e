"""Client SDK for agents that run their own tools: a thin wrapper over
`openai.AsyncOpenAI` that speculates tool calls client-side.

Per turn it sends the main request and, at the same time, asks the draft model
(served by toolserve under its own name) for λ predictions of the call the main
model will make. Predicted calls of tools the agent marks side-effect-free
start at once, keyed by their canonical call; when the main reply asks for one
of them, its result is reused instead of run again. Finished speculative
results are also posted to `/cache-tool-output/{response id}`, so the server can
continue the turn itself when the model makes exactly that call.

    client = SpeculativeToolClient(AsyncOpenAI(base_url=..., api_key=...),
                                   tools={"get_weather": get_weather},
                                   side_effect_free={"get_weather"},
                                   draft_model="smollm2-135m-draft")
    turn = await client.create(model="smollm2-135m", messages=messages, tools=schemas)
    messages += turn.history_messages()
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from cluster.config import SpeculationConfig
from cluster.openai_protocol import executed_messages
from toolworkers.cache_keys import ArgumentsError, normalized_arguments
from toolworkers.speculation import call_identity, draft_predictions, draft_request

ToolFunction = Callable[..., Any]


@dataclass(frozen=True)
class ClientToolResult:
    call_id: str
    name: str
    arguments: str
    output: str
    speculative: bool


@dataclass
class SpeculationStats:
    issued: int = 0
    used: int = 0

    @property
    def wasted(self) -> int:
        return self.issued - self.used


@dataclass(frozen=True)
class SpeculativeTurn:
    completion: Any
    executed_messages: list[dict[str, Any]]
    tool_results: list[ClientToolResult]

    def history_messages(self) -> list[dict[str, Any]]:
        """What to append to the conversation: the calls the server ran, the reply,
        and a tool message per call the client ran."""
        reply = self.completion.choices[0].message.model_dump(exclude_none=True)
        tools = [
            {"role": "tool", "tool_call_id": result.call_id, "content": result.output}
            for result in self.tool_results
        ]
        return [*self.executed_messages, reply, *tools]


def _run_tool(function: ToolFunction, arguments: dict[str, Any]) -> str:
    try:
        output = function(**arguments)
    except Exception as error:
        return f"error: {type(error).__name__}: {error}"
    return output if isinstance(output, str) else str(output)


@dataclass
class SpeculativeToolClient:
    client: Any
    tools: Mapping[str, ToolFunction]
    side_effect_free: Iterable[str]
    draft_model: str | None
    draft_samples: int = 1
    draft_temperature: float = 0.8
    draft_max_tokens: int = 128
    post_outputs: bool = True
    stats: SpeculationStats = field(default_factory=SpeculationStats)

    def __post_init__(self) -> None:
        self._speculable = set(self.side_effect_free) & set(self.tools)
        self._server = str(self.client.base_url).rstrip("/").removesuffix("/v1")
        self._posts: set[asyncio.Task[None]] = set()

    async def create(self, **request: Any) -> SpeculativeTurn:
        """One chat completion (the `openai` SDK's arguments), with client-side
        speculation; then every call the reply hands to the client is run (or
        its speculative result reused)."""
        request_id = uuid.uuid4().hex
        extra_body = dict(request.pop("extra_body", None) or {}, request_id=request_id)
        main = asyncio.create_task(
            self.client.chat.completions.create(**request, extra_body=extra_body)
        )
        running: dict[str, asyncio.Task[str]] = {}
        speculation = asyncio.create_task(
            self._speculate(request, f"chatcmpl-{request_id}", running)
        )
        try:
            completion = await main
        finally:
            if not speculation.done():
                speculation.cancel()
        results = []
        for call in completion.choices[0].message.tool_calls or []:
            results.append(await self._result_for(call, running))
        return SpeculativeTurn(completion, executed_messages(completion.model_extra), results)

    async def _speculate(
        self, request: dict[str, Any], response_id: str, running: dict[str, asyncio.Task[str]]
    ) -> None:
        if self.draft_model is None or not self._speculable:
            return
        sampling = SpeculationConfig(
            draft_predictions=self.draft_samples,
            draft_temperature=self.draft_temperature,
            draft_max_tokens=self.draft_max_tokens,
        )
        draft_body = draft_request(request, self.draft_model, sampling)
        if draft_body is None:
            return
        draft = await self.client.chat.completions.create(
            **draft_body, extra_headers=request.get("extra_headers")
        )
        for prediction in draft_predictions(draft.model_dump()):
            identity = call_identity(prediction.name, prediction.arguments)
            if prediction.name not in self._speculable or identity in running:
                continue
            self.stats.issued += 1
            task = asyncio.create_task(
                asyncio.to_thread(_run_tool, self.tools[prediction.name], prediction.arguments)
            )
            running[identity] = task
            if self.post_outputs:
                post = asyncio.create_task(
                    self._post(response_id, prediction.name, prediction.arguments, task)
                )
                self._posts.add(post)
                post.add_done_callback(self._posts.discard)

    async def _post(
        self, response_id: str, name: str, arguments: dict[str, Any], run: asyncio.Task[str]
    ) -> None:
        output = await asyncio.shield(run)
        entry = [{"name": name, "params": arguments, "output": output}]
        headers = {"Authorization": f"Bearer {self.client.api_key}"}
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=10) as http:
                await http.post(
                    f"{self._server}/cache-tool-output/{response_id}", json=entry, headers=headers
                )

    async def _result_for(
        self, call: Any, running: dict[str, asyncio.Task[str]]
    ) -> ClientToolResult:
        name, raw_arguments = call.function.name, call.function.arguments
        try:
            arguments = normalized_arguments(raw_arguments)
        except ArgumentsError as error:
            return ClientToolResult(call.id, name, raw_arguments, f"error: {error}", False)
        if name not in self.tools:
            output = f"error: unknown tool {name!r}"
            return ClientToolResult(call.id, name, raw_arguments, output, False)
        speculative = running.get(call_identity(name, arguments))
        if speculative is not None:
            self.stats.used += 1
            return ClientToolResult(call.id, name, raw_arguments, await speculative, True)
        output = await asyncio.to_thread(_run_tool, self.tools[name], arguments)
        return ClientToolResult(call.id, name, raw_arguments, output, False)
