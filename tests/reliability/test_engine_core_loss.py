"""The vLLM engine-core process dies under a running agent: `/health` reports the
cluster unavailable within seconds, a turn then fails cleanly (an OpenAI-style
503, or no connection while the replica that serves the port is replaced), never
a 500; Serve's replacement replica takes the API port back and the agent's next
turns succeed. Runs after the suite's others (`RUNS_LAST`): were recovery to
fail, they would fail with it."""

from __future__ import annotations

import signal

import httpx
import openai
import psutil
import pytest
from load_agents import Agent, calculator_tool, run_agents, turns_more, wait_for

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.reliability
RUNS_LAST = True


def _titles() -> dict[int, str]:
    """This session's processes (Ray's and the engines' descend from it) by pid."""
    titles = {}
    for process in psutil.Process().children(recursive=True):
        try:
            titles[process.pid] = " ".join(process.cmdline())
        except psutil.Error:
            continue
    return titles


def _engine_cores() -> list[int]:
    """vLLM's engine-core processes: titled `VLLM::EngineCore`, or, where vLLM's
    title did not take (seen in CI), the multiprocessing child a Serve replica
    spawned (the engine core's own worker is the engine core's child)."""
    titles = _titles()
    cores = [pid for pid, title in titles.items() if title.startswith("VLLM::EngineCore")]
    if cores:
        return cores
    spawned = []
    for pid, title in titles.items():
        try:
            parent = psutil.Process(pid).ppid()
        except psutil.Error:
            continue
        if "multiprocessing.spawn" in title and titles.get(parent, "").startswith(
            "ray::ServeReplica:"
        ):
            spawned.append(pid)
    return spawned


def _the_engine_core() -> psutil.Process:
    """The cluster's one engine core, once there is exactly one (a replica Serve
    is replacing may briefly have two, or none yet)."""
    cores: list[int] = []

    def one_core() -> bool:
        cores[:] = _engine_cores()
        return len(cores) == 1

    assert wait_for(one_core, 120) is not None, f"not one engine core: {_titles()}"
    return psutil.Process(cores[0])


def _health_state(endpoints: Endpoints) -> str:
    try:
        response = httpx.get(endpoints.health_url, timeout=10)
    except httpx.HTTPError as error:
        return f"no answer ({type(error).__name__})"
    try:
        return f"{response.status_code} {response.json().get('status')}"
    except ValueError:
        return f"{response.status_code} (not JSON)"


def _turn_outcome(agent: Agent) -> str:
    """ "ok", "503" (OpenAI-style), "no connection", or what else happened."""
    try:
        agent.turn()
    except openai.APIStatusError as error:
        openai_shaped = isinstance(error.body, dict) and "code" in error.body
        if error.status_code == 503 and openai_shaped:
            return "503"
        return f"{error.status_code}: {error}"
    except openai.APIConnectionError:
        return "no connection"
    return "ok"


def test_a_lost_engine_core_is_reported_and_turns_fail_cleanly(
    reliability_cluster: Endpoints, reliability_config: ToolserveConfig
) -> None:
    model = reliability_config.main.engine.served_model_name
    agents = [Agent(reliability_cluster, model, calculator_tool(reliability_cluster))]
    assert set(run_agents(agents, turns_more(agents, 2))) == {"ok"}
    core = _the_engine_core()

    core.send_signal(signal.SIGKILL)
    noticed_after_s = wait_for(lambda: _health_state(reliability_cluster) != "200 ok", 60)
    assert noticed_after_s is not None, "health never reported the lost engine"
    during = _turn_outcome(agents[0])
    print(
        f"[reliability] engine core killed: health not ok after {noticed_after_s:.1f}s; "
        f"a turn then: {during}"
    )
    assert during in ("503", "no connection"), during
    recovered_after_s = wait_for(lambda: _health_state(reliability_cluster) == "200 ok", 300)
    assert recovered_after_s is not None, "the cluster never recovered"
    outcomes = run_agents(agents, turns_more(agents, 2))
    print(
        f"[reliability] healthy again {noticed_after_s + recovered_after_s:.1f}s after the "
        f"kill; the agent's next turns: {dict(outcomes)}"
    )
    assert set(outcomes) == {"ok"}, outcomes
