"""toolserve on a Ray cluster of several nodes, each a host of its own: a head
(the ingress), two model nodes (a main replica each), a tool node and Redis, each
in its own network namespace on a private bridge (`toolserve nodes`). Real Ray,
vLLM (SmolLM2), Redis and the `openai` SDK; the test process is a client outside
every node. Each deployment runs on the nodes that offer its resources; the
dashboards' queries, evaluated by a real Prometheus scraping every node, all
return data, and `toolserve dashboards render` draws them from it; turns follow
their program's pin to the node that holds it and hit the prefix there; a
hosted call runs on the tool node and the turn continues on the model node;
Redis cut off the network for 10 s loses no turn; losing a model node mid-run
loses no program, its pins leave the ledger, and `/health` is degraded until
the node is back."""

from __future__ import annotations

import itertools
import json
import os
import signal
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

import httpx
import pytest
import redis
import yaml
from load_agents import API_KEY, AUTH, Agent, calculator_tool, run_agents, turns_more, wait_for
from openai import OpenAI
from programs import cluster_program_id
from written_calls import CALCULATOR_FEW_SHOT, invalid_calculator_call, written_turn

from cluster.config import CONFIGS_DIR, ToolserveConfig, load_config
from cluster.launch.dashboards import build_dashboards, panel_queries
from cluster.launch.launcher import Endpoints
from cluster.launch.node_namespaces import NamespaceCluster
from cluster.launch.prometheus import PrometheusServer
from cluster.node_layout import DEFAULT_NODES
from cluster.openai_protocol import executed_messages
from cluster.store.pins import TtlLedger
from deployments.api.chat import REPLICA_HEADER
from deployments.api.parsing import SESSION_HEADER
from deployments.app import INGRESS_DEPLOYMENT, MAIN_DEPLOYMENT, TOOL_WORKERS_DEPLOYMENT
from toolworkers.builtin_tools import calculate

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]

PROFILE = CONFIGS_DIR / "multinode-cpu.yaml"
PIN_TTL_S = 120.0
NODE_ADDRESS = {node.name: node.address for node in DEFAULT_NODES}
MODEL_NODES = {NODE_ADDRESS["model-a"], NODE_ADDRESS["model-b"]}
READ_FILE: Any = {
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


@pytest.fixture(scope="module")
def profile() -> ToolserveConfig:
    """The shipped profile with pins of a fixed TTL, so every turn pins."""
    config = load_config(PROFILE)
    pinning = config.main.pinning.model_copy(
        update={"mode": "fixed", "fixed_ttl_s": PIN_TTL_S, "max_ttl_s": PIN_TTL_S}
    )
    return config.model_copy(update={"main": config.main.model_copy(update={"pinning": pinning})})


@pytest.fixture(scope="module")
def nodes(
    profile: ToolserveConfig, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NamespaceCluster]:
    work_dir = Path(tmp_path_factory.mktemp("nodes"))
    profile_path = work_dir / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(profile.model_dump(mode="json")))
    cluster = NamespaceCluster(work_dir=work_dir, log=print)
    cluster.up()
    server = cluster.serve(profile_path)
    try:
        cluster.wait_until_serving(profile, server, profile.main.startup_timeout_s)
        yield cluster
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            server.kill()
        print(cluster.log_path("up").read_text()[-3000:])
        cluster.down()


@pytest.fixture(scope="module")
def endpoints(nodes: NamespaceCluster, profile: ToolserveConfig) -> Endpoints:
    root = nodes.api_root(profile)
    return Endpoints(
        api_base=f"{root}/v1",
        health_url=f"{root}/health",
        metrics_url=f"http://{nodes.metrics_targets()[0]}/metrics",
        redis_url=nodes.redis_url,
    )


def _health(endpoints: Endpoints) -> dict[str, Any]:
    return dict(httpx.get(endpoints.health_url, timeout=30).json())


def _main_engines(endpoints: Endpoints) -> dict[str, str]:
    """Each ready main replica's node address."""
    return {
        engine["replica"]: engine["node"]
        for engine in _health(endpoints)["engines"]
        if engine["role"] == "main" and engine["state"] == "ready"
    }


def test_each_deployment_runs_on_the_nodes_that_offer_its_resources(
    nodes: NamespaceCluster, endpoints: Endpoints
) -> None:
    assert wait_for(lambda: len(_main_engines(endpoints)) == 2, 300) is not None
    assert set(_main_engines(endpoints).values()) == MODEL_NODES
    where: dict[str, set[str]] = {}
    for actor in nodes.placement():
        if actor["name"].startswith("SERVE_REPLICA::"):
            deployment = actor["name"].split("#")[1]
            where.setdefault(deployment, set()).add(actor["node"])
    assert where[MAIN_DEPLOYMENT] == MODEL_NODES, where
    assert where[TOOL_WORKERS_DEPLOYMENT] == {NODE_ADDRESS["tools"]}, where
    assert where[INGRESS_DEPLOYMENT] == {NODE_ADDRESS["head"]}, where


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


def _waste_a_speculation(endpoints: Endpoints, model: str) -> None:
    """What the speculation-waste panel shows: under a key of its own (a tenant
    whose tool cache holds nothing yet), two turns teach the learned predictor a
    calculator call, then a turn that may not call a tool still has the call
    started on a guess: discarded, with the tool CPU its run took."""
    client = OpenAI(
        base_url=endpoints.api_base,
        api_key=f"waste-{uuid.uuid4().hex[:8]}",
        max_retries=0,
        timeout=180,
    )
    agent = uuid.uuid4().hex[:8]
    for run_here, tool_choice in ((False, "auto"), (False, "auto"), (True, "none")):
        client.chat.completions.create(
            model=model,
            messages=CALCULATOR_FEW_SHOT,  # type: ignore[arg-type]
            tools=[calculator_tool(endpoints)],
            tool_choice=tool_choice,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=64,
            extra_headers={SESSION_HEADER: f"waste-{agent}-{uuid.uuid4().hex[:6]}"},
            extra_body={"toolserve": {"execute_tools": run_here}},
        )

    seen: list[Any] = []

    def run_accounted() -> bool:
        seen.append(
            httpx.get(
                f"{endpoints.api_base}/tools",
                headers={"Authorization": f"Bearer {client.api_key}"},
                timeout=30,
            ).json()["toolserve"]["speculation_ledger"]["tools"]["calculator"]
        )
        return bool(seen[-1]["tool_cpu_s_discarded"] > 0)

    assert wait_for(run_accounted, 60) is not None, seen[-1:]
    assert seen[-1]["discarded"] == 1, seen[-1]


def _break_a_prefix(endpoints: Endpoints, model: str) -> None:
    """What the prefix panels show: a program's second turn sent with another
    system prompt parts from the prefix its replica held."""
    client = OpenAI(base_url=endpoints.api_base, api_key=API_KEY, max_retries=0, timeout=180)
    program = f"prefix-{uuid.uuid4().hex[:8]}"
    question = {"role": "user", "content": "Name a colour."}
    first = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": f"You are agent {program}."}, question],
        temperature=0,
        max_tokens=8,
        extra_headers={SESSION_HEADER: program},
    )
    second = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[
            {"role": "system", "content": f"You are agent {program}, now in French."},
            question,
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "And another?"},
        ],
        temperature=0,
        max_tokens=8,
        extra_headers={SESSION_HEADER: program},
    )
    assert second.headers["x-toolserve-prefix"].startswith("broken; cause=system_prompt_changed")


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
    nodes: NamespaceCluster, endpoints: Endpoints, profile: ToolserveConfig, tmp_path: Path
) -> None:
    """Prometheus scrapes every node's metrics agent, as a PodMonitor would."""
    prometheus = PrometheusServer(tmp_path, nodes.metrics_targets())
    prometheus.start()
    started = datetime.now(UTC)
    try:
        assert wait_for(lambda: len(_main_engines(endpoints)) == 2, 300) is not None
        model = profile.main.engine.served_model_name
        calculator = calculator_tool(endpoints)
        agents = [Agent(endpoints, model, calculator, tool_latency_s=(0.5, 1.5)) for _ in range(4)]
        agents[1].addend = agents[0].addend  # the same sums: hosted calls the cache answers
        assert set(run_agents(agents, turns_more(agents, 4))) == {"ok"}
        assert all(agent.end(endpoints) == 200 for agent in agents)
        _speculate_then_search(endpoints, model)
        _waste_a_speculation(endpoints, model)
        _repeat_then_stop_a_call(endpoints, model)
        _break_a_prefix(endpoints, model)
        unknown = httpx.post(
            f"{endpoints.api_base}/chat/completions",
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


def _read_file_turn(client: OpenAI, model: str, program: str, messages: list[Any]) -> Any:
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        tools=[READ_FILE],
        tool_choice="required",
        max_tokens=48,
        temperature=0,
        extra_headers={SESSION_HEADER: program},
    )
    reply = raw.parse()
    message = reply.choices[0].message
    assert message.tool_calls, "tool_choice=required must yield a call"
    messages.append(message.model_dump(exclude_none=True))
    messages.append(
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "def main(): pass\n"}
    )
    return raw.headers[REPLICA_HEADER], reply.usage


def test_a_programs_turns_follow_its_pin_to_its_node_and_hit_the_prefix_there(
    endpoints: Endpoints, profile: ToolserveConfig
) -> None:
    assert wait_for(lambda: len(_main_engines(endpoints)) == 2, 300) is not None
    model = profile.main.engine.served_model_name
    client = OpenAI(base_url=endpoints.api_base, api_key="test", max_retries=0, timeout=180)
    program = f"nodes-{time.time_ns()}"
    messages: list[Any] = [
        {"role": "system", "content": "You fix bugs. Read files with read_file."},
        {"role": "user", "content": "The crash is in app.py or util.py. Read them."},
    ]
    turns = [_read_file_turn(client, model, program, messages) for _ in range(3)]
    owners = {replica for replica, _ in turns}
    assert len(owners) == 1, turns
    [owner] = owners
    assert _main_engines(endpoints)[owner] in MODEL_NODES

    ledger = TtlLedger(endpoints.redis_url)
    try:
        assert wait_for(
            lambda: (
                getattr(ledger.lookup(cluster_program_id(program)), "replica_id", None) == owner
            ),
            10,
        )
    finally:
        ledger.close()
    block = profile.main.engine.block_size
    for (_, before), (_, after) in itertools.pairwise(turns):
        cached = after.prompt_tokens_details.cached_tokens or 0
        # The last turn's prompt is held whole, up to the block it ended in.
        assert cached >= before.prompt_tokens - block, (before, after)


def test_a_hosted_call_runs_on_the_tool_node_and_the_turn_continues(
    endpoints: Endpoints, profile: ToolserveConfig
) -> None:
    client = OpenAI(base_url=endpoints.api_base, api_key="test", max_retries=0, timeout=180)
    reply = client.chat.completions.create(
        model=profile.main.engine.served_model_name,
        messages=[{"role": "user", "content": "What is 1234 * 5678?"}],
        tools=[calculator_tool(endpoints)],
        tool_choice="required",
        max_tokens=64,
        temperature=0,
        extra_headers={SESSION_HEADER: f"nodes-calc-{time.time_ns()}"},
    )
    executed = executed_messages(reply.model_dump())
    [call] = executed[0]["tool_calls"]
    [result] = [message for message in executed if message["role"] == "tool"]
    # The tool workers ran the model's own call (whatever it wrote), and the turn
    # went on from the result on the model node.
    expression = json.loads(call["function"]["arguments"])["expression"]
    assert result["content"] == calculate(expression), executed
    assert reply.choices[0].message is not None


def test_redis_cut_off_the_network_for_ten_seconds_loses_no_turn(
    nodes: NamespaceCluster, endpoints: Endpoints, profile: ToolserveConfig
) -> None:
    """Redis's host is cut off the bridge (connections hang rather than fail)
    while four agents run: every turn completes, and `/health` is ok after."""
    model = profile.main.engine.served_model_name
    agents = [Agent(endpoints, model, calculator_tool(endpoints)) for _ in range(4)]
    outcomes: Counter[str] = Counter()
    running = threading.Thread(
        target=lambda: outcomes.update(run_agents(agents, turns_more(agents, 6)))
    )
    running.start()
    assert wait_for(lambda: sum(agent.turns for agent in agents) >= 4, 300) is not None
    with nodes.partitioned("redis"):
        partitioned_at = sum(agent.turns for agent in agents)
        time.sleep(10)
        during = sum(agent.turns for agent in agents) - partitioned_at
    running.join(timeout=600)
    assert not running.is_alive()
    print(f"redis partition: {during} turns during it, outcomes {dict(outcomes)}")
    assert set(outcomes) == {"ok"}, outcomes
    assert during > 0
    assert wait_for(lambda: _health(endpoints)["status"] == "ok", 60) is not None
    assert all(agent.end(endpoints) == 200 for agent in agents)


def test_losing_a_model_node_loses_no_program(
    nodes: NamespaceCluster, endpoints: Endpoints, profile: ToolserveConfig
) -> None:
    """Every process of one model node is killed while six agents run: every
    agent's every turn completes on the other node; the lost replica's pins leave
    the ledger; `/health` is degraded until the node is back and Serve has placed
    its replica there again."""
    assert wait_for(lambda: len(_main_engines(endpoints)) == 2, 300) is not None
    model = profile.main.engine.served_model_name
    agents = [
        Agent(endpoints, model, calculator_tool(endpoints), tool_latency_s=(0.2, 1.0))
        for _ in range(6)
    ]
    outcomes: Counter[str] = Counter()
    running = threading.Thread(
        target=lambda: outcomes.update(run_agents(agents, turns_more(agents, 6)))
    )
    running.start()
    assert wait_for(lambda: sum(agent.turns for agent in agents) >= 8, 300) is not None
    lost = next(
        replica
        for replica, node in _main_engines(endpoints).items()
        if node == NODE_ADDRESS["model-b"]
    )
    nodes.kill("model-b")
    running.join(timeout=900)
    assert not running.is_alive()
    print(f"turns: {dict(outcomes)}")
    assert set(outcomes) == {"ok"}, outcomes
    assert all(agent.end(endpoints) == 200 for agent in agents)

    health = _health(endpoints)
    assert health["status"] == "degraded", health
    ledger_key = f"toolserve:ttl-ledger:replica:{lost}"
    raw = redis.Redis.from_url(endpoints.redis_url)
    # The lost replica cannot clear its own entries: the router clears them once
    # Serve drops it, and they expire with their pins at the latest.
    cleared = wait_for(lambda: raw.exists(ledger_key) == 0, PIN_TTL_S + 30)
    print(f"the lost replica's pins left the ledger after {cleared} s more")
    assert cleared is not None

    nodes.start_node("model-b")
    back = wait_for(lambda: set(_main_engines(endpoints).values()) == MODEL_NODES, 600)
    print(f"model-b back and serving after {back}s")
    assert back is not None
    assert wait_for(lambda: _health(endpoints)["status"] == "ok", 60) is not None
