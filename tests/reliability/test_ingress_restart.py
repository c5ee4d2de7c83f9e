"""The ingress replica (on the embedded default it also holds the main engine) is
killed while agents run. Turns in flight and those sent while Serve replaces it
fail (no connection, or an OpenAI-style 503); agents that retry, as clients of a
restarting server do, finish every program: the replacement replica takes the API
port back and serves them. Prints requests failed and the time to recover."""

from __future__ import annotations

import threading
import time
from collections import Counter

import openai
import pytest
import ray
from load_agents import Agent, calculator_tool, health, wait_for

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints
from deployments.app import INGRESS_DEPLOYMENT

pytestmark = pytest.mark.reliability
RUNS_LAST = True

AGENTS = 4
TURNS = 6
RETRY_FOR_S = 300.0


def _ingress_replica(app_name: str) -> str:
    prefix = f"SERVE_REPLICA::{app_name}#{INGRESS_DEPLOYMENT}#"
    [name] = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve" and actor["name"].startswith(prefix)
    ]
    return name


def _finish_program(agent: Agent, failures: Counter[str]) -> bool:
    """Makes `TURNS` turns that succeed, retrying a failed one every second for up
    to `RETRY_FOR_S`; whether the program finished. `failures` counts failed
    attempts by kind, and turns that needed a retry as "turns retried"."""
    succeeded = 0
    while succeeded < TURNS:
        started = time.monotonic()
        retried = False
        while True:
            try:
                agent.turn()
                break
            except (openai.APIConnectionError, openai.APIStatusError) as error:
                status = getattr(error, "status_code", None)
                if status not in (None, 503):
                    raise
                failures[type(error).__name__ if status is None else "503"] += 1
                failures["turns retried"] += not retried
                retried = True
                if time.monotonic() - started > RETRY_FOR_S:
                    return False
                time.sleep(1.0)
        succeeded += 1
    return True


def test_agents_finish_their_programs_across_an_ingress_restart(
    reliability_cluster: Endpoints, reliability_config: ToolserveConfig
) -> None:
    model = reliability_config.main.engine.served_model_name
    calculator = calculator_tool(reliability_cluster)
    agents = [Agent(reliability_cluster, model, calculator) for _ in range(AGENTS)]
    failures: Counter[str] = Counter()
    finished: list[bool] = []
    threads = [
        threading.Thread(target=lambda a=agent: finished.append(_finish_program(a, failures)))
        for agent in agents
    ]
    for thread in threads:
        thread.start()
    assert wait_for(lambda: sum(agent.turns for agent in agents) >= AGENTS, 300) is not None
    replica = _ingress_replica(reliability_config.name)
    ray.kill(ray.get_actor(replica, namespace="serve"))
    killed_at = time.monotonic()
    recovered = wait_for(lambda: _answers_ok(reliability_cluster), RETRY_FOR_S)
    for thread in threads:
        thread.join(timeout=RETRY_FOR_S + 300)
    print(
        f"[reliability] ingress replica killed: failed attempts and retried turns "
        f"{dict(failures)}; /health ok again "
        f"{'never' if recovered is None else f'{recovered:.1f}s'} after; "
        f"{finished.count(True)} of {AGENTS} programs finished "
        f"({time.monotonic() - killed_at:.1f}s after the kill)"
    )
    assert recovered is not None, "the API never came back"
    assert finished == [True] * AGENTS, finished
    assert _ingress_replica(reliability_config.name) != replica
    assert all(agent.end(reliability_cluster) == 200 for agent in agents)


def _answers_ok(endpoints: Endpoints) -> bool:
    try:
        status, body = health(endpoints)
    except Exception:
        return False
    return status == 200 and body.get("status") == "ok"
