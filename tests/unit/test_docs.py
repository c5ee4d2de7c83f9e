"""The README is a front door and the documentation a site: the README stays
small and starts with the two commands and the architecture's link, the
configuration reference is what `toolserve config-reference` writes from the
model, and the site builds with strict link checking."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from cluster.config import REPO_ROOT
from cluster.launch.config_reference import (
    REFERENCE_PAGE,
    config_reference,
    model_paths,
    undescribed_fields,
)

README = REPO_ROOT / "README.md"
README_LIMIT_BYTES = 12 * 1024
# The site must build fast enough to run with the unit tests.
BUILD_TIMEOUT_S = 60


def test_the_readme_stays_a_front_door() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT_BYTES, f"README.md is {size} bytes: move detail into docs/"


def test_the_readme_keeps_the_two_commands() -> None:
    readme = README.read_text()
    assert "bash cluster/setup.sh toolserve up --demo\n" in readme
    assert "bash cluster/setup.sh pytest\n" in readme


def test_the_readme_links_the_architecture_before_its_first_section() -> None:
    readme = README.read_text()
    assert "](ARCHITECTURE.md)" in readme[: readme.index("\n## ")]


def test_every_configuration_field_has_a_description() -> None:
    assert undescribed_fields() == []


class _Inner(BaseModel):
    described: int = Field(default=0, description="Has one.")
    bare: int = 0


class _Outer(BaseModel):
    items: list[_Inner] = Field(default_factory=list, description="Inner models.")


def test_a_field_without_a_description_is_named() -> None:
    assert undescribed_fields(_Outer) == ["_Inner.bare"]
    assert model_paths(_Outer)[_Inner] == ["items[]"]


def test_the_configuration_reference_is_what_the_command_writes() -> None:
    assert REFERENCE_PAGE.read_text() == config_reference(), (
        "regenerate it with `toolserve config-reference`"
    )


def test_the_site_builds_with_strict_link_checking(tmp_path: Path) -> None:
    site = tmp_path / "site"
    before = _written_by_a_build()
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "NO_MKDOCS_2_WARNING": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert build.returncode == 0, build.stderr
    assert (site / "index.html").exists()
    assert (site / "docs" / "recorded-runs" / "index.html").exists()
    assert (site / "ARCHITECTURE" / "index.html").exists()
    assert _written_by_a_build() == before, "the build wrote into the repository"


def _written_by_a_build() -> list[Path]:
    """What a build would leave in the repository: the default site folder, and
    the hook's bytecode (mkdocs imports it by path)."""
    candidates = [REPO_ROOT / "site", REPO_ROOT / "docs" / "_hooks" / "__pycache__"]
    return [path for path in candidates if path.exists()]
