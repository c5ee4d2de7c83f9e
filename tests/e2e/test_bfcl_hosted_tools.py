"""BFCL's multi-turn backends hosted by the shared cluster: a program's scenario is
set over the API, the model's calls run on the tool workers against the
program's own backend state, which lasts across turns until the session ends.
Real Ray, Redis, vLLM (SmolLM2), the `openai` SDK and httpx."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest
from openai import OpenAI
from prometheus_text import metric_total

from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.e2e

SCENARIO = {
    "root": {
        "bob": {
            "type": "directory",
            "contents": {
                "todo.md": {"type": "file", "content": "- ship it"},
                "archive": {"type": "directory", "contents": {}},
            },
        }
    }
}


def _file_system_tools(cluster: Endpoints) -> list[dict[str, Any]]:
    response = httpx.get(f"{cluster.api_base}/tools", timeout=30)
    assert response.status_code == 200, response.text
    return [tool for tool in response.json()["data"] if tool["function"]["name"] in ("ls", "mkdir")]


def _tool_state_url(cluster: Endpoints, program: str, slot: str) -> str:
    return f"{cluster.api_base}/sessions/{program}/tool-state/{slot}"


def _as(client: OpenAI) -> dict[str, str]:
    """The caller's credentials: state belongs to the tenant its API key names."""
    return {"Authorization": f"Bearer {client.api_key}"}


def _executed(
    client: OpenAI, model: str, cluster: Endpoints, program: str, tool: str, request: str
) -> list[tuple[dict[str, Any], str]]:
    """The calls the server ran in one turn that must start with `tool`: (arguments, result)."""
    response = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": request}],
        tools=_file_system_tools(cluster),
        tool_choice={"type": "function", "function": {"name": tool}},
        temperature=0,
        max_tokens=48,
        extra_headers={"X-Session-ID": program},
    )
    extension = (response.model_extra or {}).get("toolserve")
    assert extension is not None, "the server should have run the hosted BFCL call"
    messages = extension["executed_messages"]
    calls = {
        call["id"]: call["function"]
        for message in messages
        if message["role"] == "assistant"
        for call in message["tool_calls"]
    }
    executed = [
        (calls[message["tool_call_id"]], message["content"])
        for message in messages
        if message["role"] == "tool"
    ]
    assert executed and executed[0][0]["name"] == tool
    return [(json.loads(function["arguments"] or "{}"), result) for function, result in executed]


def test_a_program_keeps_its_bfcl_file_system_across_turns_until_it_ends(
    client: OpenAI, model_name: str, cluster: Endpoints, healthy_after: None
) -> None:
    program = f"bfcl-{uuid.uuid4().hex[:8]}"
    state_url = _tool_state_url(cluster, program, "GorillaFileSystem")
    # Another caller's scenario does not reach this caller's program.
    foreign = httpx.put(state_url, json={"root": {"mallory": {"type": "directory"}}})
    assert foreign.status_code == 200, foreign.text
    put = httpx.put(state_url, json=SCENARIO, headers=_as(client))
    assert put.status_code == 200, put.text
    assert put.json()["reset"] is True

    (made_arguments, made), *_ = _executed(
        client, model_name, cluster, program, "mkdir", "Create a directory named reports."
    )
    directory = made_arguments["dir_name"]
    assert "error" not in made, made
    (_, listed), *_ = _executed(
        client, model_name, cluster, program, "ls", "List the current directory."
    )
    contents = json.loads(listed)["current_directory_content"]
    assert {"todo.md", "archive", directory} <= set(contents), (directory, contents)

    # Another program has its own (BFCL's default, empty) file system.
    (_, elsewhere), *_ = _executed(
        client, model_name, cluster, f"{program}-b", "ls", "List the current directory."
    )
    assert "todo.md" not in json.loads(elsewhere)["current_directory_content"]

    # Ending the session drops the state: the program starts from the default again.
    ended = httpx.delete(f"{cluster.api_base}/sessions/{program}", headers=_as(client), timeout=30)
    assert ended.status_code == 200, ended.text
    (_, after_end), *_ = _executed(
        client, model_name, cluster, program, "ls", "List the current directory."
    )
    assert "todo.md" not in json.loads(after_end)["current_directory_content"]


def test_tool_state_rejects_unknown_slots_and_non_object_scenarios(cluster: Endpoints) -> None:
    unknown = httpx.put(_tool_state_url(cluster, "p", "NoSuchApi"), json={})
    assert unknown.status_code == 404
    error = unknown.json()["error"]
    assert error["code"] == "not_found" and error["param"] == "slot"
    assert "GorillaFileSystem" in error["message"]
    for body in (b"[1, 2]", b"not json"):
        rejected = httpx.put(_tool_state_url(cluster, "p", "GorillaFileSystem"), content=body)
        assert rejected.status_code == 422, rejected.text
        assert rejected.json()["error"]["code"] == "unprocessable_entity"


def _cache_hits(cluster: Endpoints, tool: str) -> float:
    text = httpx.get(cluster.metrics_url, timeout=30).text
    return metric_total(text, "toolserve_tool_cache_hits_total", tool=tool)


def test_a_reading_call_is_reused_until_the_programs_state_changes(
    client: OpenAI, model_name: str, cluster: Endpoints, healthy_after: None
) -> None:
    """`ls` only reads the file system: its result is shared while the program's
    state is unchanged (a speculated `ls` is used this way), and a call that
    changes the state makes the next `ls` run again on the new state."""
    program = f"bfcl-reader-{uuid.uuid4().hex[:8]}"
    put = httpx.put(
        _tool_state_url(cluster, program, "GorillaFileSystem"), json=SCENARIO, headers=_as(client)
    )
    assert put.status_code == 200, put.text
    hits_before = _cache_hits(cluster, "ls")

    def listing() -> list[str]:
        (_, listed), *_ = _executed(
            client, model_name, cluster, program, "ls", "List the current directory."
        )
        return list(json.loads(listed)["current_directory_content"])

    first = listing()
    assert set(first) == {"todo.md", "archive"}
    assert listing() == first
    deadline = time.monotonic() + 60
    while _cache_hits(cluster, "ls") < hits_before + 1 and time.monotonic() < deadline:
        time.sleep(2)
    assert _cache_hits(cluster, "ls") >= hits_before + 1, "the second ls reused the first's run"

    (made_arguments, made), *_ = _executed(
        client, model_name, cluster, program, "mkdir", "Create a directory named reports."
    )
    assert "error" not in made, made
    assert set(listing()) == {"todo.md", "archive", made_arguments["dir_name"]}
    httpx.delete(f"{cluster.api_base}/sessions/{program}", headers=_as(client), timeout=30)
