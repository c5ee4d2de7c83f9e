"""Many agents at once on the embedded default: no turn fails, and once they
end their sessions nothing is left behind: no pin (ledger and engine), KV use
back to its idle value, no Redis key without an expiry, and every serving
process's resident memory near its value after warm-up.

CI runs 16 agents x 5 turns; `TOOLSERVE_LOAD_AGENTS` and `TOOLSERVE_LOAD_TURNS`
set the size (the recorded run: 64 x 10)."""

from __future__ import annotations

import os

import psutil
import pytest
import redis
from load_agents import (
    Agent,
    calculator_tool,
    metric,
    pins_released,
    run_agents,
    settled_metric,
    turns_more,
    wait_for,
)

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.reliability

AGENTS = int(os.environ.get("TOOLSERVE_LOAD_AGENTS", "16"))
TURNS = int(os.environ.get("TOOLSERVE_LOAD_TURNS", "5"))
CLIENT_TOOL_LATENCY_S = (0.0, 2.0)
FREE_BLOCKS = "toolserve_kv_free_blocks"
# Keys without an expiry that stay bounded whatever the load: the tool cache's
# expiry index (trimmed to `tools.cache.max_entries`).
BOUNDED_KEYS_WITHOUT_EXPIRY = ("toolserve:tool-cache:index",)
MEMORY_GROWTH_BOUND = 1.25
MEMORY_GROWTH_SLACK_MB = 64


def _serving_processes() -> dict[str, psutil.Process]:
    """The cluster's Serve replicas and engine processes, by name and pid."""
    found = {}
    for process in psutil.Process().children(recursive=True):
        try:
            name = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if name.startswith(("ray::ServeReplica", "VLLM::")):
            found[f"{name.split()[0]}[{process.pid}]"] = process
    return found


def _resident_mb(processes: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: process.memory_info().rss / 2**20 for name, process in processes.items()}


def test_agents_under_load_fail_no_turn_and_leave_nothing_behind(
    reliability_cluster: Endpoints, reliability_config: ToolserveConfig
) -> None:
    model = reliability_config.main.engine.served_model_name
    calculator = calculator_tool(reliability_cluster)
    store = redis.Redis.from_url(reliability_cluster.redis_url)
    keys_before = set(store.keys("*"))
    idle_free_blocks = settled_metric(reliability_cluster, FREE_BLOCKS)
    assert idle_free_blocks is not None, "the free-block count never settled"
    agents = [
        Agent(reliability_cluster, model, calculator, CLIENT_TOOL_LATENCY_S) for _ in range(AGENTS)
    ]

    warm_up = run_agents(agents, turns_more(agents, 1))
    processes = _serving_processes()
    assert processes, "no serving process found"
    warm_mb = _resident_mb(processes)
    load = run_agents(agents, turns_more(agents, TURNS - 1))
    ended = [agent.end(reliability_cluster) for agent in agents]
    released = pins_released(reliability_cluster, agents, 60)
    end_mb = _resident_mb(processes)
    kv_idle = wait_for(lambda: metric(reliability_cluster, FREE_BLOCKS) == idle_free_blocks, 60)
    new_keys = set(store.keys("*")) - keys_before
    immortal = sorted(
        key.decode()
        for key in new_keys
        if store.ttl(key) == -1 and key.decode() not in BOUNDED_KEYS_WITHOUT_EXPIRY
    )
    print(
        f"[reliability] load {AGENTS} agents x {TURNS} turns: warm-up {dict(warm_up)}, "
        f"load {dict(load)}; pins released {released}; free KV blocks back to "
        f"{idle_free_blocks} {kv_idle}s after; {len(new_keys)} new Redis keys, "
        f"without expiry {immortal}; "
        "resident MB after warm-up -> end: "
        + ", ".join(f"{name} {warm_mb[name]:.0f}->{end_mb[name]:.0f}" for name in processes)
    )
    assert set(warm_up) == set(load) == {"ok"}, (warm_up, load)
    assert ended == [200] * AGENTS
    assert released, "pins outlived their ended sessions"
    assert kv_idle is not None, "KV blocks stayed in use"
    assert not immortal, "keys without an expiry grow with the load"
    for name, megabytes in end_mb.items():
        bound = warm_mb[name] * MEMORY_GROWTH_BOUND + MEMORY_GROWTH_SLACK_MB
        assert megabytes <= bound, f"{name} grew from {warm_mb[name]:.0f} to {megabytes:.0f} MB"
