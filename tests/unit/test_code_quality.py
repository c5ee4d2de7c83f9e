"""ruff and mypy are part of the README's test command; CI runs them as its own first step
(`cluster/check-code.sh`) and deselects these tests (marker `code_checks`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cluster.config import REPO_ROOT

pytestmark = pytest.mark.code_checks


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=REPO_ROOT, capture_output=True, text=True
    )


def test_ruff_lint_and_format() -> None:
    lint = _run("ruff", "check", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr
    formatting = _run("ruff", "format", "--check", ".")
    assert formatting.returncode == 0, formatting.stdout + formatting.stderr


def test_mypy_strict() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
