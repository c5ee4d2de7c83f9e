"""Redis stops for 30 s while agents run, then comes back empty: every turn is
served throughout (client tools and a hosted tool the server runs), `/health`
says degraded while Redis is down and ok again without restarting toolserve,
and no pin is left behind once the agents end their sessions."""

from __future__ import annotations

import time

import pytest
from load_agents import (
    Agent,
    calculator_tool,
    health,
    pins_released,
    run_agents,
    turns_more,
    wait_for,
)

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints

from .own_redis import OwnRedis

pytestmark = pytest.mark.reliability

AGENTS = 4
OUTAGE_S = 30.0


def test_agents_are_served_through_a_redis_outage_and_leave_no_pins(
    reliability_cluster: Endpoints, reliability_config: ToolserveConfig, own_redis: OwnRedis
) -> None:
    model = reliability_config.main.engine.served_model_name
    calculator = calculator_tool(reliability_cluster)
    agents = [Agent(reliability_cluster, model, calculator) for _ in range(AGENTS)]

    before = run_agents(agents, turns_more(agents, 2))
    assert health(reliability_cluster)[1]["status"] == "ok"

    own_redis.stop()
    outage_ends = time.monotonic() + OUTAGE_S
    during = run_agents(agents, lambda _: time.monotonic() >= outage_ends)
    status, report = health(reliability_cluster)
    assert status == 200 and report["status"] == "degraded", report
    assert report["components"]["redis"]["status"] == "unreachable"

    own_redis.start()
    recovered_after_s = wait_for(lambda: health(reliability_cluster)[1]["status"] == "ok", 60)
    after = run_agents(agents, turns_more(agents, 2))
    print(
        f"[reliability] redis outage {OUTAGE_S:.0f}s, {AGENTS} agents: turns before "
        f"{dict(before)}, during {dict(during)}, after {dict(after)}; "
        f"health ok {recovered_after_s}s after Redis returned"
    )
    assert set(before) == set(during) == set(after) == {"ok"}, (before, during, after)
    assert during["ok"] >= AGENTS, "the agents made no turn during the outage"
    assert recovered_after_s is not None, "health did not recover without a restart"

    assert [agent.end(reliability_cluster) for agent in agents] == [200] * AGENTS
    assert pins_released(reliability_cluster, agents, 60), "pins outlived their ended sessions"
