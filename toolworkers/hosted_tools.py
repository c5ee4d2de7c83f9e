"""Tools the cluster can host, declared for the registry: a calculator and
read-only file tools over a data directory (option `root`, bound in
configuration). Each runs in a tool worker's sandbox."""

from __future__ import annotations

from pathlib import Path

from toolworkers.builtin_tools import Workspace, calculate, string_parameter
from toolworkers.registry import CostClass, hosted_tool


@hosted_tool(
    name="calculator",
    description="Evaluate an arithmetic expression such as '(12.5 + 7) * 3'.",
    parameters=string_parameter("expression", "The arithmetic expression"),
    side_effect_free=True,
    program_scoped=False,
    timeout_s=2.0,
)
def calculator(expression: str) -> str:
    return calculate(expression)


@hosted_tool(
    name="list_files",
    description="List the files in a directory of the data directory.",
    parameters=string_parameter("directory", "Directory relative to the data directory, e.g. '.'"),
    side_effect_free=True,
)
def list_files(directory: str = ".", *, root: str) -> str:
    return Workspace(Path(root)).list_files(directory)


@hosted_tool(
    name="read_file",
    description="Read a text file of the data directory.",
    parameters=string_parameter("path", "File path relative to the data directory"),
    side_effect_free=True,
)
def read_file(path: str, *, root: str) -> str:
    return Workspace(Path(root)).read_file(path)


@hosted_tool(
    name="search_files",
    description="Find the lines of the data directory's files that contain a text.",
    parameters=string_parameter("text", "Text to look for (case-insensitive)"),
    side_effect_free=True,
    cost_class=CostClass.MODERATE,
)
def search_files(text: str, *, root: str) -> str:
    return Workspace(Path(root)).search_files(text)
