"""Redis stops for 30 s while agents run, then comes back empty: every turn is
served throughout (client tools and a hosted tool the server runs), `/health`
says degraded while Redis is down and ok again without restarting toolserve,
and no pin is left behind once the agents end their sessions."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from programs import cluster_program_id
from prometheus_text import metric_total

from cluster.config import RedisConfig, ToolserveConfig, load_config
from cluster.launch.launcher import Endpoints, LocalCluster
from cluster.launch.redis_server import RedisServer, start_redis_server
from cluster.net import free_port
from cluster.store.pins import TtlLedger

pytestmark = pytest.mark.reliability

AGENTS = 4
OUTAGE_S = 30.0
API_KEY = "reliability"
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@dataclass
class OwnRedis:
    """A redis-server the test stops and starts again on the same port."""

    work_dir: Path
    port: int = field(default_factory=free_port)
    server: RedisServer | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.server = start_redis_server(self.work_dir, print, self.port)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRedis]:
    redis = OwnRedis(tmp_path_factory.mktemp("own-redis"))
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


@pytest.fixture(scope="module")
def outage_config(own_redis: OwnRedis) -> ToolserveConfig:
    config = load_config()
    return config.model_copy(
        update={
            "name": "toolserve-reliability",
            "redis": RedisConfig(url=own_redis.url),
            "server": config.server.model_copy(update={"port": free_port()}),
            "ray": config.ray.model_copy(update={"metrics_export_port": free_port()}),
        }
    )


@pytest.fixture(scope="module")
def outage_cluster(outage_config: ToolserveConfig) -> Iterator[Endpoints]:
    with LocalCluster(outage_config, log=lambda line: print(f"[reliability] {line}")) as cluster:
        yield cluster


class Agent:
    """A program alternating a client-tool turn (the call comes back to it) and a
    hosted-tool turn (the server runs the calculator and continues)."""

    def __init__(self, client: OpenAI, model: str, calculator: Any, index: int):
        self.client, self.model, self.calculator = client, model, calculator
        self.program = f"outage-{index}-{uuid.uuid4().hex[:8]}"
        self.turns = 0

    def conversation(self) -> list[Any]:
        return [{"role": "user", "content": f"Weather in Oslo, and what is 2+{self.turns}?"}]

    def turn(self) -> None:
        """One turn; raises when it failed (it counts as made either way)."""
        weather_turn = self.turns % 2 == 0
        self.turns += 1
        reply = self.client.chat.completions.create(
            model=self.model,
            messages=self.conversation(),
            tools=[WEATHER_TOOL if weather_turn else self.calculator],
            tool_choice="required",
            max_tokens=64,
            temperature=0,
            extra_headers={"X-Session-ID": self.program},
        )
        assert reply.choices, reply
        if weather_turn:
            assert reply.choices[0].message.tool_calls, "tool_choice=required must yield a call"


def _run_agents(agents: list[Agent], until: Callable[[], bool], outcomes: Counter[str]) -> None:
    lock = threading.Lock()

    def drive(agent: Agent) -> None:
        while not until():
            try:
                agent.turn()
                outcome = "ok"
            except Exception as error:
                outcome = f"failed: {type(error).__name__}: {error}"[:300]
            with lock:
                outcomes[outcome] += 1

    threads = [threading.Thread(target=drive, args=(agent,)) for agent in agents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _health(endpoints: Endpoints) -> tuple[int, dict[str, Any]]:
    response = httpx.get(endpoints.health_url, timeout=30)
    return response.status_code, response.json()


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until `condition` held, or None."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        time.sleep(0.5)
    return None


def test_agents_are_served_through_a_redis_outage_and_leave_no_pins(
    outage_cluster: Endpoints, outage_config: ToolserveConfig, own_redis: OwnRedis
) -> None:
    client = OpenAI(base_url=outage_cluster.api_base, api_key=API_KEY, max_retries=0, timeout=120)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    tools = httpx.get(f"{outage_cluster.api_base}/tools", headers=auth, timeout=30).json()["data"]
    calculator = next(tool for tool in tools if tool["function"]["name"] == "calculator")
    model = outage_config.main.engine.served_model_name
    agents = [Agent(client, model, calculator, index) for index in range(AGENTS)]

    before: Counter[str] = Counter()
    _run_agents(agents, lambda: all(agent.turns >= 2 for agent in agents), before)
    assert _health(outage_cluster)[1]["status"] == "ok"

    own_redis.stop()
    during: Counter[str] = Counter()
    outage_ends = time.monotonic() + OUTAGE_S
    _run_agents(agents, lambda: time.monotonic() >= outage_ends, during)
    status, report = _health(outage_cluster)
    assert status == 200 and report["status"] == "degraded", report
    assert report["components"]["redis"]["status"] == "unreachable"

    own_redis.start()
    recovered_after_s = _wait_for(lambda: _health(outage_cluster)[1]["status"] == "ok", 60)
    after: Counter[str] = Counter()
    turns_so_far = [agent.turns for agent in agents]
    _run_agents(
        agents,
        lambda: all(
            agent.turns >= done + 2 for agent, done in zip(agents, turns_so_far, strict=True)
        ),
        after,
    )
    print(
        f"[reliability] redis outage {OUTAGE_S:.0f}s, {AGENTS} agents: turns before "
        f"{dict(before)}, during {dict(during)}, after {dict(after)}; "
        f"health ok {recovered_after_s}s after Redis returned"
    )
    assert set(before) == set(during) == set(after) == {"ok"}, (before, during, after)
    assert during["ok"] >= AGENTS, "the agents made no turn during the outage"
    assert recovered_after_s is not None, "health did not recover without a restart"

    for agent in agents:
        ended = httpx.delete(
            f"{outage_cluster.api_base}/sessions/{agent.program}", headers=auth, timeout=30
        )
        assert ended.status_code == 200, ended.text
    ledger = TtlLedger(outage_cluster.redis_url)
    try:
        programs = [cluster_program_id(agent.program, API_KEY) for agent in agents]
        assert _wait_for(lambda: all(ledger.lookup(p) is None for p in programs), 30) is not None
    finally:
        ledger.close()

    def no_pinned_blocks() -> bool:
        text = httpx.get(outage_cluster.metrics_url, timeout=30).text
        return "toolserve_kv_pinned_blocks" in text and (
            metric_total(text, "toolserve_kv_pinned_blocks") == 0
        )

    assert _wait_for(no_pinned_blocks, 60) is not None, "pins outlived their ended sessions"
