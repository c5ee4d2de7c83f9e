"""Model replicas' reports of their engines, for `/health` across the cluster."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass
from typing import Any

from cluster.store._redis import async_client, or_fallback

# Reports and `/health`'s reading of them are off every turn's path: they may
# wait longer for a slow Redis than a turn's lookups do. On the multi-node
# fixture under load, Redis's replies passed 0.5 s often enough that reports
# expired while their replicas served, and `/health` flapped.
STATUS_SOCKET_TIMEOUT_S = 2.0


class EngineState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class ReplicaStatus:
    """A model replica's report of its engine, refreshed while it lives."""

    replica_id: str
    role: str
    model: str
    state: EngineState
    detail: str
    node: str = ""
    """The address of the Ray node the replica runs on."""

    def as_report(self) -> dict[str, Any]:
        """The replica as `/health` shows it."""
        return {
            "role": self.role,
            "model": self.model,
            "replica": self.replica_id,
            "node": self.node,
            "state": self.state.value,
            "detail": self.detail,
        }


_PREFIX = "toolserve:replica-status:"


class ReplicaStatusStore:
    """Reports keyed by deployment (one `toolserve up`) and replica, each expiring
    unless refreshed. A store belongs to the event loop that first uses it."""

    def __init__(self, url: str):
        self._client = async_client(url, socket_timeout_s=STATUS_SOCKET_TIMEOUT_S)

    async def announce(self, deployment_id: str, status: ReplicaStatus, ttl_s: float) -> bool:
        """Whether the report was written."""
        record = asdict(status) | {"state": status.state.value}
        written = await or_fallback(
            self._client.set(
                f"{_PREFIX}{deployment_id}:{status.replica_id}",
                json.dumps(record),
                px=int(ttl_s * 1000),
            ),
            None,
            f"cannot announce replica {status.replica_id}",
        )
        return bool(written)

    async def forget(self, deployment_id: str, replica_id: str) -> None:
        """Drops a replica's report (the replica is gone)."""
        await or_fallback(
            self._client.delete(f"{_PREFIX}{deployment_id}:{replica_id}"),
            None,
            f"cannot forget replica {replica_id}",
        )

    async def statuses(self, deployment_id: str) -> list[ReplicaStatus] | None:
        """The last report of every live replica of the deployment; None when Redis
        cannot answer."""

        async def read() -> list[Any]:
            keys = [key async for key in self._client.scan_iter(f"{_PREFIX}{deployment_id}:*")]
            return list(await self._client.mget(keys)) if keys else []

        values = await or_fallback(read(), None, "cannot read replica statuses")
        if values is None:
            return None
        return [_status(json.loads(raw)) for raw in values if raw is not None]

    async def close(self) -> None:
        await self._client.aclose()


def _status(fields: dict[str, Any]) -> ReplicaStatus:
    return ReplicaStatus(
        fields["replica_id"], fields["role"], fields["model"], EngineState(fields["state"]),
        fields["detail"], fields.get("node", ""),
    )  # fmt: skip
