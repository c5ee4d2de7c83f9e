"""The ingress deployment's state: its model clients, stores, tools and
speculator, limits, metrics and program clock, built once per replica; and what
every route group uses of it (the caller's tenant, the body, counting)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from ray.serve.handle import DeploymentHandle

from cluster.config import ResponseCacheConfig, ToolsConfig
from cluster.net import wait_for_free_port
from cluster.policies.program_clock import ProgramClock
from cluster.store.pins import PinStore
from cluster.store.replicas import ReplicaStatusStore
from cluster.store.response_cache import ResponseCache
from cluster.store.responses import ResponseOwners
from cluster.store.sessions import KnownSessions
from cluster.store.speculation_ledger import SpeculationLedger
from deployments.api.metrics import ApiMetrics, ProgramMetrics
from deployments.api.model_client import InProcessClient, ModelClient, ReplicaClient
from deployments.api.request_limits import RequestLimits, capped_body
from deployments.api.response_cache import ResponseCachePolicy
from deployments.api.speculator import Speculator
from deployments.api.tenants import Tenancy, tenant_quotas
from deployments.replica.model_server import ModelServer

API_PORT_WAIT_S = 120.0
_IDLE_SWEEP_S = 10.0


@dataclass(frozen=True)
class ModelServerArgs:
    """`ModelServer`'s arguments, for a main model that lives in the ingress replica."""

    args: tuple[Any, ...]


def _wait_for_the_api_port(host: str, port: int) -> None:
    """Serve starts a direct-ingress replica's HTTP server once its constructor
    returns; a replacement replica waits here while the replica it replaces still
    holds the API port. Serve would otherwise find the port in use and block it
    for good, leaving the API without a listener."""
    if not wait_for_free_port(host, port, API_PORT_WAIT_S):
        raise RuntimeError(f"API port {host}:{port} still in use after {API_PORT_WAIT_S:.0f}s")


class IngressState:
    """What the route groups share; `OpenAIIngress` composes them."""

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
        wanted_replicas: dict[str, int] | None = None,
        stream_keep_alive_s: float | None = None,
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
        self._wanted_replicas = wanted_replicas or {}
        self._stream_keep_alive_s = stream_keep_alive_s
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
            SpeculationLedger(redis_url, tools.speculation.ledger_ttl_s),
        )
        self._metrics = ApiMetrics()
        self._program_metrics = ProgramMetrics()
        self._programs = ProgramClock()
        self._quotas = tenant_quotas(tenancy.quotas)
        self._program_idle_s = program_idle_s
        self._idle_sweep = asyncio.get_running_loop().create_task(self._end_idle_programs())

        if direct_api_address is not None:
            _wait_for_the_api_port(*direct_api_address)

    def _count(self, route: str, status: int) -> None:
        self._metrics.requests.inc(tags={"route": route, "status": str(status)})

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

    async def _end_idle_programs(self) -> None:
        while True:
            await asyncio.sleep(min(self._program_idle_s, _IDLE_SWEEP_S))
            idle = self._programs.idle(time.monotonic(), self._program_idle_s)
            self._program_metrics.ended(idle)

    def _model_names(self) -> list[str]:
        return [self._served_model] + ([self._draft_model] if self._draft_model else [])
