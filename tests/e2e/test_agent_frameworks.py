"""Unmodified agent frameworks work against the API: openai-agents and langchain-openai."""

from __future__ import annotations

import asyncio

import pytest

from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.e2e


def test_langchain_openai_tool_call_and_stream(cluster: Endpoints, model_name: str) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    llm = ChatOpenAI(
        model=model_name,
        base_url=cluster.api_base,
        api_key="test",  # type: ignore[arg-type]
        temperature=0,
        max_completion_tokens=64,
        max_retries=0,
    )
    with_tools = llm.bind_tools([multiply], tool_choice="multiply")
    question = HumanMessage("What is 6 times 7?")
    reply = with_tools.invoke([question])
    assert reply.tool_calls and reply.tool_calls[0]["name"] == "multiply"
    arguments = reply.tool_calls[0]["args"]
    assert set(arguments) == {"a", "b"}

    streamed = None
    for chunk in with_tools.stream([question]):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None
    assert streamed.tool_calls[0]["name"] == "multiply"  # type: ignore[attr-defined]
    assert streamed.tool_calls[0]["args"] == arguments  # type: ignore[attr-defined]

    result = multiply.invoke(arguments)
    tool_message = ToolMessage(str(result), tool_call_id=reply.tool_calls[0]["id"])
    final = llm.invoke([question, reply, tool_message])
    assert isinstance(final.content, str) and final.content.strip(), final
    assert not final.tool_calls  # no tools bound: an answer in text


def test_openai_agents_runs_a_tool(cluster: Endpoints, model_name: str) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def lookup_capital(country: str) -> str:
        """Return the capital city of a country."""
        calls.append(country)
        return "Paris" if country.lower() == "france" else "unknown"

    client = AsyncOpenAI(base_url=cluster.api_base, api_key="test", max_retries=0)
    agent = Agent(
        name="geo",
        instructions="Answer with the help of tools.",
        model=OpenAIChatCompletionsModel(model=model_name, openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=64, tool_choice="required"),
        tools=[lookup_capital],
        reset_tool_choice=True,
    )
    result = asyncio.run(Runner.run(agent, "What is the capital of France?", max_turns=4))
    assert calls, "the agent never executed its tool"
    tool_outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    assert [item.output for item in tool_outputs] == [
        "Paris" if country.lower() == "france" else "unknown" for country in calls
    ]
    assert isinstance(result.final_output, str) and result.final_output.strip(), result
