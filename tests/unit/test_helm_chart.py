"""The Helm chart (helm/toolserve), rendered and linted by Helm's own Go SDK for
every shipped profile; each object validated (core kinds against Kubernetes'
schemas, the RayService against KubeRay v1.7's CRD); the Serve config inside the
RayService is the one toolserve builds from the same profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml

from cluster.config import CONFIGS_DIR, REPO_ROOT, RedisConfig, load_config
from cluster.launch.cli import main
from cluster.launch.dashboards import build_dashboards
from cluster.launch.kubernetes import (
    CHART_DIR,
    CHART_PROFILES_DIR,
    KubernetesProfileError,
    chart_values,
    render_chart,
    serve_config,
    values_file_text,
    values_schema_text,
)

KUBERNETES_VERSION = "1.30.0"
KUBERAY_CRDS = REPO_ROOT / "helm" / "schemas" / "kuberay-v1.7"
SHIPPED = sorted(CHART_PROFILES_DIR.glob("*.yaml"))
DASHBOARDS = CHART_DIR / "dashboards"


def _objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    return [
        document
        for path, text in rendered.items()
        if not path.endswith("NOTES.txt")
        for document in yaml.safe_load_all(text)
        if document
    ]


def _crd_schema(file_name: str) -> dict[str, Any]:
    crd = yaml.safe_load((KUBERAY_CRDS / file_name).read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return dict(version["schema"]["openAPIV3Schema"])


def test_the_chart_ships_the_multi_gpu_profiles() -> None:
    assert {path.stem for path in SHIPPED} >= {
        "gpu-llama-3.1-8b",
        "gpu-llama-3.1-8b-4gpu",
        "gpu-llama-3.1-70b-tp4",
    }


@pytest.mark.parametrize("values_file", SHIPPED, ids=lambda path: path.stem)
def test_a_shipped_values_file_is_its_profile_as_toolserve_writes_it(values_file: Path) -> None:
    profile = CONFIGS_DIR / values_file.name
    assert values_file.read_text() == values_file_text(load_config(profile), profile), (
        f"regenerate: toolserve helm-values --config configs/{values_file.name} "
        f"--output {values_file.relative_to(REPO_ROOT)}"
    )


def test_the_charts_dashboards_are_the_ones_toolserve_builds() -> None:
    shipped = {path.stem: json.loads(path.read_text()) for path in DASHBOARDS.glob("*.json")}
    assert shipped == build_dashboards(), (
        "regenerate: toolserve dashboards export helm/toolserve/dashboards"
    )
    values = yaml.safe_load(SHIPPED[0].read_text())
    maps = [obj for obj in _objects(render_chart(values)) if obj["kind"] == "ConfigMap"]
    assert {obj["metadata"]["labels"]["grafana_dashboard"] for obj in maps} == {"1"}
    loaded = {name: json.loads(text) for obj in maps for name, text in obj["data"].items()}
    assert loaded == {f"{uid}.json": model for uid, model in build_dashboards().items()}


def test_the_values_schema_is_the_configurations_own() -> None:
    assert (CHART_DIR / "values.schema.json").read_text() == values_schema_text(), (
        "regenerate: toolserve helm-values --schema > helm/toolserve/values.schema.json"
    )


@pytest.mark.parametrize("values_file", SHIPPED, ids=lambda path: path.stem)
def test_a_profile_renders_lints_and_validates(values_file: Path) -> None:
    values = yaml.safe_load(values_file.read_text())
    report = helm_python.lint(CHART_DIR, values, strict=True)
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report

    objects = _objects(render_chart(values, release="agents", namespace="serving"))
    kinds = sorted(obj["kind"] for obj in objects)
    assert kinds == [
        *["ConfigMap"] * len(build_dashboards()),
        *["PodMonitor", "RayService", "Service", "Service", "StatefulSet"],
    ]
    for obj in objects:
        if obj["kind"] == "RayService":
            jsonschema.validate(obj, _crd_schema("ray.io_rayservices.yaml"))
        elif obj["apiVersion"] == "monitoring.coreos.com/v1":
            endpoint = obj["spec"]["podMetricsEndpoints"][0]
            assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)

    [service] = [obj for obj in objects if obj["kind"] == "RayService"]
    config = load_config(CONFIGS_DIR / values_file.name)
    assert yaml.safe_load(service["spec"]["serveConfigV2"]) == serve_config(config)
    workers = service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    container = workers["template"]["spec"]["containers"][0]
    gpus_per_pod = container["resources"]["limits"]["nvidia.com/gpu"]
    assert config.main.num_gpus >= config.main.engine.tensor_parallel_size
    # Every replica fits on one pod: first fit, largest first, as Ray would pack them.
    free = [float(gpus_per_pod)] * workers["replicas"]
    deployments = [config.main, *([config.draft_replicas] if config.draft_replicas else [])]
    wanted = sorted((d.num_gpus for d in deployments for _ in range(d.num_replicas)), reverse=True)
    for gpus in wanted:
        pod = next((i for i, left in enumerate(free) if left >= gpus), None)
        assert pod is not None, (wanted, gpus_per_pod, workers["replicas"])
        free[pod] -= gpus


@pytest.mark.parametrize("values_file", SHIPPED, ids=lambda path: path.stem)
def test_every_ray_pod_is_a_valid_pod_whose_tools_can_confine_themselves(
    values_file: Path,
) -> None:
    """KubeRay's CRD leaves pod templates open, so each is checked as a Pod of
    its own; tool confinement needs root and CAP_SYS_ADMIN in the container."""
    values = yaml.safe_load(values_file.read_text())
    [service] = [obj for obj in _objects(render_chart(values)) if obj["kind"] == "RayService"]
    cluster = service["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [
        group["template"] for group in cluster["workerGroupSpecs"]
    ]
    for template in templates:
        pod = {"apiVersion": "v1", "kind": "Pod", **template}
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
        [container] = template["spec"]["containers"]
        assert container["image"] == "ghcr.io/toolserve/toolserve:0.1.0"
        assert container["securityContext"]["runAsUser"] == 0
        assert "SYS_ADMIN" in container["securityContext"]["capabilities"]["add"]


def test_a_crd_violation_is_caught() -> None:
    """The CRD check can fail: a RayService without its cluster spec is refused."""
    values = yaml.safe_load(SHIPPED[0].read_text())
    [service] = [obj for obj in _objects(render_chart(values)) if obj["kind"] == "RayService"]
    service["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"] = ["not", "a map"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(service, _crd_schema("ray.io_rayservices.yaml"))


def test_values_are_checked_against_the_configuration_schema() -> None:
    values = yaml.safe_load(SHIPPED[0].read_text())
    values["profile"]["main"]["num_replicaz"] = 4
    with pytest.raises(helm_python.HelmValuesError, match="num_replicaz"):
        render_chart(values)
    with pytest.raises(helm_python.HelmValuesError, match="profile"):
        render_chart({})


def test_a_profile_that_requires_api_keys_needs_their_secret() -> None:
    values = yaml.safe_load(SHIPPED[0].read_text())
    assert values["profile"]["server"]["api_keys_file"] == "/etc/toolserve/api-keys"
    rendered = _objects(render_chart(values))
    [service] = [obj for obj in rendered if obj["kind"] == "RayService"]
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head["volumes"][0]["secret"]["secretName"] == values["apiKeysSecret"]
    assert head["containers"][0]["volumeMounts"][0]["mountPath"] == "/etc/toolserve"
    values["apiKeysSecret"] = ""
    with pytest.raises(Exception, match="apiKeysSecret"):
        render_chart(values)


def test_overrides_reach_the_serve_config() -> None:
    values = yaml.safe_load(SHIPPED[0].read_text())
    values["profile"]["main"]["num_replicas"] = 3
    [service] = [obj for obj in _objects(render_chart(values)) if obj["kind"] == "RayService"]
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert serve["applications"][0]["args"]["config"]["main"]["num_replicas"] == 3
    assert "request_timeout_s" not in serve["http_options"]  # no limit, as vLLM's server
    values["profile"]["server"]["request_timeout_s"] = 900
    [service] = [obj for obj in _objects(render_chart(values)) if obj["kind"] == "RayService"]
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert serve["http_options"]["request_timeout_s"] == 900


def test_profiles_that_cannot_run_as_a_rayservice_are_refused() -> None:
    with pytest.raises(KubernetesProfileError, match=r"server\.ingress: proxy"):
        chart_values(load_config())  # the embedded default: direct ingress, local Ray
    local_redis = load_config("gpu-llama-3.1-8b.yaml").model_copy(
        update={"redis": RedisConfig(url="redis://127.0.0.1:6379/0")}
    )
    with pytest.raises(KubernetesProfileError, match="Redis Service"):
        chart_values(local_redis)


def test_render_helm_prints_the_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render-helm", "--config", "configs/gpu-llama-3.1-8b-4gpu.yaml"]) == 0
    kinds = [doc["kind"] for doc in yaml.safe_load_all(capsys.readouterr().out) if doc]
    assert "RayService" in kinds
    assert main(["render-helm", "--config", "configs/embedded-cpu.yaml"]) == 2


@pytest.mark.parametrize("values_file", SHIPPED, ids=lambda path: path.stem)
def test_the_serve_configs_import_path_builds_the_application_from_its_args(
    values_file: Path, tmp_path: Path
) -> None:
    from ray.serve import Application

    from deployments.app import serve_application

    [application] = serve_config(load_config(CONFIGS_DIR / values_file.name))["applications"]
    module, _, builder = application["import_path"].partition(":")
    assert (module, builder) == ("deployments.app", serve_application.__name__)
    server = application["args"]["config"].setdefault("server", {})
    if "api_keys_file" in server:  # the chart's Secret, mounted on every pod
        (tmp_path / "api-keys").write_text("sk-one\n")
        server["api_keys_file"] = str(tmp_path / "api-keys")
    assert isinstance(serve_application(application["args"]), Application)
