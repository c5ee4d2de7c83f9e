"""OpenAI-compatible HTTP ingress: validates requests, attaches the program id,
forwards to the main model (its replicas, or the one in this replica) and
relays its replies (JSON or SSE)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException as StarletteHTTPException

from cluster.config import ResponseCacheConfig, ServerConfig, ToolsConfig
from cluster.net import wait_for_free_port
from cluster.openai_protocol import (
    EXPECTED_TOOL_ARG,
    LAST_STEP_ARG,
    PARENT_PROGRAM_ARG,
    RETAIN_FOR_ARG,
    with_predicted_calls,
)
from cluster.policies.program_clock import EndedProgram, ProgramClock, turn_bucket
from cluster.store.pins import ControlOperation, PinningControl, PinStore
from cluster.store.replicas import EngineState, ReplicaStatus, ReplicaStatusStore
from cluster.store.response_cache import ResponseCache, StoredReply
from cluster.store.responses import ResponseOwner, ResponseOwners
from cluster.store.sessions import KnownSessions
from cluster.store.tool_state import ToolStateUnavailable
from deployments.agent_hints import (
    AgentHints,
    parse_sglang_close,
    parse_sglang_open,
    read_agent_hints,
)
from deployments.continuation import TurnContext
from deployments.errors import (
    ApiError,
    RequestRejected,
    engine_not_ready,
    invalid_request,
    model_not_found,
)
from deployments.model_client import (
    InProcessClient,
    ModelClient,
    ReplicaClient,
    ReplyStream,
    reply_head,
)
from deployments.model_server import ModelServer, ReplyHead, ReplyTail, is_last_step
from deployments.openapi_schema import with_request_bodies
from deployments.request_limits import (
    RequestLimits,
    capped_body,
    check_message_count,
    check_session_id,
    decode_json,
)
from deployments.response_cache import (
    CacheableRequest,
    ResponseCachePolicy,
    StreamRecorder,
    keepable_body,
    served_body,
    served_stream,
)
from deployments.speculator import SpeculationTurn, Speculator
from deployments.tenants import Tenancy, cache_salt, scoped_program_id, unscoped_program_id
from deployments.tool_api import (
    PostedToolOutput,
    SessionOpening,
    TurnOptions,
    parse_session_opening,
    parse_tool_outputs,
    parse_tool_state,
    pop_turn_options,
)
from router.prefix import conversation_key
from toolworkers.cache_keys import ArgumentsError, normalized_arguments
from toolworkers.predictor import ObservedCall
from toolworkers.speculation import observed_calls, reply_calls

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

logger = logging.getLogger("toolserve.ingress")

SESSION_HEADER = "X-Session-ID"
MAX_SESSION_ID_CHARS = ServerConfig.model_fields["max_session_id_chars"].default
MAX_MESSAGES = ServerConfig.model_fields["max_messages"].default
ONESHOT_PREFIX = "oneshot-"
CONVERSATION_PREFIX = "conversation-"
REPLICA_HEADER = "X-Toolserve-Replica"
CACHE_HEADER = "X-Toolserve-Cache"
_STATUS_TIMEOUT_S = 10.0
API_PORT_WAIT_S = 120.0
_IDLE_SWEEP_S = 10.0
# A turn whose replica died before answering is sent again (nothing reached the
# client yet); the router then picks a live replica.
_REPLICA_LOSS_RETRIES = 2

app = FastAPI(title="toolserve", docs_url=None, redoc_url=None)


def _openapi_with_request_bodies() -> dict[str, Any]:
    if app.openapi_schema is None:
        app.openapi_schema = with_request_bodies(
            get_openapi(title=app.title, version=app.version, routes=app.routes)
        )
    return app.openapi_schema


app.openapi = _openapi_with_request_bodies  # type: ignore[method-assign]


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(ApiError.from_status(exc.status_code, str(exc.detail)))


@app.exception_handler(Exception)
async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    return error_response(ApiError(500, f"internal error: {type(exc).__name__}", "internal_error"))


def program_id_for(
    header_value: str | None,
    body: dict[str, Any],
    max_chars: int = MAX_SESSION_ID_CHARS,
    hinted: str | None = None,
    derive: bool = False,
) -> str:
    """The program id of a request: header, else body field, else an agent-hint
    dialect's session id, else (with `derive`) one named by how its conversation
    opens, else a fresh one-turn id."""
    body_value = body.get("session_id")
    if body_value is not None and not (isinstance(body_value, str) and body_value):
        raise RequestRejected(
            invalid_request("session_id must be a non-empty string", "session_id")
        )
    given = {
        f"{SESSION_HEADER} header": header_value,
        "body session_id": body_value,
        "the agent hints' session id": hinted,
    }
    named = {where: value for where, value in given.items() if value}
    if len(set(named.values())) > 1:
        raise RequestRejected(
            invalid_request(
                " and ".join(f"{where} ({value!r})" for where, value in named.items())
                + " disagree",
                "session_id",
            )
        )
    chosen = next(iter(named.values()), None)
    if not chosen:
        opening = conversation_key(body.get("messages"), body.get("tools")) if derive else None
        return CONVERSATION_PREFIX + opening if opening else ONESHOT_PREFIX + uuid.uuid4().hex
    check_session_id(chosen, max_chars)
    return chosen


def _no_session(client_program_id: str | None, param: str) -> ApiError:
    return ApiError(404, f"No session {client_program_id!r}", "session_not_found", param)


def _nothing() -> None:
    pass


def mark_last_step(request: ChatCompletionRequest) -> None:
    """Tells the engine this turn is its program's last: nothing to pin after it."""
    request.vllm_xargs = (request.vllm_xargs or {}) | {LAST_STEP_ARG: 1}


def apply_agent_hints(
    request: ChatCompletionRequest, hints: AgentHints, schedules_by_priority: bool = True
) -> None:
    """Hands the engine what the hints say about the program's KV and order; the
    request's own `priority` wins over a dialect's, which engines that do not
    schedule by priority never see (they would refuse the request)."""
    if hints.last_turn:
        mark_last_step(request)
    retention: dict[str, Any] = {}
    if hints.retain_for_s is not None:
        retention[RETAIN_FOR_ARG] = hints.retain_for_s
    if hints.expected_tool_s is not None:
        retention[EXPECTED_TOOL_ARG] = hints.expected_tool_s
    if retention:
        request.vllm_xargs = (request.vllm_xargs or {}) | retention
    if hints.priority is not None and request.priority == 0 and schedules_by_priority:
        request.priority = hints.priority


def _validation_message(error: ValidationError) -> str:
    problems = []
    for item in error.errors()[:5]:
        location = ".".join(str(part) for part in item["loc"] if part != "body")
        problems.append(f"{location}: {item['msg']}" if location else item["msg"])
    return "Invalid request: " + "; ".join(problems)


OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _check_messages(messages: Any) -> None:
    """OpenAI's message rules that vLLM's permissive request model does not enforce."""
    if not isinstance(messages, list) or not messages:
        raise RequestRejected(invalid_request("messages must be a non-empty array", "messages"))
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestRejected(invalid_request(f"{param} must be an object", param))
        role = message.get("role")
        if role not in OPENAI_ROLES:
            raise RequestRejected(
                invalid_request(
                    f"Invalid value for {param}.role: {role!r}. Supported values are: "
                    + ", ".join(repr(known) for known in OPENAI_ROLES),
                    f"{param}.role",
                )
            )
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise RequestRejected(
                invalid_request(
                    f"{param} has role 'tool' but no tool_call_id", f"{param}.tool_call_id"
                )
            )
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not (
            isinstance(tool_calls, list) and all(isinstance(call, dict) for call in tool_calls)
        ):
            raise RequestRejected(
                invalid_request(
                    f"{param}.tool_calls must be an array of objects", f"{param}.tool_calls"
                )
            )


@dataclass(frozen=True)
class ModelServerArgs:
    """`ModelServer`'s arguments, for a main model that lives in the ingress replica."""

    args: tuple[Any, ...]


@dataclass(frozen=True)
class ParsedChat:
    """A chat completion body, its `toolserve` options taken out."""

    body: dict[str, Any]
    """The JSON body (what the speculator reads)."""
    request: ChatCompletionRequest
    """The same body validated, once: what crosses to the model replica."""
    options: TurnOptions
    hints: AgentHints


def parse_chat_body(
    raw: bytes,
    served_models: list[str],
    max_messages: int = MAX_MESSAGES,
    headers: Mapping[str, str] | None = None,
) -> ParsedChat:
    """Decode and validate a chat completion body; raises RequestRejected with a 4xx."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.exceptions import VLLMClientError

    try:
        body = decode_json(raw)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError among them
        raise RequestRejected(
            invalid_request(f"Request body is not valid JSON: {error}")
        ) from error
    if not isinstance(body, dict):
        raise RequestRejected(invalid_request("Request body must be a JSON object"))
    model = body.get("model")
    if model is not None and model not in served_models:
        raise RequestRejected(model_not_found(str(model), served_models))
    _check_messages(body.get("messages"))
    check_message_count(body["messages"], max_messages)
    options = pop_turn_options(body)
    hints = read_agent_hints(
        body,
        headers or {},
        retain_for_s=options.retain_for_s,
        expected_tool_s=options.expected_tool_s,
        last_turn=options.last_turn,
        parent_session_id=options.parent_session_id,
    )
    try:
        request = ChatCompletionRequest.model_validate(body)
        _read_lazy_message_fields(request)
    except ValidationError as error:
        raise RequestRejected(invalid_request(_validation_message(error))) from error
    except RecursionError as error:
        raise RequestRejected(invalid_request("Request nested too deeply")) from error
    except (ValueError, TypeError, VLLMClientError) as error:
        # vLLM's own before-validators assume shapes the schema has not checked yet
        raise RequestRejected(invalid_request(f"Invalid request: {error}")) from error
    return ParsedChat(body, request, options, hints)


def _read_lazy_message_fields(request: ChatCompletionRequest) -> None:
    """vLLM types some message fields (a user message's content parts, an
    assistant's tool calls) as iterables, which pydantic validates lazily, as they
    are read: read them now, so an invalid part is refused here, not wherever the
    replica first reads it. Raises pydantic's ValidationError."""
    for message in request.messages:
        if isinstance(message, dict):
            for key, value in message.items():
                if isinstance(value, Iterator):
                    message[key] = list(value)


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


REDIS_DOWN_DETAIL = (
    "Redis unreachable: turns are still served, without what Redis holds (the tool "
    "cache, the TTL ledger routing reads, replica reports, stateful tools' state, "
    "response owners for /cache-tool-output); each resumes when Redis is back"
)


def health_report(
    roles: list[str], engines: list[dict[str, Any]], redis_reachable: bool
) -> dict[str, Any]:
    """The cluster's health: `unavailable` while a model role has no ready replica
    (turns would fail), `degraded` while every role is served but Redis is
    unreachable or some replica is not ready, else `ok`; with each component's
    state. A role none of whose replicas reported yet is starting."""
    reported = {engine["role"] for engine in engines}
    for role in roles:
        if role not in reported:
            engines.append(
                {"role": role, "state": "starting", "detail": "no replica has reported yet"}
            )
    ready = {
        role: sum(1 for e in engines if e["role"] == role and e["state"] == EngineState.READY.value)
        for role in roles
    }
    components: dict[str, dict[str, Any]] = {}
    for role in roles:
        replicas = sum(1 for e in engines if e["role"] == role)
        status = (
            "unavailable" if not ready[role] else "ok" if ready[role] == replicas else "degraded"
        )
        components[role] = {"status": status, "ready_replicas": ready[role], "replicas": replicas}
    components["redis"] = (
        {"status": "ok"}
        if redis_reachable
        else {"status": "unreachable", "detail": REDIS_DOWN_DETAIL}
    )
    if not all(ready.values()):
        status = "unavailable"
    elif all(component["status"] == "ok" for component in components.values()):
        status = "ok"
    else:
        status = "degraded"
    return {
        "status": status,
        "components": components,
        "engines": engines,
        "ready_replicas": ready,
    }


class _ProgramMetrics:
    def __init__(self) -> None:
        from ray.serve.metrics import Histogram

        self.completion = Histogram(
            "toolserve_program_completion_s",
            description="Agent programs' completion time: first turn's arrival to last "
            "turn's end, by how the program ended (last_step, deleted, idle, evicted).",
            boundaries=[1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600],
            tag_keys=("reason",),
        )
        self.turns = Histogram(
            "toolserve_program_turns",
            description="Turns per ended agent program.",
            boundaries=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128],
        )
        self.turn_latency = Histogram(
            "toolserve_turn_latency_s",
            description="A turn's arrival to the end of its reply (the last chunk of a "
            "stream), by the turn's index in its program (1, 2, 3-4, ..., 33+).",
            boundaries=[0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300],
            tag_keys=("turn",),
        )

    def ended(self, programs: list[EndedProgram]) -> None:
        for program in programs:
            self.completion.observe(program.completion_s, tags={"reason": program.reason})
            self.turns.observe(program.turns)


def _wait_for_the_api_port(host: str, port: int) -> None:
    """Serve starts a direct-ingress replica's HTTP server once its constructor
    returns; a replacement replica waits here while the replica it replaces still
    holds the API port. Serve would otherwise find the port in use and block it
    for good, leaving the API without a listener."""
    if not wait_for_free_port(host, port, API_PORT_WAIT_S):
        raise RuntimeError(f"API port {host}:{port} still in use after {API_PORT_WAIT_S:.0f}s")


# NOTE: Serve pickles the FastAPI app and its route functions by value when the
# class is decorated, so every helper they call must be defined above this line.
@serve.ingress(app)
class OpenAIIngress:
    """`/v1/chat/completions`, `/v1/models`, `/health`."""

    def __init__(
        self,
        main: DeploymentHandle | ModelServerArgs,
        draft: DeploymentHandle | None,
        served_model: str,
        draft_model: str | None,
        max_model_len: int,
        redis_url: str,
        deployment_id: str,
        tools: ToolsConfig,
        tool_workers: DeploymentHandle | None,
        tenancy: Tenancy,
        limits: RequestLimits,
        program_idle_s: float = 300.0,
        direct_api_address: tuple[str, int] | None = None,
        derive_program_ids: bool = False,
        schedules_by_priority: bool = True,
        response_cache: ResponseCacheConfig | None = None,
        drafts_predicted_calls: bool = False,
    ):
        # NOTE: request validation uses vLLM's request model; importing vLLM takes
        # seconds, so pay for it at start-up rather than on the first request.
        import vllm.entrypoints.openai.chat_completion.protocol  # noqa: F401

        self._main: ModelClient = (
            InProcessClient(ModelServer(*main.args))
            if isinstance(main, ModelServerArgs)
            else ReplicaClient(main)
        )
        # `draft` is the draft's own deployment; without one, a named draft model
        # is served by the main model.
        self._draft: ModelClient | None = ReplicaClient(draft) if draft is not None else None
        self._draft_target = self._draft or (self._main if draft_model else None)
        self._served_model = served_model
        self._draft_model = draft_model
        self._max_model_len = max_model_len
        self._created = int(time.time())
        self._pins = PinStore(redis_url)
        self._replica_statuses = ReplicaStatusStore(redis_url)
        self._response_owners = ResponseOwners(redis_url)
        self._sessions = KnownSessions(redis_url)
        self._tenancy = tenancy
        self._limits = limits
        self._derive_program_ids = derive_program_ids
        self._schedules_by_priority = schedules_by_priority
        self._drafts_predicted_calls = drafts_predicted_calls
        self._deployment_id = deployment_id
        cache_config = response_cache or ResponseCacheConfig()
        self._response_cache = (
            ResponseCache(
                redis_url,
                cache_config.max_entries,
                cache_config.ttl_s,
                cache_config.max_entry_bytes,
            )
            if cache_config.enabled
            else None
        )
        self._response_policy = ResponseCachePolicy(
            deployment_id, cache_config.seed_sampled_requests
        )
        from toolworkers.workers import tool_executor

        self._tools_config = tools
        self._tools = tool_executor(tools, redis_url, tool_workers)
        self._speculator = Speculator(
            tools.speculation,
            self._tools,
            self._draft_target,
            self._draft_model,
            self._main.add_predicted_calls if drafts_predicted_calls else None,
        )
        from ray.serve.metrics import Counter, Histogram

        self._requests = Counter(
            "toolserve_api_requests",
            description="API requests by route and HTTP status.",
            tag_keys=("route", "status"),
        )
        self._latency = Histogram(
            "toolserve_api_request_latency_s",
            description="Time to the full reply (non-streaming) or the first byte (streaming).",
            boundaries=[0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120],
            tag_keys=("route",),
        )
        self._hints = Counter(
            "toolserve_agent_hints",
            description="Agent hints taken from chat requests, by dialect and hint "
            "(e.g. dynamo.priority, sglang.retain_for_s, toolserve.last_turn).",
            tag_keys=("hint",),
        )
        self._response_cache_lookups = Counter(
            "toolserve_response_cache_lookups",
            description="Chat requests the response cache could answer, by result "
            "(hit: answered from a kept reply; miss: sent to the engine).",
            tag_keys=("result",),
        )
        self._response_cache_kept = Counter(
            "toolserve_response_cache_kept",
            description="Replies kept in the response cache.",
        )
        self._program_metrics = _ProgramMetrics()
        self._programs = ProgramClock()
        self._program_idle_s = program_idle_s
        self._idle_sweep = asyncio.get_running_loop().create_task(self._end_idle_programs())

        if direct_api_address is not None:
            _wait_for_the_api_port(*direct_api_address)

    def _count(self, route: str, status: int) -> None:
        self._requests.inc(tags={"route": route, "status": str(status)})

    def _tenant(self, request: Request) -> str:
        """The caller's tenant; raises RequestRejected (401) for a key the server
        does not accept."""
        return self._tenancy.api_keys.tenant(request.headers.get("authorization"))

    async def _body(self, request: Request) -> bytes:
        """The request's body; raises RequestRejected (413) past the size limit."""
        return await capped_body(
            request.stream(),
            request.headers.get("content-length"),
            self._limits.max_request_bytes,
        )

    def _rejected(self, route: str, rejected: RequestRejected) -> JSONResponse:
        self._count(route, rejected.error.status)
        headers = {"WWW-Authenticate": "Bearer"} if rejected.error.status == 401 else None
        return error_response(rejected.error, headers)

    @app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        """The main model, and the draft model (clients may ask it for predictions)."""
        try:
            self._tenant(request)
        except RequestRejected as rejected:
            return self._rejected("models", rejected)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": self._created,
                        "owned_by": "toolserve",
                        "max_model_len": self._max_model_len,
                    }
                    for name in self._model_names()
                ],
            }
        )

    @app.get("/health")
    async def health(self) -> JSONResponse:
        """Every replica's engine (as reported to Redis; one per role without
        reports) and Redis itself: 200 while each model role has a ready replica
        (`ok` or `degraded`), else 503 (`unavailable`)."""
        roles = {"main": self._main} | ({"draft": self._draft} if self._draft else {})
        reports = await self._replica_statuses.statuses(self._deployment_id)
        engines = [
            report.as_report()
            for report in sorted(reports or [], key=lambda r: (r.role, r.replica_id))
        ]
        # A role without reports (Redis down, or just back and not yet re-announced
        # to) is asked directly: one of its replicas answers for it.
        reported = {engine["role"] for engine in engines}
        engines += [
            await self._status_of(role, model)
            for role, model in roles.items()
            if role not in reported
        ]
        report = health_report(list(roles), engines, redis_reachable=reports is not None)
        if report["status"] == "unavailable":
            waiting = [e for e in engines if e["state"] != EngineState.READY.value] or engines
            not_ready = "; ".join(f"{e['role']}: {e['detail']}" for e in waiting)
            body = engine_not_ready(not_ready).body() | report
            return JSONResponse(body, status_code=503)
        return JSONResponse(report)

    async def check_health(self) -> None:
        """Ray Serve's health probe: with the main model in this replica, a dead
        engine makes Serve replace the replica."""
        if isinstance(self._main, InProcessClient):
            await self._main.check_health()

    async def _status_of(self, role: str, model: ModelClient) -> dict[str, Any]:
        try:
            status: ReplicaStatus = await asyncio.wait_for(model.status(), _STATUS_TIMEOUT_S)
        except Exception as error:
            return {
                "role": role,
                "state": "unreachable",
                "detail": f"replica unreachable: {type(error).__name__}",
            }
        return status.as_report()

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        started = time.monotonic()
        route = "chat_completions"
        try:
            tenant = self._tenant(request)
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
        except RequestRejected as rejected:
            return self._rejected(route, rejected)
        program_id = scoped_program_id(tenant, client_program_id)
        chat = parsed.request
        chat.session_id = program_id
        salt = cache_salt(tenant, chat.cache_salt, self._tenancy.shared_prefix_cache)
        chat.cache_salt = salt
        parsed.body["cache_salt"] = salt
        apply_agent_hints(chat, parsed.hints, self._schedules_by_priority)
        for hint in parsed.hints.given:
            self._hints.inc(tags={"hint": hint})
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
        to_draft = self._draft_model is not None and chat.model == self._draft_model
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
            self._response_cache_lookups.inc(tags={"result": "hit" if stored else "miss"})
            if stored is not None:
                if not to_draft:
                    self._turn_started(program_id, started, is_last_step(chat))()
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
        )
        turn_ended = (
            _nothing if to_draft else self._turn_started(program_id, started, is_last_step(chat))
        )

        try:
            stream, head = await self._start_chat(chat, program_id, turn, to_draft)
        except Exception as error:
            logger.exception("turn of %s not started", program_id)
            turn_ended()
            self._settle(speculation, [])
            unavailable = engine_not_ready(f"model replica unavailable: {type(error).__name__}")
            self._count(route, unavailable.status)
            return error_response(unavailable, headers)
        headers[REPLICA_HEADER] = head.replica_id
        self._latency.observe(time.monotonic() - started, tags={"route": route})
        if head.error is not None:
            turn_ended()
            self._settle(speculation, [])
            self._count(route, head.error.status)
            return error_response(head.error, headers)
        self._count(route, 200)
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
        return StreamingResponse(
            self._relay_settling(stream, speculation, turn_ended, cacheable),
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
        self._count("chat_completions", 200)
        self._latency.observe(time.monotonic() - started, tags={"route": "chat_completions"})
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
            self._response_cache_kept.inc()

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

    def _turn_started(self, program_id: str, arrived: float, last_step: bool) -> Callable[[], None]:
        """Counts the turn in its program; returns what to call once (more calls do
        nothing) when its reply has ended."""
        turn_index, evicted = self._programs.turn_started(program_id, arrived)
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

    async def _end_idle_programs(self) -> None:
        while True:
            await asyncio.sleep(min(self._program_idle_s, _IDLE_SWEEP_S))
            idle = self._programs.idle(time.monotonic(), self._program_idle_s)
            self._program_metrics.ended(idle)

    def _model_names(self) -> list[str]:
        return [self._served_model] + ([self._draft_model] if self._draft_model else [])

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
            except BaseException:
                stream.cancel()
                raise
            else:
                return stream, head

    @app.post("/v1/sessions")
    async def open_session(self, request: Request) -> Response:
        """Opens a session before its first turn, or forks one from a parent
        session (a sub-agent: see `SessionOpening`)."""
        route = "sessions"
        try:
            tenant = self._tenant(request)
            opening = parse_session_opening(await self._body(request))
            client_program_id, program_id = await self._open_session(tenant, opening)
        except RequestRejected as rejected:
            return self._rejected(route, rejected)
        self._count(route, 200)
        return JSONResponse(
            await self._session_view(client_program_id, program_id, opening.parent_id)
        )

    @app.post("/open_session")
    async def open_sglang_session(self, request: Request) -> Response:
        """SGLang's session opening; answers the session's id as a JSON string."""
        route = "sessions"
        try:
            tenant = self._tenant(request)
            opening = SessionOpening(id=parse_sglang_open(await self._body(request)))
            client_program_id, _ = await self._open_session(tenant, opening)
        except RequestRejected as rejected:
            return self._rejected(route, rejected)
        self._count(route, 200)
        return JSONResponse(client_program_id)

    @app.post("/close_session")
    async def close_sglang_session(self, request: Request) -> Response:
        """SGLang's session closing: `DELETE /v1/sessions/{id}`, answered with an
        empty 200."""
        route = "sessions"
        try:
            tenant = self._tenant(request)
            await self._end_session(tenant, parse_sglang_close(await self._body(request)))
        except RequestRejected as rejected:
            return self._rejected(route, rejected)
        self._count(route, 200)
        return Response(status_code=200)

    async def _open_session(self, tenant: str, opening: SessionOpening) -> tuple[str, str]:
        """Records a new session (or a fork of the caller's `parent_id`); its id as
        the caller names it and as the cluster keys it. Raises RequestRejected."""
        for given in (opening.id, opening.parent_id):
            if given is not None:
                check_session_id(given, self._limits.max_session_id_chars)
        client_program_id = opening.id or f"session-{uuid.uuid4().hex}"
        program_id = scoped_program_id(tenant, client_program_id)
        parent_id = scoped_program_id(tenant, opening.parent_id) if opening.parent_id else None
        if parent_id == program_id:
            raise RequestRejected(
                invalid_request("A session cannot be forked from itself", "parent_id")
            )
        if parent_id is not None:
            parent = await self._sessions.lookup(parent_id)
            if parent is not None and not parent[0]:
                raise RequestRejected(_no_session(opening.parent_id, "parent_id"))
        await self._sessions.touch(program_id, self._tenancy.session_ttl_s, parent_id)
        return client_program_id, program_id

    @app.get("/v1/sessions/{program_id}")
    async def get_session(self, program_id: str, request: Request) -> Response:
        """A session the caller's key knows: its parent and where its KV is pinned."""
        route = "sessions"
        client_program_id = program_id
        try:
            tenant = self._tenant(request)
        except RequestRejected as rejected:
            return self._rejected(route, rejected)
        program_id = scoped_program_id(tenant, client_program_id)
        known = await self._sessions.lookup(program_id)
        if known is not None and not known[0]:
            return self._rejected(
                route, RequestRejected(_no_session(client_program_id, "program_id"))
            )
        parent = known[1] if known is not None else None
        client_parent = unscoped_program_id(tenant, parent) if parent is not None else None
        self._count(route, 200)
        return JSONResponse(await self._session_view(client_program_id, program_id, client_parent))

    async def _session_view(
        self, client_program_id: str, program_id: str, client_parent: str | None
    ) -> dict[str, Any]:
        """A session as the API shows it: `pinned` is its KV's replica, tokens and
        expiry (Unix seconds) while pinned, else null."""
        try:
            entry = await asyncio.wait_for(self._pins.lookup(program_id), _STATUS_TIMEOUT_S)
        except Exception:  # Redis down or slow: the session is still served
            entry = None
        pinned = (
            None
            if entry is None
            else {
                "replica": entry.replica_id,
                "tokens": entry.tokens,
                "expires_at": entry.expires_at,
            }
        )
        return {
            "id": client_program_id,
            "object": "session",
            "parent_id": client_parent,
            "pinned": pinned,
        }

    @app.delete("/v1/sessions/{program_id}")
    async def end_session(self, program_id: str, request: Request) -> Response:
        """The client's agent is done: release the program's pinned KV now, on
        whichever replica holds it, and drop its stateful tools' state."""
        route = "sessions"
        try:
            tenant = self._tenant(request)
            await self._end_session(tenant, program_id)
        except RequestRejected as rejected:
            return self._rejected(route, rejected)
        self._count(route, 200)
        return JSONResponse({"id": program_id, "object": "session", "deleted": True})

    async def _end_session(self, tenant: str, client_program_id: str) -> None:
        """Raises RequestRejected: 404 for a session the caller's key does not
        know, 503 when no model replica can be told."""
        program_id = scoped_program_id(tenant, client_program_id)
        if await self._sessions.forget(program_id) is False:
            raise RequestRejected(_no_session(client_program_id, "program_id"))
        try:
            ended = PinningControl(ControlOperation.END_PROGRAM, program_id)
            if await self._pins.send_control(ended) == 0:
                await self._main.end_program(program_id)  # Redis down: one replica
        except Exception as error:
            raise RequestRejected(
                engine_not_ready(f"model replica unavailable: {type(error).__name__}")
            ) from error
        with contextlib.suppress(ToolStateUnavailable):  # it expires with its TTL
            await self._tools.states.clear(tenant, program_id)
        program = self._programs.ended(program_id)
        self._program_metrics.ended([program] if program else [])

    @app.put("/v1/sessions/{program_id}/tool-state/{slot}")
    async def set_tool_state(self, program_id: str, slot: str, request: Request) -> Response:
        """Starts a stateful tool slot of the program over from the scenario in the
        body (for BFCL's backends, the class's `initial_config`)."""
        route = "tool_state"
        try:
            tenant = self._tenant(request)
            check_session_id(program_id, self._limits.max_session_id_chars)
            scenario = parse_tool_state(
                await self._body(request), slot, self._tools.registry.state_slots()
            )
            scoped_id = scoped_program_id(tenant, program_id)
            await self._tools.states.set_scenario(tenant, scoped_id, slot, scenario)
        except RequestRejected as rejected:
            return self._rejected(route, rejected)
        except ToolStateUnavailable as error:
            unavailable = ApiError(503, f"tool state unavailable: {error}", "state_unavailable")
            self._count(route, unavailable.status)
            return error_response(unavailable)
        await self._sessions.touch(scoped_id, self._tenancy.session_ttl_s)
        self._count(route, 200)
        return JSONResponse(
            {"object": "tool_state", "program_id": program_id, "slot": slot, "reset": True}
        )

    @app.get("/v1/tools")
    async def hosted_tools(self, request: Request) -> Response:
        """The hosted tools' OpenAI schemas, to put in a request's `tools`."""
        try:
            self._tenant(request)
        except RequestRejected as rejected:
            return self._rejected("tools", rejected)
        return JSONResponse({"object": "list", "data": self._tools.registry.openai_schemas()})

    @app.post("/cache-tool-output/{response_id}")
    async def cache_tool_output(self, response_id: str, request: Request) -> Response:
        """Outputs of tools the client ran (speculatively) for a response of its
        own: cached in that response's program, where the server's continuation
        and later turns find them."""
        route = "cache_tool_output"
        try:
            owner = await self._response_owner(response_id, self._tenant(request))
            outputs = parse_tool_outputs(await self._body(request))
            cached = await self._cache_outputs(owner, outputs)
        except RequestRejected as rejected:
            return self._rejected(route, rejected)
        self._count(route, 200)
        return JSONResponse({"cached": cached})

    async def _response_owner(self, response_id: str, tenant: str) -> ResponseOwner:
        try:
            owner = await self._response_owners.owner(response_id)
        except Exception as error:
            raise RequestRejected(
                ApiError(
                    503, f"tool cache unavailable: {type(error).__name__}", "cache_unavailable"
                )
            ) from error
        if owner is None:
            raise RequestRejected(
                ApiError(
                    404,
                    f"No response with id {response_id!r} to a request that declared tools",
                    "not_found",
                    "response_id",
                )
            )
        if owner.tenant != tenant:
            raise RequestRejected(
                ApiError(
                    403,
                    f"Response {response_id!r} belongs to another caller",
                    "forbidden",
                    "response_id",
                )
            )
        return owner

    async def _cache_outputs(self, owner: ResponseOwner, outputs: list[PostedToolOutput]) -> int:
        for index, output in enumerate(outputs):
            try:
                normalized_arguments(output.params)
            except ArgumentsError as error:
                raise RequestRejected(
                    ApiError(
                        422, f"Invalid entry [{index}].params: {error}", "unprocessable_entity"
                    )
                ) from error
        stored = [
            await self._tools.post_client_result(
                output.name,
                output.params,
                output.output_text(),
                output.keep_alive,
                tenant=owner.tenant,
                program_id=owner.program_id,
            )
            for output in outputs
        ]
        return sum(stored)
