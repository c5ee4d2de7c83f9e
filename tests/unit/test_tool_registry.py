"""Hosted tools named in configuration become a registry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tool_paths import owned_by_tools

from cluster.config import HostedToolConfig, SandboxLimits, ToolCacheConfig, ToolsConfig
from toolworkers.registry import CostClass, RegistryError, ToolRegistry
from toolworkers.sandbox import SandboxCall, run_sandboxed


def registry(*entries: HostedToolConfig) -> ToolRegistry:
    return ToolRegistry.from_config(
        ToolsConfig(hosted=list(entries), cache=ToolCacheConfig(keep_alive_s=120))
    )


def test_declared_tools_resolve_with_their_properties() -> None:
    tools = registry(
        HostedToolConfig(function="toolworkers.hosted_tools:calculator"),
        HostedToolConfig(function="toolworkers.hosted_tools:search_files", options={"root": "/d"}),
    )
    assert tools.names() == ["calculator", "search_files"]
    calculator = tools.get("calculator")
    assert calculator is not None
    assert calculator.spec.side_effect_free and not calculator.spec.program_scoped
    assert calculator.keep_alive_s == 120
    search = tools.get("search_files")
    assert search is not None
    assert search.spec.cost_class is CostClass.MODERATE
    assert search.options == {"root": "/d"}
    schema = tools.openai_schemas()[0]["function"]
    assert schema["name"] == "calculator"
    assert schema["parameters"]["required"] == ["expression"]


def test_configuration_overrides_the_declaration() -> None:
    tools = registry(
        HostedToolConfig(
            function="toolworkers.hosted_tools:read_file",
            name="read_doc",
            timeout_s=1.5,
            side_effect_free=False,
            keep_alive_s=9,
        )
    )
    tool = tools.get("read_doc")
    assert tool is not None
    assert (tool.spec.timeout_s, tool.keep_alive_s) == (1.5, 9)
    assert not tools.speculable("read_doc")
    assert not tools.speculable("no_such_tool")


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("toolworkers.hosted_tools", "not of the form"),
        ("no_such_module_xyz:tool", "cannot import"),
        ("toolworkers.hosted_tools:nothing", "has no"),
        ("toolworkers.builtin_tools:calculate", "not declared with @hosted_tool"),
    ],
)
def test_bad_references_are_clear_errors(reference: str, message: str) -> None:
    with pytest.raises(RegistryError, match=message):
        registry(HostedToolConfig(function=reference))


def test_two_tools_cannot_share_a_name() -> None:
    with pytest.raises(RegistryError, match="two hosted tools are named 'calculator'"):
        registry(
            HostedToolConfig(function="toolworkers.hosted_tools:calculator"),
            HostedToolConfig(function="toolworkers.hosted_tools:read_file", name="calculator"),
        )


def test_hosted_file_tools_run_in_the_sandbox_on_their_data_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("alpha\nbeta gamma\n")
    data = owned_by_tools(tmp_path)
    tools = registry(
        HostedToolConfig(function="toolworkers.hosted_tools:search_files", options={"root": data}),
        HostedToolConfig(function="toolworkers.hosted_tools:read_file", options={"root": data}),
    )

    def run(name: str, arguments: dict[str, str]) -> str:
        tool = tools.get(name)
        assert tool is not None
        call = SandboxCall(tool.function_reference, arguments, tool.options, tool.spec.timeout_s)
        return asyncio.run(run_sandboxed(call, SandboxLimits())).for_model()

    assert run("search_files", {"text": "GAMMA"}) == "notes.txt:2: beta gamma"
    assert run("read_file", {"path": "notes.txt"}) == "alpha\nbeta gamma\n"
    assert "outside the workspace" in run("read_file", {"path": "../../etc/passwd"})
