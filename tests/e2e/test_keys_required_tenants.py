"""Two tenants on a cluster that requires API keys (the embedded profile with
`server.api_keys_file`, as the GPU profiles run): a missing or unknown key is
refused, and two keys using the same session id share nothing: not pins or the
TTL ledger, sessions, tool state, cached tool outputs, kept replies, learned
predictions or the engine's prefix cache. Real Ray, Redis, vLLM (SmolLM2), the
`openai` SDK and httpx."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from prometheus_text import metric_total
from tool_paths import owned_by_tools

from bench.tools import record_text
from cluster.config import HostedToolConfig, ToolserveConfig, load_config
from cluster.launch.launcher import Endpoints, LocalCluster
from cluster.net import free_port
from cluster.policies.tenancy import scoped_program_id
from cluster.store.pins import TtlLedger
from deployments.api.tenants import tenant_of

pytestmark = pytest.mark.e2e

KEY_A = "sk-tenant-alice-0c1d"
KEY_B = "sk-tenant-bob-7e2f"
CACHE_HEADER = "x-toolserve-cache"
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
LOOKUP_CHOICE: Any = {"type": "function", "function": {"name": "lookup_record"}}


@pytest.fixture(scope="module")
def lookup_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One line per run of the cluster's `lookup_record` tool."""
    return tmp_path_factory.mktemp("keyed-lookup") / "runs.log"


@pytest.fixture(scope="module")
def keyed_config(tmp_path_factory: pytest.TempPathFactory, lookup_runs: Path) -> ToolserveConfig:
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys"
    keys_file.write_text(f"# the two tenants\n{KEY_A}\n{KEY_B}\n")
    config = load_config()
    lookup = HostedToolConfig(
        function="bench.tools:lookup_record",
        options={"latency_s": 0.5, "ledger": owned_by_tools(lookup_runs, create_file=True)},
    )
    return config.model_copy(
        update={
            "server": config.server.model_copy(
                update={"port": free_port(), "api_keys_file": keys_file}
            ),
            "ray": config.ray.model_copy(update={"metrics_export_port": free_port()}),
            "tools": config.tools.model_copy(update={"hosted": [*config.tools.hosted, lookup]}),
        }
    )


@pytest.fixture(scope="module")
def keyed_cluster(keyed_config: ToolserveConfig) -> Iterator[Endpoints]:
    with LocalCluster(keyed_config, log=lambda line: print(f"[keyed] {line}")) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def model(keyed_config: ToolserveConfig) -> str:
    return keyed_config.main.engine.served_model_name


def _as(cluster: Endpoints, key: str) -> OpenAI:
    return OpenAI(base_url=cluster.api_base, api_key=key, max_retries=0, timeout=180)


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _wait_for(check: Any, timeout_s: float = 20) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def _program_of(key: str, session: str) -> str:
    return scoped_program_id(tenant_of(f"Bearer {key}"), session)


def test_a_missing_or_unknown_key_is_refused(keyed_cluster: Endpoints, model: str) -> None:
    request = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for headers in ({}, _auth("sk-not-a-tenant")):
        refused = httpx.post(
            f"{keyed_cluster.api_base}/chat/completions", json=request, headers=headers, timeout=60
        )
        assert refused.status_code == 401, refused.text
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        _as(keyed_cluster, "sk-not-a-tenant").models.list()
    assert model in [entry.id for entry in _as(keyed_cluster, KEY_A).models.list()]


def test_one_session_id_under_two_keys_shares_no_pin_ledger_entry_or_session(
    keyed_cluster: Endpoints, model: str
) -> None:
    session = f"shared-{uuid.uuid4().hex[:8]}"
    for key, city in ((KEY_A, "Paris"), (KEY_B, "Oslo")):
        reply = _as(keyed_cluster, key).chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"What is the weather in {city}?"}],
            tools=[WEATHER_TOOL],
            tool_choice="required",
            max_tokens=48,
            temperature=0,
            extra_headers={"X-Session-ID": session},
        )
        assert reply.choices[0].message.tool_calls, "the turn should end with a call"

    ledger = TtlLedger(keyed_cluster.redis_url)
    try:
        pin_a = _wait_for(lambda: ledger.lookup(_program_of(KEY_A, session)))
        pin_b = _wait_for(lambda: ledger.lookup(_program_of(KEY_B, session)))
        assert pin_a and pin_b, "each tenant's turn pins its own program"
        assert pin_a.program_id != pin_b.program_id
        assert ledger.lookup(session) is None, "no pin under the bare session id"
        for key in (KEY_A, KEY_B):
            seen = httpx.get(
                f"{keyed_cluster.api_base}/sessions/{session}", headers=_auth(key), timeout=30
            )
            assert seen.status_code == 200, seen.text
            assert seen.json()["id"] == session and seen.json()["pinned"]

        ended = httpx.delete(
            f"{keyed_cluster.api_base}/sessions/{session}", headers=_auth(KEY_A), timeout=30
        )
        assert ended.status_code == 200, ended.text
        assert _wait_for(lambda: ledger.lookup(_program_of(KEY_A, session)) is None)
        assert ledger.lookup(_program_of(KEY_B, session)) is not None, "A's end ended B's program"
        gone = httpx.get(
            f"{keyed_cluster.api_base}/sessions/{session}", headers=_auth(KEY_A), timeout=30
        )
        assert gone.status_code == 404
        kept = httpx.get(
            f"{keyed_cluster.api_base}/sessions/{session}", headers=_auth(KEY_B), timeout=30
        )
        assert kept.status_code == 200 and kept.json()["pinned"]
    finally:
        ledger.close()


def _listing(cluster: Endpoints, model: str, key: str, session: str) -> str:
    """What the hosted BFCL `ls` answers for the program: its file system."""
    tools = httpx.get(f"{cluster.api_base}/tools", headers=_auth(key), timeout=30).json()["data"]
    reply = _as(cluster, key).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "List the current directory."}],
        tools=[tool for tool in tools if tool["function"]["name"] in ("ls", "mkdir")],
        tool_choice={"type": "function", "function": {"name": "ls"}},
        temperature=0,
        max_tokens=48,
        extra_headers={"X-Session-ID": session},
    )
    executed = ((reply.model_extra or {}).get("toolserve") or {}).get("executed_messages")
    assert executed, "the server should have run the hosted ls call"
    return str(executed[1]["content"])


def test_one_session_id_under_two_keys_has_two_tool_states(
    keyed_cluster: Endpoints, model: str
) -> None:
    session = f"state-{uuid.uuid4().hex[:8]}"
    for key, owner in ((KEY_A, "alice_notes"), (KEY_B, "bob_ledger")):
        own_file = {f"{owner}.md": {"type": "file", "content": f"{owner}'s"}}
        scenario = {"root": {"workspace": {"type": "directory", "contents": own_file}}}
        put = httpx.put(
            f"{keyed_cluster.api_base}/sessions/{session}/tool-state/GorillaFileSystem",
            json=scenario,
            headers=_auth(key),
            timeout=30,
        )
        assert put.status_code == 200, put.text
    seen_by_a = _listing(keyed_cluster, model, KEY_A, session)
    seen_by_b = _listing(keyed_cluster, model, KEY_B, session)
    assert "alice_notes" in seen_by_a and "bob_ledger" not in seen_by_a
    assert "bob_ledger" in seen_by_b and "alice_notes" not in seen_by_b


def _lookup_turn(
    client: OpenAI, model: str, agent: list[Any], session: str | None = None, **extra: Any
) -> Any:
    tools = httpx.get(
        f"{client.base_url}tools", headers=_auth(str(client.api_key)), timeout=30
    ).json()["data"]
    return client.chat.completions.create(
        model=model,
        messages=agent,
        tools=[tool for tool in tools if tool["function"]["name"] == "lookup_record"],
        tool_choice=LOOKUP_CHOICE,
        temperature=0,
        max_tokens=48,
        extra_headers={"X-Session-ID": session or f"lookup-{uuid.uuid4().hex[:8]}"},
        **extra,
    )


def _runs(ledger: Path) -> list[str]:
    return ledger.read_text().splitlines() if ledger.exists() else []


def _learned_speculations(cluster: Endpoints) -> float:
    text = httpx.get(cluster.metrics_url, timeout=30).text
    return float(metric_total(text, "toolserve_speculations_issued_total", source="learned"))


def test_one_tenants_tool_outputs_and_learned_calls_never_serve_another(
    keyed_cluster: Endpoints, model: str, lookup_runs: Path
) -> None:
    tenant_a, tenant_b = _as(keyed_cluster, KEY_A), _as(keyed_cluster, KEY_B)
    agent = [
        {"role": "system", "content": f"You are records agent {uuid.uuid4().hex[:6]}."},
        {"role": "user", "content": "Look up the record INC-7310 and summarize it."},
    ]
    # Two turns whose calls go back to the client: A's learned predictor now
    # foresees this agent's lookup.
    probes = [
        _lookup_turn(tenant_a, model, agent, extra_body={"toolserve": {"execute_tools": False}})
        for _ in range(2)
    ]
    calls = [(probe.choices[0].message.tool_calls or [None])[0] for probe in probes]
    assert calls[0] is not None and calls[1] is not None
    record = record_text(json.loads(calls[0].function.arguments)["key"])
    learned_before = _learned_speculations(keyed_cluster)
    # The records tool's outputs are cached per program: both keys use one session id.
    session = f"records-{uuid.uuid4().hex[:8]}"

    runs_before = len(_runs(lookup_runs))
    assert _executed_output(_lookup_turn(tenant_b, model, agent, session)) == record
    assert len(_runs(lookup_runs)) >= runs_before + 1, "B's call was served A's output"

    runs_before = len(_runs(lookup_runs))
    assert _executed_output(_lookup_turn(tenant_a, model, agent, session)) == record
    assert len(_runs(lookup_runs)) == runs_before + 1, "A's call was served B's output"
    # Counters reach the metrics a few seconds late: once A's own speculation
    # shows, B's turn (earlier, same process) would show too.
    assert _wait_for(lambda: _learned_speculations(keyed_cluster) > learned_before, 90), (
        "A's own learned prediction should have run A's lookup early"
    )
    assert _learned_speculations(keyed_cluster) == learned_before + 1, (
        "A's learned calls were speculated for B too"
    )
    assert _executed_output(_lookup_turn(tenant_a, model, agent, session)) == record
    assert len(_runs(lookup_runs)) == runs_before + 1, "A's lookup ran once, reused within A"


def _executed_output(reply: Any) -> str:
    executed = ((reply.model_extra or {}).get("toolserve") or {}).get("executed_messages")
    assert executed, "the server should have run the lookup"
    return str(executed[1]["content"])


def test_kept_replies_and_cached_prefixes_stay_with_their_tenant(
    keyed_cluster: Endpoints, model: str
) -> None:
    marker = uuid.uuid4().hex
    prompt = f"Reference {marker}. " + " ".join(
        f"line {n}: the value is {n * 7}." for n in range(60)
    )

    def ask(key: str, **headers: str) -> tuple[str | None, int]:
        raw = _as(keyed_cluster, key).chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=4,
            temperature=0,
            extra_headers=headers,
        )
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        return raw.headers.get(CACHE_HEADER), usage.prompt_tokens_details.cached_tokens or 0

    assert ask(KEY_A)[0] == "miss"
    assert ask(KEY_A)[0] == "hit", "A's own reply should be kept"
    kept_for_b, cached_for_b = ask(KEY_B)
    assert kept_for_b == "miss", "B was answered with A's kept reply"
    assert cached_for_b == 0, "B hit A's cached prefix"
    assert ask(KEY_B, **{"Cache-Control": "no-cache"})[1] > 0, "B's own prefix was not kept"
