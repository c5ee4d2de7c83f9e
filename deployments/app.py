"""Builds the Serve application: ingress, main-model and draft-model deployments."""

from __future__ import annotations

from ray import serve
from ray.serve import Application

from cluster.config import ModelDeploymentConfig, ToolserveConfig
from deployments.ingress import OpenAIIngress
from deployments.model_server import ModelServer

MAIN_DEPLOYMENT = "main-model"
DRAFT_DEPLOYMENT = "draft-model"
INGRESS_DEPLOYMENT = "openai-ingress"


def _model_deployment(
    name: str,
    deployment: ModelDeploymentConfig,
    resolved_model: str,
    role: str,
    config: ToolserveConfig,
    redis_url: str,
) -> Application:
    return (
        serve.deployment(ModelServer)
        .options(
            name=name,
            num_replicas=deployment.num_replicas,
            max_ongoing_requests=deployment.max_ongoing_requests,
            ray_actor_options={
                "num_cpus": deployment.num_cpus,
                "num_gpus": deployment.num_gpus,
            },
            health_check_period_s=10,
            health_check_timeout_s=30,
            graceful_shutdown_timeout_s=20,
        )
        .bind(deployment, resolved_model, role, redis_url, config.cache_dir)
    )


def build_application(
    config: ToolserveConfig,
    resolved_main_model: str,
    resolved_draft_model: str | None,
    redis_url: str,
) -> Application:
    main = _model_deployment(
        MAIN_DEPLOYMENT, config.main, resolved_main_model, "main", config, redis_url
    )
    draft = None
    if config.draft is not None:
        assert resolved_draft_model is not None
        draft = _model_deployment(
            DRAFT_DEPLOYMENT, config.draft, resolved_draft_model, "draft", config, redis_url
        )
    return (
        serve.deployment(OpenAIIngress)
        .options(
            name=INGRESS_DEPLOYMENT,
            num_replicas=1,
            max_ongoing_requests=config.server.max_ongoing_requests,
            ray_actor_options={"num_cpus": 0},
        )
        .bind(
            main,
            draft,
            config.main.engine.served_model_name,
            config.main.engine.max_model_len,
            redis_url,
        )
    )
