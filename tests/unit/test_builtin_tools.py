from __future__ import annotations

from pathlib import Path

import pytest

from toolworkers.builtin_tools import ToolError, Workspace, calculate


@pytest.mark.parametrize(
    ("expression", "value"),
    [("1 + 2 * 3", "7"), ("(12.5 + 7.25) * 2", "39.5"), ("-2 ** 2", "-4"), ("7 // 2", "3")],
)
def test_calculator_evaluates_arithmetic(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression", ["__import__('os')", "x + 1", "1 +", "2 ** 99999", "1 / 0", "[1, 2]"]
)
def test_calculator_refuses_everything_else(expression: str) -> None:
    with pytest.raises(ToolError):
        calculate(expression)


@pytest.fixture()
def workspace(tmp_path: Path) -> Workspace:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha\nBeta line\n")
    (tmp_path / "sub" / "b.txt").write_text("gamma beta\n")
    return Workspace(tmp_path)


def test_files_are_listed_and_read(workspace: Workspace) -> None:
    assert workspace.list_files(".").splitlines() == ["a.txt", "sub/b.txt"]
    assert workspace.read_file("sub/b.txt") == "gamma beta\n"
    assert workspace.search_files("BETA").splitlines() == [
        "a.txt:2: Beta line",
        "sub/b.txt:1: gamma beta",
    ]


@pytest.mark.parametrize("path", ["../etc/passwd", "sub/../../x", "/../../etc/passwd"])
def test_paths_cannot_leave_the_workspace(workspace: Workspace, path: str) -> None:
    with pytest.raises(ToolError, match="outside the workspace"):
        workspace.read_file(path)
