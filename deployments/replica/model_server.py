"""Model replica: one vLLM AsyncLLM engine behind vLLM's own OpenAI chat front end.

The engine loads in the background so the replica answers at once: until the
engine is ready every call gets a 503 `engine_not_ready` reply instead of
waiting in a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from argparse import Namespace
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.config import ModelDeploymentConfig, ToolsConfig
from cluster.openai_protocol import StreamedReply, ToolCallDeltas
from cluster.store.replicas import EngineState, ReplicaStatus, ReplicaStatusStore
from deployments.engine.pinning.settings import EnginePinningSettings
from deployments.engine.plugin import PREDICTED_CALLS_METHOD
from deployments.engine.setup import create_engine_config
from deployments.errors import ApiError, engine_not_ready
from deployments.replica.admission import export_admission_stats
from deployments.replica.continuation import (
    Continuation,
    continuation_possible,
    declared_hosted_tools,
    stops_invalid_calls,
)
from deployments.replica.pinning import EnginePinning, tool_called
from deployments.replica.prompt_cache.frontend import install_prompt_preparation
from deployments.replica.prompt_cache.held_turns import PrefixIntegrity, watched_prompt
from deployments.replica.prompt_lookup import export_prompt_lookup_stats
from deployments.turn import ReplyHead, ReplyTail, TurnContext, is_last_step
from toolworkers.call_stream import CALL_CLOSING_MARKERS

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle
    from ray.serve.metrics import Counter
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.v1.engine.async_llm import AsyncLLM

    from toolworkers.execution import ToolExecutor

logger = logging.getLogger("toolserve.model_server")

# Each replica reports its engine's state to Redis (read by `/health`); a report
# outlives a few missed refreshes, then a dead replica's report vanishes.
_STATUS_PERIOD_S = 5.0
_STATUS_RETRY_S = 1.0
ENGINE_DIED_DETAIL = "the engine core process died; Ray Serve replaces this replica (retry shortly)"
_STATUS_TTL_S = 15.0


class ModelServer:
    """Ray Serve replica hosting one engine. `role` is `main` or `draft`."""

    def __init__(
        self,
        deployment: ModelDeploymentConfig,
        resolved_model: str,
        role: str,
        redis_url: str | None,
        cache_dir: Path,
        deployment_id: str,
        tools: ToolsConfig | None = None,
        tool_workers: DeploymentHandle | None = None,
        served_model_names: list[str] | None = None,
    ):
        self._deployment = deployment
        self._served_model_names = served_model_names
        self._draft_names = set(served_model_names or ()) - {deployment.engine.served_model_name}
        self._resolved_model = resolved_model
        self._role = role
        self._replica_id = _current_replica_id()
        self._node = _current_node_address()
        self._cpu_binding = deployment.cpu_binding(_current_local_rank())
        self._cache_dir = cache_dir
        self._pinning_settings = (
            EnginePinningSettings(
                **deployment.pinning.model_dump(),
                replica_id=self._replica_id,
                redis_url=redis_url,
                offload_reload_bytes_per_s=deployment.kv_offload.reload_bytes_per_s
                if deployment.kv_offload.enabled
                else None,
            )
            if deployment.pinning.enabled
            else None
        )
        self._pinning: EnginePinning | None = None
        self._seeds_supported = True
        self._stats_exports: list[asyncio.Task[None]] = []
        self._tools_config = tools
        self._tools: ToolExecutor | None = None
        if tools is not None and tools.continuation.enabled:
            from toolworkers.workers import tool_executor

            self._tools = tool_executor(tools, redis_url, tool_workers)
        self._state = EngineState.STARTING
        self._detail = "engine is loading"
        self._engine: AsyncLLM | None = None
        self._serving_chat: OpenAIServingChat | None = None
        self._prefixes: PrefixIntegrity | None = None
        loop = asyncio.get_running_loop()
        self._state_changed = asyncio.Event()
        self._start_task = loop.create_task(self._start_engine())
        self._status_task = (
            loop.create_task(self._report_status(ReplicaStatusStore(redis_url), deployment_id))
            if redis_url
            else None
        )

    async def _start_engine(self) -> None:
        try:
            await self._load()
        except Exception as error:
            logger.exception("engine failed to start")
            self._state = EngineState.FAILED
            self._detail = f"engine failed to start: {type(error).__name__}: {error}"
        else:
            self._state = EngineState.READY
            self._detail = "engine is ready"
        self._state_changed.set()

    async def _report_status(self, store: ReplicaStatusStore, deployment_id: str) -> None:
        while True:
            self._state_changed.clear()
            written = await store.announce(deployment_id, self.status(), _STATUS_TTL_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._state_changed.wait(),
                    _STATUS_PERIOD_S if written else _STATUS_RETRY_S,
                )

    async def _load(self) -> None:
        from starlette.datastructures import State
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.cli_args import FrontendArgs
        from vllm.platforms import current_platform
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

        if self._deployment.num_gpus == 0:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self._cpu_binding
            os.environ.update(self._deployment.cpu_process_environment())
        engine_args, vllm_config = create_engine_config(
            self._deployment.engine.engine_kwargs(self._resolved_model, self._served_model_names),
            self._pinning_settings,
            self._deployment.prompt_lookup,
            self._deployment.admission,
            self._deployment.kv_offload,
            disable_log_stats=False,
        )
        # NOTE: AsyncLLM's constructor blocks until the engine process is up;
        # run it off the event loop so the replica keeps answering meanwhile.
        engine = await asyncio.to_thread(
            AsyncLLM.from_vllm_config,
            vllm_config,
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=[RayPrometheusStatLogger],
        )
        self._engine = engine
        self._seeds_supported = not current_platform.is_cpu()
        chat = self._deployment.chat
        install_prompt_preparation(engine.renderer, chat.tokenize_cache)
        frontend = FrontendArgs(**chat.frontend_kwargs())
        app_state = State()
        await init_app_state(
            engine,
            app_state,
            Namespace(**(vars(frontend) | vars(engine_args))),
            supported_tasks=await engine.get_supported_tasks(),
        )
        self._serving_chat = app_state.openai_serving_chat
        # A draft replica's requests are predictions of programs' turns, not turns.
        if chat.prefix_integrity.enabled and self._role == "main":
            self._prefixes = PrefixIntegrity(
                engine,
                chat.prefix_integrity,
                chat.tool_call_parser,
                self._deployment.engine.max_model_len,
            )
            self._prefixes.install()
        if self._pinning_settings is not None:
            pinning = EnginePinning(
                engine,
                self._pinning_settings.prefill_profile_lengths,
                self._deployment.engine.max_model_len,
                self._replica_id,
                self._pinning_settings.redis_url,
            )
            await pinning.start(self._cache_dir, self._profile_fingerprint())
            self._pinning = pinning
        loop = asyncio.get_running_loop()
        if self._deployment.prompt_lookup.enabled:
            self._stats_exports.append(loop.create_task(export_prompt_lookup_stats(engine)))
        if self._deployment.admission.enabled:
            self._stats_exports.append(loop.create_task(export_admission_stats(engine)))

    def _profile_fingerprint(self) -> dict[str, Any]:
        engine = self._deployment.engine
        return {
            "model": self._resolved_model,
            "dtype": engine.dtype,
            "block_size": engine.block_size,
            "tensor_parallel_size": engine.tensor_parallel_size,
            "cpu_threads_bind": self._cpu_binding,
            "num_gpus": self._deployment.num_gpus,
        }

    def _readiness(self) -> tuple[EngineState, str]:
        """The engine's state now: a started engine whose core process died is
        failed until Serve's health probe has the replica replaced."""
        if self._state is EngineState.READY and self._engine is not None and self._engine.errored:
            return EngineState.FAILED, ENGINE_DIED_DETAIL
        return self._state, self._detail

    def status(self) -> ReplicaStatus:
        state, detail = self._readiness()
        return ReplicaStatus(
            replica_id=self._replica_id,
            role=self._role,
            model=self._deployment.engine.served_model_name,
            state=state,
            detail=detail,
            node=self._node,
        )

    def record_routing_stats(self) -> dict[str, Any]:
        """Read by the session router (through Serve's controller): a replica whose
        engine is still loading (or died) gets no turns while another is ready."""
        return {"engine_ready": self._readiness()[0] is EngineState.READY}

    async def check_health(self) -> None:
        """Ray Serve's health probe: a dead engine makes Serve replace the replica."""
        if self._engine is not None and self._state is EngineState.READY:
            await self._engine.check_health()

    async def chat(
        self, request: ChatCompletionRequest, turn: TurnContext | None = None
    ) -> AsyncIterator[ReplyHead | str | ReplyTail]:
        """Serve one chat completion (validated by the caller); yields a ReplyHead,
        then, if streaming, SSE chunks and, when the turn wants its calls, a ReplyTail.
        With a `turn` allowing it, tool calls the server can answer are answered
        and the turn continues here (`replica/continuation.py`)."""
        state, detail = self._readiness()
        if state is not EngineState.READY or self._serving_chat is None:
            yield ReplyHead(self._replica_id, streaming=False, error=engine_not_ready(detail))
            return
        program_id = request.session_id
        tracked = bool(self._pinning is not None and program_id and not is_last_step(request))
        turn_ended = (lambda tool: self._turn_ended(program_id, tool)) if tracked else None
        wants_calls = turn is not None and turn.wants_calls
        parts: AsyncIterator[ReplyHead | str | ReplyTail]
        if request.model in self._draft_names:
            parts = self._answer_as_draft(request)
        elif turn is None or not self._continues(request, turn):
            request = _ended_at_its_call(request, self._call_closing)
            with watched_prompt(self._prefixes, request) as prompt:
                result = await self._create(request)
            parts = self._answered(
                result, turn_ended, wants_calls, None if prompt is None else prompt.prefix
            )
        else:
            client_request = request
            request = self._continued_request(request, turn)
            # The rounds after the first are requests of their own, built from this
            # one as the client sent it (vLLM's front end fills fields of a request
            # it runs).
            first_round = request.model_dump(mode="json", exclude_unset=True) | {
                "request_id": request.request_id
            }
            with watched_prompt(self._prefixes, request) as prompt:
                result = await self._create(request)
            assert self._tools is not None and self._tools_config is not None
            continuation = Continuation(
                first_round,
                turn,
                self._tools,
                self._tools_config.continuation,
                lambda body: self._create_from_body(body, len(first_round["messages"])),
                turn_ended,
            )
            parts = self._continued(
                result,
                continuation,
                client_request,
                wants_calls,
                None if prompt is None else prompt.prefix,
            )
        async for part in parts:
            yield part

    def _continues(self, request: ChatCompletionRequest, turn: TurnContext) -> bool:
        return bool(
            self._tools is not None
            and turn.execute_tools
            and continuation_possible(request.tools, request.n, request.tool_choice)
        )

    @functools.cached_property
    def _call_closing(self) -> str | None:
        return CALL_CLOSING_MARKERS.get(self._deployment.chat.tool_call_parser)

    def _continued_request(
        self, request: ChatCompletionRequest, turn: TurnContext
    ) -> ChatCompletionRequest:
        """The first round of a continued turn as the engine runs it. Streamed where
        its calls run on partial input; each round's usage counts against the
        request's token budget (a round stopped at an invalid call has only its
        chunks' usage)."""
        if self._streams_inside(request):
            request = request.model_copy(update={"stream": True})
        if request.stream:
            assert self._tools_config is not None
            in_every_chunk = stops_invalid_calls(turn, self._tools_config.continuation)
            request = _with_usage_reported(request, in_every_chunk)
        return _ended_at_its_call(request, self._call_closing)

    async def _answered(
        self,
        result: Any,
        turn_ended: Callable[[str | None], None] | None,
        wants_calls: bool,
        prefix: dict[str, Any] | None,
    ) -> AsyncIterator[ReplyHead | str | ReplyTail]:
        """A turn the engine answers in one round, as the client asked for it."""
        if isinstance(result, ApiError):
            yield ReplyHead(self._replica_id, streaming=False, error=result)
            return
        if not isinstance(result, AsyncIterator):
            reply = result.model_dump(mode="json")
            if turn_ended is not None:
                turn_ended(tool_called(reply))
            yield ReplyHead(self._replica_id, streaming=False, body=reply, prefix=prefix)
            return
        yield ReplyHead(self._replica_id, streaming=True, prefix=prefix)
        calls = ToolCallDeltas() if turn_ended is not None or wants_calls else None
        async for chunk in result:
            if calls is not None:
                calls.feed_sse(chunk)
            yield chunk
        made = calls.calls() if calls is not None else []
        if turn_ended is not None:
            turn_ended(made[0].name if made else None)
        if wants_calls:
            yield ReplyTail(made)

    async def _continued(
        self,
        result: Any,
        continuation: Continuation,
        client_request: ChatCompletionRequest,
        wants_calls: bool,
        prefix: dict[str, Any] | None,
    ) -> AsyncIterator[ReplyHead | str | ReplyTail]:
        """A continued turn, as the client asked for it: a non-streamed turn the
        engine streamed gets the reply the stream adds up to."""
        if isinstance(result, ApiError):
            yield ReplyHead(self._replica_id, streaming=False, error=result)
            return
        if not isinstance(result, AsyncIterator):
            reply = await continuation.reply(result.model_dump(mode="json"))
            yield ReplyHead(self._replica_id, streaming=False, body=reply, prefix=prefix)
            return
        if not client_request.stream:
            streamed = StreamedReply()
            async for chunk in continuation.stream(result, client_wants_usage=True):
                streamed.feed_sse(chunk)
            yield _head_of_streamed_reply(self._replica_id, streamed, prefix)
            return
        options = client_request.stream_options
        yield ReplyHead(self._replica_id, streaming=True, prefix=prefix)
        async for chunk in continuation.stream(
            result,
            client_wants_usage=bool(options and options.include_usage),
            client_wants_chunk_usage=bool(options and options.continuous_usage_stats),
        ):
            yield chunk
        if wants_calls:
            yield ReplyTail(continuation.calls_made)

    def _streams_inside(self, request: ChatCompletionRequest) -> bool:
        """A non-streamed continued turn is streamed from the engine when one of its
        declared hosted tools takes partial input (and nothing asks for what the
        assembled reply leaves out: log probabilities)."""
        if request.stream or request.logprobs or request.top_logprobs:
            return False
        assert self._tools is not None
        if not self._tools.runs_partial_calls:
            return False
        declared = declared_hosted_tools(
            [tool.model_dump(mode="json") for tool in request.tools or []],
            self._tools.registry.openai_schemas(),
        )
        return any(self._tools.takes_partial_input(name) for name in declared)

    async def _answer_as_draft(
        self, request: ChatCompletionRequest
    ) -> AsyncIterator[ReplyHead | str]:
        """A request for the draft's name served by this main engine: a prediction,
        not a turn of its program (neither pinned nor continued), answered under
        the name it asked for (vLLM names its first served model)."""
        asked = str(request.model)
        result = await self._create(request.model_copy(update={"session_id": None}))
        if isinstance(result, ApiError):
            yield ReplyHead(self._replica_id, streaming=False, error=result)
        elif not isinstance(result, AsyncIterator):
            reply = result.model_dump(mode="json") | {"model": asked}
            yield ReplyHead(self._replica_id, streaming=False, body=reply)
        else:
            yield ReplyHead(self._replica_id, streaming=True)
            # Inside JSON strings quotes are escaped, so this fragment is only ever
            # the chunk's own model field.
            served = _model_field(self._deployment.engine.served_model_name)
            renamed = _model_field(asked)
            async for chunk in result:
                yield chunk.replace(served, renamed, 1)

    async def _create_from_body(self, body: dict[str, Any], client_messages: int) -> Any:
        """`_create` for a request the replica built itself (a continuation round),
        whose messages after the first `client_messages` the server added."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        try:
            request = ChatCompletionRequest.model_validate(body)
        except ValueError as error:  # pydantic's ValidationError is one
            return ApiError.from_status(400, f"Invalid request: {error}", None)
        server_added = len(body["messages"]) - client_messages
        with watched_prompt(self._prefixes, request, server_added):
            return await self._create(request)

    async def _create(self, request: ChatCompletionRequest) -> Any:
        """One request to the engine through vLLM's chat front end: a reply, an
        async iterator of SSE chunks, or an ApiError."""
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response,
        )

        assert self._serving_chat is not None
        if request.seed is not None and not self._seeds_supported:
            request = request.model_copy(update={"seed": None})
            _seeds_dropped().inc()
        try:
            result = await self._serving_chat.create_chat_completion(request, None)
        except Exception as error:
            result = create_error_response(error)
        if isinstance(result, ErrorResponse):
            if self._readiness()[0] is EngineState.FAILED:  # it died under this request
                return engine_not_ready(ENGINE_DIED_DETAIL)
            return ApiError.from_status(result.error.code, result.error.message, result.error.param)
        return result

    def _turn_ended(self, program_id: str | None, tool: str | None) -> None:
        if self._pinning is not None and program_id:
            self._pinning.turn_ended(program_id, tool)

    async def end_program(self, program_id: str) -> bool:
        """Releases a program's pinned KV on this replica (the client closed the session)."""
        if self._prefixes is not None:
            self._prefixes.forget(program_id)
        if self._pinning is None or self._readiness()[0] is not EngineState.READY:
            return False
        await self._pinning.end_program(program_id)
        return True

    async def add_predicted_calls(self, program_id: str, call_texts: list[str]) -> int:
        """Calls predicted after the program's turn was sent (the draft model's), for
        the engine to draft from in the program's requests running here; how many
        requests took them."""
        lookup = self._deployment.prompt_lookup
        if (
            not (lookup.enabled and lookup.predicted_calls)
            or self._engine is None
            or self._readiness()[0] is not EngineState.READY
        ):
            return 0
        taken: int = await self._engine.engine_core.call_utility_async(
            PREDICTED_CALLS_METHOD, program_id, call_texts
        )
        return taken

    def __del__(self) -> None:
        if self._status_task is not None:
            self._status_task.cancel()
        if self._pinning is not None:
            self._pinning.stop()
        if self._engine is not None:
            self._engine.shutdown()


def _head_of_streamed_reply(
    replica_id: str, streamed: StreamedReply, prefix: dict[str, Any] | None
) -> ReplyHead:
    """The head of a non-streamed reply assembled from the engine's stream."""
    error = streamed.error
    if error is None:
        return ReplyHead(replica_id, streaming=False, body=streamed.body(), prefix=prefix)
    api_error = ApiError.from_status(
        int(error.get("code") or 500),
        str(error.get("message") or "the engine's stream failed"),
        error.get("param"),
    )
    return ReplyHead(replica_id, streaming=False, error=api_error)


def _model_field(name: str) -> str:
    """The `"model":"<name>"` member as vLLM's compact chunk JSON writes it."""
    return json.dumps({"model": name}, separators=(",", ":"))[1:-1]


def _with_usage_reported(
    request: ChatCompletionRequest, in_every_chunk: bool
) -> ChatCompletionRequest:
    from vllm.entrypoints.generate.base.protocol import StreamOptions

    options = request.stream_options or StreamOptions()
    update: dict[str, bool] = {"include_usage": True}
    if in_every_chunk:
        update["continuous_usage_stats"] = True
    reported = options.model_copy(update=update)
    return request.model_copy(update={"stream_options": reported})


def _ended_at_its_call(
    request: ChatCompletionRequest, call_closing: str | None
) -> ChatCompletionRequest:
    """A reply that may make one call (`parallel_tool_calls: false`) under
    `tool_choice: auto` ends where that call closes: vLLM would decode on and then
    drop every later call. Not where the client set stop sequences of its own
    (their text would then be kept in the output too)."""
    if (
        call_closing is None
        or request.parallel_tool_calls is not False
        or not request.tools
        or request.tool_choice not in (None, "auto")
        or request.stop
    ):
        return request
    return request.model_copy(update={"stop": [call_closing], "include_stop_str_in_output": True})


@functools.cache
def _seeds_dropped() -> Counter:
    from ray.serve.metrics import Counter

    # NOTE: vLLM rewinds a seeded request's generator after a step that split its
    # prefill (`set_offset`), which torch's CPU generator does not have: the
    # engine core dies. A reply sampled without the seed is what OpenAI's API
    # promises anyway ("best effort" determinism); a dead engine loses every
    # request it holds.
    return Counter(
        "toolserve_request_seeds_dropped",
        description="Requests whose `seed` was not passed to the engine: vLLM's CPU "
        "engine fails on a seeded request whose prefill is split across steps.",
    )


def _current_local_rank() -> int:
    from ray import serve

    try:
        rank = serve.get_replica_context().rank
    except RuntimeError:
        return 0
    return int(getattr(rank, "local_rank", 0) or 0)


def _current_node_address() -> str:
    import ray

    return str(ray.util.get_node_ip_address()) if ray.is_initialized() else ""


def _current_replica_id() -> str:
    from ray import serve

    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except RuntimeError:
        return f"pid-{os.getpid()}"
