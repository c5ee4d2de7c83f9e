"""Agents for the reliability suite: programs that alternate a client-tool turn
(the call comes back to the agent, which runs the tool and sends its result)
and a hosted-tool turn (the server runs the calculator and continues), and the
checks made once they are done."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
from client_tools import WEATHER_TOOL
from openai import OpenAI
from programs import cluster_program_id
from prometheus_text import metric_total

from cluster.launch.launcher import Endpoints
from cluster.store.pins import TtlLedger

API_KEY = "reliability"
MAX_ONGOING_REQUESTS = 72
"""The suite's cluster holds this many requests at once: more than the largest
load run's agents."""
MAX_QUEUED_REQUESTS = 72
"""As many as it holds: Serve counts a burst's arrivals as waiting until each
takes a slot, so a smaller queue refuses bursts of the load run with slots free."""
STATS_PERIOD_S = 12.0
"""Longer than the period at which model replicas read their engine's stats (5 s)
and Ray exports metrics (10 s)."""
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def calculator_tool(endpoints: Endpoints) -> Any:
    tools = httpx.get(f"{endpoints.api_base}/tools", headers=AUTH, timeout=30).json()["data"]
    return next(tool for tool in tools if tool["function"]["name"] == "calculator")


class Agent:
    """One program; its conversation grows by each client tool's call and result."""

    def __init__(
        self,
        endpoints: Endpoints,
        model: str,
        calculator: Any,
        tool_latency_s: tuple[float, float] = (0.0, 0.0),
    ):
        self.client = OpenAI(
            base_url=endpoints.api_base, api_key=API_KEY, max_retries=0, timeout=180
        )
        self.model, self.calculator = model, calculator
        self.tool_latency_s = tool_latency_s
        self.program = f"agent-{uuid.uuid4().hex[:12]}"
        # Each agent's sums are its own, so its hosted calls run rather than hit the
        # tool cache entries of another's.
        self.addend = random.randint(100, 999_999)
        self.turns = 0
        self.messages: list[Any] = [
            {"role": "system", "content": "You answer with tools: get_weather, calculator."}
        ]

    def turn(self) -> None:
        """One turn; raises when it failed (it counts as made either way)."""
        weather_turn = self.turns % 2 == 0
        self.turns += 1
        question = "Weather in Oslo?" if weather_turn else f"What is {self.addend}+{self.turns}?"
        asked = [*self.messages, {"role": "user", "content": question}]
        reply = self.client.chat.completions.create(
            model=self.model,
            messages=asked,
            tools=[WEATHER_TOOL if weather_turn else self.calculator],
            tool_choice="required",
            max_tokens=64,
            temperature=0,
            extra_headers={"X-Session-ID": self.program},
        )
        assert reply.choices, reply
        if not weather_turn:
            return
        message = reply.choices[0].message
        assert message.tool_calls, "tool_choice=required must yield a call"
        time.sleep(random.uniform(*self.tool_latency_s))  # the client runs its tool
        self.messages = [
            *asked,
            message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "4 C, wind"},
        ]

    def end(self, endpoints: Endpoints) -> int:
        url = f"{endpoints.api_base}/sessions/{self.program}"
        return httpx.delete(url, headers=AUTH, timeout=30).status_code


def run_agents(agents: list[Agent], done: Callable[[Agent], bool]) -> Counter[str]:
    """Each agent makes turns, concurrently with the others, until it is `done`;
    returns the turns' outcomes ("ok" or the failure)."""
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def drive(agent: Agent) -> None:
        while not done(agent):
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
    return outcomes


def turns_more(agents: list[Agent], turns: int) -> Callable[[Agent], bool]:
    """Done once the agent made `turns` more turns than it has now."""
    targets = {id(agent): agent.turns + turns for agent in agents}
    return lambda agent: agent.turns >= targets[id(agent)]


def health(endpoints: Endpoints) -> tuple[int, dict[str, Any]]:
    response = httpx.get(endpoints.health_url, timeout=30)
    return response.status_code, response.json()


def wait_for(condition: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until `condition` held, or None."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        time.sleep(0.5)
    return None


def metric(endpoints: Endpoints, name: str) -> float | None:
    text = httpx.get(endpoints.metrics_url, timeout=30).text
    return metric_total(text, name) if name in text else None


def settled_metric(endpoints: Endpoints, name: str, timeout_s: float = 90) -> float | None:
    """The metric once two reads a stats period apart agree (what an earlier
    test left in flight has drained), or None."""
    previous = metric(endpoints, name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(STATS_PERIOD_S)
        current = metric(endpoints, name)
        if current is not None and current == previous:
            return current
        previous = current
    return None


def pins_released(endpoints: Endpoints, agents: list[Agent], timeout_s: float) -> bool:
    """Whether, within `timeout_s`, no agent's program is in the TTL ledger and
    the engine holds no pinned block."""
    ledger = TtlLedger(endpoints.redis_url)
    programs = [cluster_program_id(agent.program, API_KEY) for agent in agents]
    try:
        ledger_empty = wait_for(lambda: all(ledger.lookup(p) is None for p in programs), timeout_s)
    finally:
        ledger.close()
    engine_empty = wait_for(lambda: metric(endpoints, "toolserve_kv_pinned_blocks") == 0, timeout_s)
    return ledger_empty is not None and engine_empty is not None
