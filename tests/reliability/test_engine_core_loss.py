"""The vLLM engine-core process dies under a running agent: Serve replaces the
replica that held it, `/health` reports the cluster not ok meanwhile, turns in
between fail cleanly (an OpenAI-style 503, or no connection while the replica
that serves the port restarts), and the agents carry on once it is back."""

from __future__ import annotations

import signal
import time
from collections import Counter

import httpx
import openai
import psutil
import pytest
from agents import Agent, calculator_tool, run_agents, turns_more

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.reliability

RECOVERY_TIMEOUT_S = 600.0


def _engine_cores() -> list[psutil.Process]:
    cores = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.cmdline()[:1] == ["VLLM::EngineCore"]:
                cores.append(process)
        except psutil.Error:
            continue
    return cores


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


def test_a_lost_engine_core_is_replaced_and_the_agents_carry_on(
    reliability_cluster: Endpoints, reliability_config: ToolserveConfig
) -> None:
    model = reliability_config.main.engine.served_model_name
    agents = [Agent(reliability_cluster, model, calculator_tool(reliability_cluster))]
    assert set(run_agents(agents, turns_more(agents, 2))) == {"ok"}
    [core] = _engine_cores()

    core.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    during = _turn_outcome(agents[0])
    seen: Counter[str] = Counter()
    while (state := _health_state(reliability_cluster)) != "200 ok":
        seen[state] += 1
        assert time.monotonic() - killed_at < RECOVERY_TIMEOUT_S, f"not back: {dict(seen)}"
        time.sleep(1)
    recovered_after_s = time.monotonic() - killed_at
    after = run_agents(agents, turns_more(agents, 2))
    print(
        f"[reliability] engine core killed: health ok again after {recovered_after_s:.0f}s "
        f"(meanwhile {dict(seen)}); a turn right after the kill: {during}; turns after "
        f"{dict(after)}"
    )
    assert during in ("ok", "503", "no connection"), during
    assert seen, "health never reported the lost engine"
    assert set(after) == {"ok"}, after
    assert [process.pid for process in _engine_cores()] not in ([], [core.pid])
