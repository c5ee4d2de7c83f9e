"""Builds the Serve application: ingress, main-model and draft-model deployments."""

from __future__ import annotations

import uuid
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import BackpressureConfig, RequestRouterConfig

from cluster.config import ModelDeploymentConfig, RoutingConfig, ToolserveConfig
from cluster.models import resolve_model
from deployments.api.ingress import OpenAIIngress
from deployments.api.request_limits import RequestLimits
from deployments.api.state import ModelServerArgs
from deployments.api.tenants import ApiKeys, Tenancy
from deployments.replica.model_server import ModelServer
from toolworkers.workers import ToolWorker

MAIN_DEPLOYMENT = "main-model"
DRAFT_DEPLOYMENT = "draft-model"
INGRESS_DEPLOYMENT = "openai-ingress"
TOOL_WORKERS_DEPLOYMENT = "tool-workers"

# A replica holding an engine: a dead engine fails its health check; a stopping
# one gets time to end its engine's requests.
_MODEL_HEALTH: dict[str, Any] = {
    "health_check_period_s": 10,
    "health_check_timeout_s": 30,
    "graceful_shutdown_timeout_s": 20,
}

_RAY_ROUTERS = {
    "power_of_two": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
    "consistent_hash": "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter",
}


def request_router_config(
    routing: RoutingConfig | None, redis_url: str, engine_batch_slots: int, deployment_id: str
) -> RequestRouterConfig:
    """The main model's router per `routing`; None (draft replicas): least loaded.
    `engine_batch_slots`: sequences each replica's engine decodes at once;
    `deployment_id`: the one the replicas report their status under."""
    if routing is None:
        return RequestRouterConfig(request_router_class=_RAY_ROUTERS["power_of_two"])
    if routing.policy != "session":
        return RequestRouterConfig(request_router_class=_RAY_ROUTERS[routing.policy])
    kwargs: dict[str, Any] = routing.model_dump() | {
        "redis_url": redis_url,
        "engine_batch_slots": engine_batch_slots,
        "deployment_id": deployment_id,
    }
    kwargs.pop("policy")
    return RequestRouterConfig(
        request_router_class="router.serve_router.SessionRouter",
        request_router_kwargs=kwargs,
        # Engine readiness reaches the router through these stats; a restarted
        # replica's engine loads for a minute, during which it must get no turns.
        request_routing_stats_period_s=2,
    )


def _model_server_args(
    deployment: ModelDeploymentConfig,
    resolved_model: str,
    role: str,
    config: ToolserveConfig,
    redis_url: str,
    deployment_id: str,
    tool_workers: Application | None,
) -> tuple[Any, ...]:
    """`ModelServer`'s constructor arguments."""
    return (
        deployment,
        resolved_model,
        role,
        redis_url,
        config.cache_dir,
        deployment_id,
        config.tools if role == "main" else None,
        tool_workers,
        config.names_served_by_main if role == "main" else None,
    )


def _with_resources(options: dict[str, Any], resources: dict[str, float]) -> dict[str, Any]:
    return {**options, "resources": resources} if resources else options


def _model_actor_options(
    deployment: ModelDeploymentConfig, extra_resources: dict[str, float] | None = None
) -> dict[str, Any]:
    return _with_resources(
        {"num_cpus": deployment.num_cpus, "num_gpus": deployment.num_gpus},
        {**deployment.ray_resources, **(extra_resources or {})},
    )


def _spread(deployment: ModelDeploymentConfig) -> dict[str, Any]:
    if deployment.max_replicas_per_node is None:
        return {}
    return {"max_replicas_per_node": deployment.max_replicas_per_node}


def _model_deployment(
    name: str,
    deployment: ModelDeploymentConfig,
    resolved_model: str,
    role: str,
    config: ToolserveConfig,
    redis_url: str,
    routing: RoutingConfig | None,
    deployment_id: str,
    tool_workers: Application | None = None,
) -> Application:
    return (
        serve.deployment(ModelServer)
        .options(
            name=name,
            num_replicas=deployment.num_replicas,
            max_ongoing_requests=deployment.max_ongoing_requests,
            ray_actor_options=_model_actor_options(deployment),
            **_spread(deployment),
            request_router_config=request_router_config(
                routing, redis_url, deployment.engine.max_num_seqs, deployment_id
            ),
            **_MODEL_HEALTH,
        )
        .bind(
            *_model_server_args(
                deployment, resolved_model, role, config, redis_url, deployment_id, tool_workers
            )
        )
    )


def _tool_workers(config: ToolserveConfig, redis_url: str | None) -> Application | None:
    """The tool-worker pool, when there are hosted tools to run."""
    if not config.tools.hosted:
        return None
    return (
        serve.deployment(ToolWorker)
        .options(
            name=TOOL_WORKERS_DEPLOYMENT,
            num_replicas=config.tools.workers,
            max_ongoing_requests=config.tools.worker_max_concurrency,
            # Tools run in subprocesses that mostly wait (I/O, simulated latency);
            # reserving cores for them would starve the engines on small machines.
            ray_actor_options=_with_resources({"num_cpus": 0}, config.tools.worker_ray_resources),
            health_check_period_s=10,
            # Tools run in subprocesses, so a worker's own loop answers at once
            # unless the worker hangs.
            health_check_timeout_s=10,
        )
        .bind(config.tools.sandbox, redis_url)
    )


def build_application(
    config: ToolserveConfig,
    resolved_main_model: str,
    resolved_draft_model: str | None,
    redis_url: str,
) -> Application:
    # Names this deployment's replica reports in Redis, apart from any other
    # toolserve (or an earlier run of this one) sharing the Redis.
    deployment_id = uuid.uuid4().hex[:12]
    tool_workers = _tool_workers(config, redis_url)
    main: Application | ModelServerArgs
    ingress_resources = config.server.ingress_ray_resources
    ingress_options: dict[str, Any] = {
        "ray_actor_options": _with_resources({"num_cpus": 0}, ingress_resources)
    }
    if config.main_placement == "ingress":
        main = ModelServerArgs(
            _model_server_args(
                config.main,
                resolved_main_model,
                "main",
                config,
                redis_url,
                deployment_id,
                tool_workers,
            )
        )
        ingress_options = {
            "ray_actor_options": _model_actor_options(config.main, ingress_resources),
            **_MODEL_HEALTH,
        }
    else:
        main = _model_deployment(
            MAIN_DEPLOYMENT,
            config.main,
            resolved_main_model,
            "main",
            config,
            redis_url,
            config.routing,
            deployment_id,
            tool_workers,
        )
    draft = None
    if config.draft_replicas is not None:
        assert resolved_draft_model is not None
        draft = _model_deployment(
            DRAFT_DEPLOYMENT,
            config.draft_replicas,
            resolved_draft_model,
            "draft",
            config,
            redis_url,
            None,
            deployment_id,
        )
    return (
        serve.deployment(OpenAIIngress)
        .options(
            name=INGRESS_DEPLOYMENT,
            num_replicas=1,
            max_ongoing_requests=config.server.max_ongoing_requests,
            max_queued_requests=config.server.max_queued_requests,
            backpressure_config=BackpressureConfig(
                status_code=429, retry_after_s=config.server.retry_after_s
            ),
            **ingress_options,
        )
        .bind(
            main,
            draft,
            config.main.engine.served_model_name,
            config.draft.engine.served_model_name if config.draft else None,
            config.main.engine.max_model_len,
            redis_url,
            deployment_id,
            config.tools,
            tool_workers,
            Tenancy(
                ApiKeys.of(config.server.accepted_api_keys()),
                config.server.shared_prefix_cache,
                config.server.session_ttl_s,
                config.server.quotas,
            ),
            RequestLimits(
                config.server.max_request_bytes,
                config.server.max_messages,
                config.server.max_session_id_chars,
            ),
            config.server.program_idle_s,
            (config.server.host, config.server.port) if config.server.ingress == "direct" else None,
            config.server.derive_program_ids,
            config.main.schedules_by_priority,
            config.server.response_cache,
            config.main.prompt_lookup.enabled and config.main.prompt_lookup.predicted_calls,
            _wanted_replicas(config),
            config.server.stream_keep_alive_s,
        )
    )


def _wanted_replicas(config: ToolserveConfig) -> dict[str, int]:
    """Each model role's configured replicas, which `/health` expects to report."""
    wanted = {"main": config.main.num_replicas if config.main_placement == "own_replicas" else 1}
    if config.draft_replicas is not None:
        wanted["draft"] = config.draft_replicas.num_replicas
    return wanted


def serve_application(args: dict[str, Any]) -> Application:
    """Ray Serve's application builder for a declarative deployment (KubeRay's
    `RayService`, `serve deploy`): `args["config"]` is a `ToolserveConfig` (a
    profile, as `cluster.launch.kubernetes.serve_config` writes it)."""
    config = ToolserveConfig.model_validate(args["config"])
    if config.redis.url is None:
        raise ValueError("a Serve config of toolserve names its Redis: set redis.url")
    main_model = resolve_model(config.main.engine.model, config.cache_dir)
    draft = config.draft_replicas
    draft_model = resolve_model(draft.engine.model, config.cache_dir) if draft else None
    return build_application(config, main_model, draft_model, config.redis.url)
