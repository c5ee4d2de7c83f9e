"""More requests at once than the server holds and queues: the excess is refused
at once with 429 and `Retry-After` (never left hanging), and the server serves
normally once the crowd has gone."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from load_agents import AUTH, MAX_ONGOING_REQUESTS, MAX_QUEUED_REQUESTS, health

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints

pytestmark = pytest.mark.reliability

EXCESS = 24
REFUSAL_WAIT_S = 30.0


async def _crowd(endpoints: Endpoints, model: str) -> list[httpx.Response]:
    """Opens held + queued + EXCESS long streams at once; returns the refusals
    that arrived within REFUSAL_WAIT_S, then drops every stream."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "max_tokens": 512,
        "ignore_eos": True,
        "stream": True,
    }
    crowd = MAX_ONGOING_REQUESTS + MAX_QUEUED_REQUESTS + EXCESS
    limits = httpx.Limits(max_connections=crowd + 8)
    async with httpx.AsyncClient(base_url=endpoints.api_base, limits=limits, timeout=120) as api:
        responses: asyncio.Queue[httpx.Response] = asyncio.Queue()

        async def one() -> None:
            request = api.build_request("POST", "/chat/completions", json=body, headers=AUTH)
            response = await api.send(request, stream=True)
            await responses.put(response)
            await asyncio.sleep(REFUSAL_WAIT_S + 5)  # an admitted stream stays open
            await response.aclose()

        tasks = [asyncio.create_task(one()) for _ in range(crowd)]
        refused: list[httpx.Response] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REFUSAL_WAIT_S
        while len(refused) < EXCESS and (left := deadline - loop.time()) > 0:
            try:
                response = await asyncio.wait_for(responses.get(), left)
            except TimeoutError:
                break
            if response.status_code == 429:
                await response.aread()
                refused.append(response)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return refused


def test_excess_requests_are_refused_at_once_with_retry_after(
    reliability_cluster: Endpoints, reliability_config: ToolserveConfig
) -> None:
    model = reliability_config.main.engine.served_model_name
    refused = asyncio.run(_crowd(reliability_cluster, model))
    print(
        f"[reliability] backpressure: {len(refused)} of {EXCESS} excess requests refused with 429"
    )
    assert len(refused) >= EXCESS, f"only {len(refused)} refusals; the rest hung or were served"
    for response in refused:
        assert response.headers["retry-after"] == str(int(reliability_config.server.retry_after_s))

    def served() -> bool:
        reply = httpx.post(
            f"{reliability_cluster.api_base}/chat/completions",
            json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            headers=AUTH,
            timeout=120,
        )
        return reply.status_code == 200

    assert served(), "the server did not serve once the crowd had gone"
    assert health(reliability_cluster)[1]["status"] == "ok"
