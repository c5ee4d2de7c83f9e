"""One real cluster per test session: Ray, the real Redis, vLLM on SmolLM2."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from client_tools import WEATHER_TOOL
from openai import OpenAI
from programs import TEST_CLIENT_AUTH, cluster_program_id
from quota_tenant import QUOTA_TENANT_KEY, QUOTA_TENANT_LIMITS
from tool_paths import owned_by_tools

from cluster.config import HostedToolConfig, ToolserveConfig, load_config
from cluster.launch.launcher import Endpoints, LocalCluster
from cluster.net import free_port
from cluster.store.pins import TtlLedger
from deployments.api.tenants import tenant_of

DATA_FILES = {
    "notes.txt": "alpha\nbeta\ngamma\n",
    "orders.csv": "order,amount_eur\nA-100,12.50\nA-101,7.25\n",
}


@pytest.fixture(scope="session")
def hosted_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data directory the cluster's hosted file tools read."""
    root = tmp_path_factory.mktemp("hosted-data")
    for name, text in DATA_FILES.items():
        (root / name).write_text(text)
    return root


@pytest.fixture(scope="session")
def lookup_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One line per run of the cluster's `lookup_record` tool (bench/tools.py)."""
    return tmp_path_factory.mktemp("lookup") / "runs.log"


@pytest.fixture(scope="session")
def close_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One line per run of the cluster's `close_record` tool: `lookup_record`
    configured as a tool with side effects."""
    return tmp_path_factory.mktemp("close") / "runs.log"


@pytest.fixture(scope="session")
def cluster_config(
    hosted_data_dir: Path, lookup_ledger: Path, close_ledger: Path
) -> ToolserveConfig:
    config = load_config()
    extra_tools = [
        HostedToolConfig(
            function=f"toolworkers.hosted_tools:{name}",
            options={"root": owned_by_tools(hosted_data_dir)},
        )
        for name in ("read_file", "list_files")
    ]
    extra_tools.append(
        HostedToolConfig(
            function="bench.tools:lookup_record",
            options={"latency_s": 1.0, "ledger": owned_by_tools(lookup_ledger, create_file=True)},
        )
    )
    # The records service once more, under a name only the draft's test calls: a
    # tool not run yet, so the draft is asked for it whatever it has timed before.
    extra_tools.append(
        HostedToolConfig(
            function="bench.tools:lookup_record",
            name="find_record",
            options={"latency_s": 1.0},
        )
    )
    extra_tools.append(
        HostedToolConfig(
            function="bench.tools:lookup_record",
            name="close_record",
            side_effect_free=False,
            options={"latency_s": 0.2, "ledger": owned_by_tools(close_ledger, create_file=True)},
        )
    )
    # One tenant with tight quotas of its own (tests/e2e/test_quotas_api.py);
    # every other caller keeps the profile's (none).
    quotas = config.server.quotas.model_copy(
        update={"tenants": {tenant_of(f"Bearer {QUOTA_TENANT_KEY}"): QUOTA_TENANT_LIMITS}}
    )
    return config.model_copy(
        update={
            "server": config.server.model_copy(
                # Short, so a stream's wait for its first token shows the comments and
                # every streaming test's client reads past them.
                update={"port": free_port(), "quotas": quotas, "stream_keep_alive_s": 0.05}
            ),
            "ray": config.ray.model_copy(update={"metrics_export_port": free_port()}),
            "tools": config.tools.model_copy(
                update={"hosted": [*config.tools.hosted, *extra_tools]}
            ),
        }
    )


@pytest.fixture(scope="session")
def cluster(cluster_config: ToolserveConfig) -> Iterator[Endpoints]:
    with LocalCluster(cluster_config, log=lambda line: print(f"[cluster] {line}")) as endpoints:
        yield endpoints


@pytest.fixture(scope="session")
def weather_tool() -> dict[str, Any]:
    """A tool the client runs itself (no hosted tool has its schema)."""
    return WEATHER_TOOL


@pytest.fixture(scope="session")
def model_name(cluster_config: ToolserveConfig) -> str:
    return cluster_config.main.engine.served_model_name


@pytest.fixture(scope="session")
def client(cluster: Endpoints) -> OpenAI:
    return OpenAI(base_url=cluster.api_base, api_key="test", max_retries=0, timeout=120)


@pytest.fixture()
def healthy_after(cluster: Endpoints) -> Iterator[None]:
    """Asserts the server still reports healthy after the test (bad inputs must not hurt it)."""
    yield
    response = httpx.get(cluster.health_url, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "ok"


@pytest.fixture()
def ledger_caught_up(
    client: OpenAI, model_name: str, cluster: Endpoints, weather_tool: dict[str, Any]
) -> Callable[[], None]:
    """Waits until the TTL ledger shows a session turn sent now. The main engine
    publishes its pins in order, so every turn it finished before has then been
    published too: a check for a missing entry after this cannot pass early."""

    def wait() -> None:
        program = f"ledger-barrier-{uuid.uuid4().hex[:8]}"
        client.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[weather_tool],  # type: ignore[list-item]
            tool_choice="required",
            max_tokens=32,
            temperature=0,
            extra_headers={"X-Session-ID": program},
        )
        ledger = TtlLedger(cluster.redis_url)
        deadline = time.monotonic() + 30
        try:
            while ledger.lookup(cluster_program_id(program)) is None:
                assert time.monotonic() < deadline, "the barrier turn never reached the ledger"
                time.sleep(0.1)
        finally:
            ledger.close()
        httpx.delete(f"{cluster.api_base}/sessions/{program}", headers=TEST_CLIENT_AUTH, timeout=30)

    return wait
