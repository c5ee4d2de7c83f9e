"""The demo agent's own tools, run client-side over its workspace."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.launch.demo import run_tool_call, workspace_tools
from toolworkers.builtin_tools import Workspace
from toolworkers.hosted_tools import list_files, read_file
from toolworkers.registry import declared_spec


def test_tool_calls_report_failures_as_text(tmp_path: Path) -> None:
    functions = {spec.name: f for spec, f in workspace_tools(Workspace(tmp_path))}
    assert run_tool_call(functions, "calculator", json.dumps({"expression": "2+2"})) == "4"
    assert run_tool_call(functions, "nope", "{}").startswith("error: unknown tool")
    assert run_tool_call(functions, "read_file", "{bad").startswith(
        "error: arguments are not valid JSON"
    )
    assert run_tool_call(functions, "read_file", "[]").startswith("error: arguments must be")
    assert run_tool_call(functions, "read_file", '{"wrong": 1}').startswith("error: bad arguments")
    assert "no file" in run_tool_call(functions, "read_file", '{"path": "missing.txt"}')


def test_file_tools_keep_hosted_names_with_schemas_of_their_own(tmp_path: Path) -> None:
    """The server continues a call only when the request declared the hosted
    schema; the demo's file tools must stay the demo's."""
    demo = {spec.name: spec.openai_schema() for spec, _ in workspace_tools(Workspace(tmp_path))}
    for hosted in (list_files, read_file):
        spec = declared_spec(hosted, hosted.__name__)
        assert spec.name in demo
        assert demo[spec.name] != spec.openai_schema()
        assert demo[spec.name]["function"]["parameters"]["type"] == "object"
