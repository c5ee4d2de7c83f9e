"""The hosted-tool worker replica is killed, or hangs (SIGSTOP), while agents run:
every turn is still answered (a call the lost worker held comes back to the model
as a tool error, never as a failed request), Serve replaces the worker, and
hosted calls succeed again. Prints the outcomes and the time to recover."""

from __future__ import annotations

import random
import signal
import threading
from collections import Counter
from typing import Any

import psutil
import pytest
import ray
from load_agents import AUTH, Agent, calculator_tool, run_agents, turns_more, wait_for
from openai import OpenAI

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints
from deployments.app import TOOL_WORKERS_DEPLOYMENT

pytestmark = pytest.mark.reliability

AGENTS = 6
TURNS = 6


def _worker_replicas(app_name: str) -> list[str]:
    prefix = f"SERVE_REPLICA::{app_name}#{TOOL_WORKERS_DEPLOYMENT}#"
    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve" and actor["name"].startswith(prefix)
    ]


def _hosted_call_result(endpoints: Endpoints, model: str, calculator: Any) -> str | None:
    """The output the server's calculator run gave inside one turn, if it ran one
    (a sum never asked before, so it is not in the tool cache)."""
    client = OpenAI(base_url=endpoints.api_base, api_key=AUTH["Authorization"][7:], timeout=180)
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"What is {random.randint(100, 10**9)}*7?"}],
        tools=[calculator],
        tool_choice="required",
        max_tokens=64,
        temperature=0,
    )
    executed = ((reply.model_extra or {}).get("toolserve") or {}).get("executed_messages") or []
    outputs = [message["content"] for message in executed if message.get("role") == "tool"]
    return outputs[-1] if outputs else None


def _stop_or_kill(app_name: str, actor_name: str, fault: str) -> None:
    if fault == "killed":
        ray.kill(ray.get_actor(actor_name, namespace="serve"))
        return
    title = f"ray::ServeReplica:{app_name}:{TOOL_WORKERS_DEPLOYMENT}"
    [process] = [
        p for p in psutil.Process().children(recursive=True) if _title(p).split()[:1] == [title]
    ]
    process.send_signal(signal.SIGSTOP)


def _title(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.parametrize("fault", ["killed", "stopped"])
def test_agents_are_served_while_the_tool_worker_is_lost(
    reliability_cluster: Endpoints, reliability_config: ToolserveConfig, fault: str
) -> None:
    model = reliability_config.main.engine.served_model_name
    calculator = calculator_tool(reliability_cluster)
    assert wait_for(lambda: len(_worker_replicas(reliability_config.name)) >= 1, 60) is not None
    healthy = _hosted_call_result(reliability_cluster, model, calculator)
    assert healthy is not None and not healthy.startswith("error:"), healthy

    agents = [Agent(reliability_cluster, model, calculator) for _ in range(AGENTS)]
    outcomes: Counter[str] = Counter()
    running = threading.Thread(
        target=lambda: outcomes.update(run_agents(agents, turns_more(agents, TURNS)))
    )
    running.start()
    assert wait_for(lambda: sum(agent.turns for agent in agents) >= AGENTS, 300) is not None
    [worker] = _worker_replicas(reliability_config.name)
    _stop_or_kill(reliability_config.name, worker, fault)

    def hosted_calls_work() -> bool:
        result = _hosted_call_result(reliability_cluster, model, calculator)
        return result is not None and not result.startswith("error:")

    recovered = wait_for(hosted_calls_work, 300)
    running.join(timeout=600)
    assert not running.is_alive()
    print(
        f"[reliability] tool worker {fault}: {sum(outcomes.values())} turns, outcomes "
        f"{dict(outcomes)}; hosted calls work again "
        f"{'never' if recovered is None else f'{recovered:.1f}s'} after"
    )
    assert outcomes == Counter({"ok": AGENTS * TURNS}), outcomes
    assert recovered is not None, "hosted calls never worked again"
    # A stopped replica cannot answer Serve's graceful shutdown: Serve kills it
    # only once that times out, which may be after its replacement serves.
    replaced = wait_for(lambda: worker not in _worker_replicas(reliability_config.name), 120)
    assert replaced is not None, "the worker was not replaced"
    assert all(agent.end(reliability_cluster) == 200 for agent in agents)
