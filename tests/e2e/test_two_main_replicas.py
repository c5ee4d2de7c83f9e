"""Two main-model replicas behind the session router, on the real stack. The
dashboards' queries, evaluated by a real Prometheus scraping the cluster after a
few agent programs and the turns that fill the other panels, all return data, and
`toolserve dashboards render` draws them from it. Every turn of a program lands
on one replica; when that replica dies between turns, the next turn is served by
the other, no request fails, and the dead replica's TTL-ledger entry goes away
(long before its pin would have expired); when one dies while agents run, no turn
fails."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import redis
from load_agents import API_KEY, AUTH, Agent, calculator_tool, run_agents, turns_more
from openai import OpenAI
from programs import cluster_program_id
from written_calls import CALCULATOR_FEW_SHOT, invalid_calculator_call, written_turn

from cluster.config import ToolserveConfig, load_config
from cluster.launch.dashboards import build_dashboards, panel_queries
from cluster.launch.launcher import Endpoints, LocalCluster
from cluster.launch.prometheus import PrometheusServer
from cluster.net import free_port
from cluster.store.pins import TtlLedger
from deployments.api.chat import REPLICA_HEADER
from deployments.api.parsing import SESSION_HEADER
from deployments.app import MAIN_DEPLOYMENT

pytestmark = pytest.mark.e2e

PIN_TTL_S = 120.0
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file of the project.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def two_replica_config() -> ToolserveConfig:
    config = load_config()
    pinning = config.main.pinning.model_copy(
        update={"mode": "fixed", "fixed_ttl_s": PIN_TTL_S, "max_ttl_s": PIN_TTL_S}
    )
    return config.model_copy(
        update={
            "name": "toolserve-routing",
            "draft": None,
            "main_placement": "own_replicas",
            "main": config.main.model_copy(
                update={
                    "num_replicas": 2,
                    "cpu_threads_bind_by_local_rank": ["0", "1"],
                    "pinning": pinning,
                }
            ),
            "server": config.server.model_copy(update={"port": free_port()}),
            "ray": config.ray.model_copy(update={"metrics_export_port": free_port()}),
        }
    )


@pytest.fixture(scope="module")
def two_replicas(two_replica_config: ToolserveConfig) -> Iterator[Endpoints]:
    with LocalCluster(two_replica_config, log=lambda line: print(f"[routing] {line}")) as cluster:
        yield cluster


def _turn(client: OpenAI, model: str, program: str, messages: list[Any]) -> str:
    """One tool-calling turn; appends the reply and a tool result; returns the replica."""
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        max_tokens=48,
        temperature=0,
        extra_headers={SESSION_HEADER: program},
    )
    message = raw.parse().choices[0].message
    assert message.tool_calls, "tool_choice=required must yield a call"
    call = message.tool_calls[0]
    messages.append(message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "def main(): pass\n"})
    return raw.headers[REPLICA_HEADER]


def _wait_for(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def _ready_main_replicas(endpoints: Endpoints) -> list[str]:
    health = httpx.get(endpoints.health_url, timeout=30).json()
    return [
        engine["replica"]
        for engine in health["engines"]
        if engine["role"] == "main" and engine["state"] == "ready"
    ]


def _speculate_then_search(endpoints: Endpoints, model: str) -> None:
    """What the tools dashboard's speculation and partial-execution panels show:
    two turns that hand a calculator call back teach the learned predictor, so
    the same turn run by the server speculates the call, uses it and saves the
    model's call its run, and its engine drafts the call's tokens from the
    prediction; a streamed search call runs on its partial input."""
    client = OpenAI(base_url=endpoints.api_base, api_key=API_KEY, max_retries=0, timeout=180)
    agent = uuid.uuid4().hex[:8]
    for run_here in (False, False, True):
        client.chat.completions.create(
            model=model,
            messages=CALCULATOR_FEW_SHOT,  # type: ignore[arg-type]
            tools=[calculator_tool(endpoints)],
            tool_choice="auto",
            temperature=0,
            max_tokens=64,
            extra_headers={SESSION_HEADER: f"speculation-{agent}-{uuid.uuid4().hex[:6]}"},
            extra_body={"toolserve": {"execute_tools": run_here}},
        )
    listed = httpx.get(f"{endpoints.api_base}/tools", headers=AUTH, timeout=30).json()["data"]
    search = [tool for tool in listed if tool["function"]["name"] == "search"]
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Search the notes for how KV pinning works."}],
        tools=search,
        tool_choice="required",
        temperature=0,
        max_tokens=128,
        stream=True,
        extra_headers={SESSION_HEADER: f"partial-{agent}"},
    )
    for _ in stream:
        pass


def _repeat_then_stop_a_call(endpoints: Endpoints, model: str) -> None:
    """What the response-cache and stopped-call panels show: a greedy question
    asked twice (the repeat is answered from the kept reply) and a calculator
    call written with a number for its expression, stopped while it streams."""
    client = OpenAI(base_url=endpoints.api_base, api_key=API_KEY, max_retries=0, timeout=180)
    question = [{"role": "user", "content": f"Name a colour. ({uuid.uuid4().hex[:8]})"}]
    answered = [
        client.chat.completions.with_raw_response.create(
            model=model,
            messages=question,
            temperature=0,
            max_tokens=8,  # type: ignore[arg-type]
        ).headers.get("x-toolserve-cache")
        for _ in range(2)
    ]
    assert answered == ["miss", "hit"], answered
    executed = written_turn(
        client,
        model,
        [{"role": "user", "content": "What is 1234 * 5678?"}],
        [calculator_tool(endpoints)],
        invalid_calculator_call(),
    )
    assert "stopped while it was written" in executed[1]["content"], executed


def test_every_dashboard_query_returns_data_on_a_real_prometheus(
    two_replicas: Endpoints, two_replica_config: ToolserveConfig, tmp_path: Path
) -> None:
    prometheus = PrometheusServer(tmp_path, [urlparse(two_replicas.metrics_url).netloc])
    prometheus.start()
    started = datetime.now(UTC)
    try:
        assert _wait_for(lambda: len(_ready_main_replicas(two_replicas)) == 2, 180)
        model = two_replica_config.main.engine.served_model_name
        calculator = calculator_tool(two_replicas)
        agents = [
            Agent(two_replicas, model, calculator, tool_latency_s=(0.5, 1.5)) for _ in range(4)
        ]
        agents[1].addend = agents[0].addend  # the same sums: hosted calls the cache answers
        assert set(run_agents(agents, turns_more(agents, 4))) == {"ok"}
        assert all(agent.end(two_replicas) == 200 for agent in agents)
        _speculate_then_search(two_replicas, model)
        _repeat_then_stop_a_call(two_replicas, model)
        unknown = httpx.post(
            f"{two_replicas.api_base}/chat/completions",
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]},
            timeout=30,
        )
        assert unknown.status_code == 404

        queries = [
            (uid, title, expr)
            for uid, dashboard in build_dashboards().items()
            for title, expr in panel_queries(dashboard)
        ]
        empty = queries
        deadline = time.monotonic() + 180
        while empty and time.monotonic() < deadline:
            time.sleep(5)
            empty = [query for query in queries if not prometheus.query(query[2])]
        print(f"dashboards: {len(queries) - len(empty)} of {len(queries)} queries return data")
        assert empty == [], empty

        drawn = tmp_path / "drawn"
        rendered = subprocess.run(
            [
                sys.executable,
                "-m",
                "cluster.launch.cli",
                "dashboards",
                "render",
                str(drawn),
                "--prometheus-url",
                prometheus.url,
                "--start",
                started.isoformat(),
                # A range's last point is a step or less before its end: ending it
                # past now keeps a point after the scrapes the queries above saw.
                "--end",
                (datetime.now(UTC) + timedelta(seconds=10)).isoformat(),
                "--step",
                "5",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert rendered.returncode == 0, rendered.stderr
        assert sorted(path.name for path in drawn.glob("*.png")) == sorted(
            f"{uid}.png" for uid in build_dashboards()
        )
        answered = [
            answer
            for uid in build_dashboards()
            for answer in json.loads((drawn / f"{uid}.json").read_text())["queries"]
        ]
        assert len(answered) == len(queries)
        assert [answer["expr"] for answer in answered if not answer["result"]] == []
    finally:
        prometheus.stop()


def test_turns_follow_the_pin_and_fail_over_when_its_replica_dies(
    two_replicas: Endpoints, two_replica_config: ToolserveConfig
) -> None:
    import ray

    # The cluster is up once each role has a ready replica; the second engine may
    # still be loading.
    def both_ready() -> bool:
        health = httpx.get(two_replicas.health_url, timeout=30).json()
        return bool(health["ready_replicas"] == {"main": 2})

    assert _wait_for(both_ready, 180)
    model = two_replica_config.main.engine.served_model_name
    client = OpenAI(base_url=two_replicas.api_base, api_key="test", max_retries=0, timeout=120)
    ledger = TtlLedger(two_replicas.redis_url)
    program = f"routing-{time.time_ns()}"
    messages: list[Any] = [
        {"role": "system", "content": "You fix bugs. Read files with read_file."},
        {"role": "user", "content": "The crash is in app.py or util.py. Read them."},
    ]

    served = [_turn(client, model, program, messages) for _ in range(3)]
    assert len(set(served)) == 1, served
    owner = served[0]
    assert _wait_for(
        lambda: getattr(ledger.lookup(cluster_program_id(program)), "replica_id", None) == owner, 10
    )

    replica_actor = f"SERVE_REPLICA::{two_replica_config.name}#{MAIN_DEPLOYMENT}#{owner}"
    ray.kill(ray.get_actor(replica_actor, namespace="serve"))

    after = [_turn(client, model, program, messages) for _ in range(2)]
    assert owner not in after and len(set(after)) == 1, (owner, after)
    assert _wait_for(
        lambda: getattr(ledger.lookup(cluster_program_id(program)), "replica_id", None) != owner, 30
    )
    raw = redis.Redis.from_url(two_replicas.redis_url)
    assert _wait_for(lambda: raw.exists(f"toolserve:ttl-ledger:replica:{owner}") == 0, 30)
    ledger.close()


def test_agents_running_while_a_replica_dies_lose_no_turn(
    two_replicas: Endpoints, two_replica_config: ToolserveConfig
) -> None:
    """A main replica is killed while eight agents run; the ingress sends turns the
    dead replica had not answered again, so every turn of every agent completes.
    Prints the time until both replicas are ready again."""
    import ray

    def ready_main_replicas() -> list[str]:
        return _ready_main_replicas(two_replicas)

    assert _wait_for(lambda: len(ready_main_replicas()) == 2, 180)
    model = two_replica_config.main.engine.served_model_name
    agents = [
        Agent(two_replicas, model, calculator_tool(two_replicas), tool_latency_s=(0.2, 1.0))
        for _ in range(8)
    ]
    outcomes: Counter[str] = Counter()
    running = threading.Thread(
        target=lambda: outcomes.update(run_agents(agents, turns_more(agents, 6)))
    )
    running.start()
    assert _wait_for(lambda: sum(agent.turns for agent in agents) >= 12, 300)
    victim = ready_main_replicas()[0]
    replica_actor = f"SERVE_REPLICA::{two_replica_config.name}#{MAIN_DEPLOYMENT}#{victim}"
    ray.kill(ray.get_actor(replica_actor, namespace="serve"))
    killed_at = time.monotonic()
    turns_at_kill = sum(agent.turns for agent in agents)
    running.join(timeout=600)
    assert not running.is_alive()
    assert _wait_for(lambda: len(ready_main_replicas()) == 2, 300)
    recovered_s = time.monotonic() - killed_at
    print(
        f"replica loss under load: {sum(outcomes.values())} turns ({turns_at_kill} before the "
        f"kill), outcomes {dict(outcomes)}; both replicas ready {recovered_s:.1f} s after it"
    )
    assert outcomes == Counter({"ok": 6 * len(agents)}), outcomes
    assert all(agent.end(two_replicas) == 200 for agent in agents)
