"""The layering in pyproject.toml's import-linter contracts holds, and breaks on
an import that runs back up (across the project, or across deployments/'s
processes), one engine mechanism importing another, or a pure policy importing
Ray, vLLM, Redis or HTTP (checked on a copy of the code with one import added)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.config import REPO_ROOT

PACKAGES = ("cluster", "deployments", "router", "toolworkers", "bench")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=root,
        env=os.environ | {"PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
    )


@pytest.mark.code_checks
def test_the_code_keeps_its_layers() -> None:
    result = _lint_imports(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("cluster/store/pins.py", "toolworkers.tool_state"),  # the ground reaching up
        ("cluster/config.py", "bench.runner"),
        ("toolworkers/registry.py", "deployments.app"),  # tools knowing the serving layer
        ("toolworkers/cache_keys.py", "router.policy"),  # siblings
        ("router/policy.py", "cluster.launch.launcher"),  # anything importing the roof
        ("bench/driver.py", "deployments.api.ingress"),  # the benchmark bypassing the API
        ("deployments/app.py", "bench.systems"),
        ("cluster/store/pins.py", "cluster.policies.ttl_cost_model"),  # ground siblings
        ("cluster/policies/draft_gate.py", "vllm"),  # a pure policy reaching the engine
        ("cluster/policies/ttl_cost_model.py", "ray"),
        ("router/policy.py", "redis"),
        ("toolworkers/predictor.py", "httpx"),
        ("toolworkers/cache_keys.py", "fastapi"),
        ("deployments/engine/setup.py", "deployments.replica.model_server"),  # the engine
        ("deployments/replica/continuation.py", "deployments.api.tool_api"),  # reaching up
        ("deployments/api/parsing.py", "deployments.app"),
        ("deployments/turn.py", "deployments.replica.continuation"),
        ("deployments/errors.py", "deployments.turn"),
        ("deployments/engine/pinning/scheduler.py", "deployments.engine.admission.scheduler"),
        ("deployments/engine/prompt_lookup/scheduler.py", "deployments.engine.pinning.settings"),
        ("deployments/engine/admission/settings.py", "deployments.engine.prompt_lookup.settings"),
    ],
)
def test_an_import_against_the_layers_breaks_the_contract(
    tmp_path: Path, module: str, imported: str
) -> None:
    for package in PACKAGES:
        shutil.copytree(
            REPO_ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("results")
        )
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / module).open("a") as source:
        source.write(f"\nimport {imported}  # noqa\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout, result.stdout
