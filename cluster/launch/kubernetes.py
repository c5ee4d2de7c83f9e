"""toolserve on Kubernetes: the Serve config a KubeRay `RayService` runs, built
from the same profile `toolserve up` reads, and the Helm chart's values and
manifests for a profile (rendered with Helm's own Go SDK, no `helm` binary)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from cluster.config import REPO_ROOT, ToolserveConfig

CHART_DIR = REPO_ROOT / "helm" / "toolserve"
CHART_PROFILES_DIR = CHART_DIR / "profiles"
SERVE_APPLICATION = "deployments.app:serve_application"
API_KEYS_FILE = Path("/etc/toolserve/api-keys")
API_KEYS_SECRET = "toolserve-api-keys"
"""The Secret a profile that requires API keys reads them from, unless the chart's
`apiKeysSecret` names another."""


class KubernetesProfileError(ValueError):
    """The profile cannot run as a RayService as it stands."""


def profile_values(config: ToolserveConfig) -> dict[str, Any]:
    """The profile as the chart's `profile` value: the fields the profile sets,
    plus the server fields the chart's templates read."""
    if config.server.ingress != "proxy" or config.ray.address is None:
        raise KubernetesProfileError(
            f"profile {config.name}: a RayService joins its Ray cluster through Serve's "
            "proxy; set server.ingress: proxy and ray.address: auto"
        )
    if config.server.api_keys:
        raise KubernetesProfileError(
            f"profile {config.name}: API keys belong in a Secret; set the chart's "
            f"apiKeysSecret and server.api_keys_file: {API_KEYS_FILE}"
        )
    if config.server.api_keys_file not in (None, API_KEYS_FILE):
        raise KubernetesProfileError(
            f"profile {config.name}: the chart mounts the apiKeysSecret at "
            f"{API_KEYS_FILE}; set server.api_keys_file to that path"
        )
    profile = config.model_dump(mode="json", exclude_unset=True)
    server = profile.setdefault("server", {})
    server["port"] = config.server.port
    if config.server.request_timeout_s is not None:
        server["request_timeout_s"] = config.server.request_timeout_s
    return dict(profile)


def serve_config(config: ToolserveConfig) -> dict[str, Any]:
    """Serve's declarative config for the profile: one application, built on the
    cluster by `deployments.app.serve_application` from the profile itself."""
    http_options: dict[str, Any] = {"host": "0.0.0.0", "port": config.server.port}
    if config.server.request_timeout_s is not None:
        http_options["request_timeout_s"] = config.server.request_timeout_s
    return {
        "proxy_location": "EveryNode",
        "http_options": http_options,
        "applications": [
            {
                "name": config.name,
                "route_prefix": "/",
                "import_path": SERVE_APPLICATION,
                "args": {"config": profile_values(config)},
            }
        ],
    }


def chart_values(config: ToolserveConfig, redis_service: str = "redis") -> dict[str, Any]:
    """The chart's values for the profile: the profile, and a GPU worker group
    whose pods each hold a main replica, with room for a draft deployment."""
    profile = profile_values(config)
    redis_host = urlparse(config.redis.url).hostname
    if redis_host != redis_service:
        raise KubernetesProfileError(
            f"profile {config.name}: redis.url names host {redis_host!r}; the chart's "
            f"Redis Service is {redis_service!r} (or set redis.enabled: false and "
            "point redis.url at your own)"
        )
    deployments = [config.main, *([config.draft_replicas] if config.draft_replicas else [])]
    gpus = sum(d.num_replicas * d.num_gpus for d in deployments)
    gpus_per_pod = max(1, math.ceil(config.main.num_gpus))
    pods = max(1, math.ceil(gpus / gpus_per_pod))
    return {
        "profile": profile,
        "workers": {
            "replicas": pods,
            "minReplicas": pods,
            "maxReplicas": pods,
            "gpusPerPod": gpus_per_pod,
        },
        "redis": {"serviceName": redis_service},
        **({"apiKeysSecret": API_KEYS_SECRET} if config.server.api_keys_file else {}),
    }


_WORKERS_SCHEMA = {
    "type": "object",
    "properties": {
        "groupName": {"type": "string", "minLength": 1},
        "replicas": {"type": "integer", "minimum": 0},
        "minReplicas": {"type": "integer", "minimum": 0},
        "maxReplicas": {"type": "integer", "minimum": 0},
        "gpusPerPod": {"type": "integer", "minimum": 0},
        "cpu": {"type": ["string", "number"]},
        "memory": {"type": "string"},
        "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
        "tolerations": {"type": "array", "items": {"type": "object"}},
    },
    "additionalProperties": False,
}


def values_schema() -> dict[str, Any]:
    """The chart's `values.schema.json`: `profile` is checked against the
    configuration's own schema (cluster/config.py), so a misspelt --set fails at
    install, not when the cluster starts."""
    profile_schema = ToolserveConfig.model_json_schema()
    definitions = profile_schema.pop("$defs", {})
    definitions["ToolserveConfig"] = profile_schema
    text = {"type": "string", "minLength": 1}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["profile"],
        "properties": {
            "profile": {"$ref": "#/$defs/ToolserveConfig"},
            "image": {
                "type": "object",
                "properties": {
                    "repository": text,
                    "tag": text,
                    "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                    "rayVersion": text,
                },
                "additionalProperties": False,
            },
            "securityContext": {"type": "object"},
            "head": {
                "type": "object",
                "properties": {"cpu": {"type": ["string", "number"]}, "memory": text},
                "additionalProperties": False,
            },
            "workers": _WORKERS_SCHEMA,
            "redis": {
                "type": "object",
                "properties": {
                    "enabled": {"type": "boolean"},
                    "serviceName": text,
                    "image": text,
                    "storage": text,
                    "storageClassName": {"type": "string"},
                },
                "additionalProperties": False,
            },
            "api": {
                "type": "object",
                "properties": {"serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]}},
                "additionalProperties": False,
            },
            "monitoring": {
                "type": "object",
                "properties": {
                    "podMonitor": {"type": "boolean"},
                    "grafanaDashboards": {"type": "boolean"},
                    "metricsPort": {"type": "integer", "minimum": 1, "maximum": 65535},
                    "interval": text,
                },
                "additionalProperties": False,
            },
            "gcsFaultTolerance": {
                "type": "object",
                "properties": {"enabled": {"type": "boolean"}},
                "additionalProperties": False,
            },
            "apiKeysSecret": {"type": "string"},
        },
        "additionalProperties": False,
        "$defs": definitions,
    }


def values_schema_text() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=True) + "\n"


def values_file_text(config: ToolserveConfig, source: Path) -> str:
    """A chart values file for the profile, saying where it came from."""
    header = (
        f"# Chart values for the profile {source.name}, written by\n"
        f"#   toolserve helm-values --config {source.name}\n"
        "# Edit the profile, not this file: a test holds the two equal.\n"
    )
    return header + yaml.safe_dump(chart_values(config), sort_keys=False)


def render_chart(
    values: dict[str, Any], release: str = "toolserve", namespace: str = "default"
) -> dict[str, str]:
    """The chart's manifests by template path (Helm's Go SDK, offline)."""
    import helm_python

    chart = helm_python.Chart.load(CHART_DIR)
    chart.validate_schema(values)
    return chart.render(values, name=release, namespace=namespace, is_install=True)


def manifests_text(rendered: dict[str, str]) -> str:
    """The rendered manifests as one YAML stream, as `helm template` prints them."""
    parts = [
        f"---\n# Source: {path}\n{text.strip()}\n"
        for path, text in sorted(rendered.items())
        if text.strip() and not path.endswith("NOTES.txt")
    ]
    return "".join(parts)
