"""`/health`: every model role's replicas and Redis, as one report (not
authenticated, not counted); and Serve's own health probe of the replica."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.responses import JSONResponse

from cluster.store.replicas import EngineState, ReplicaStatus
from deployments.api.model_client import InProcessClient, ModelClient
from deployments.api.routes import app
from deployments.api.state import IngressState
from deployments.errors import engine_not_ready

_STATUS_TIMEOUT_S = 10.0


REDIS_DOWN_DETAIL = (
    "Redis unreachable: turns are still served, without what Redis holds (the tool "
    "cache, the TTL ledger routing reads, replica reports, stateful tools' state, "
    "response owners for /cache-tool-output); each resumes when Redis is back"
)


PENDING_DETAIL = "a configured replica that has not reported: not placed yet, or its node is lost"


def health_report(
    wanted: dict[str, int], engines: list[dict[str, Any]], redis_reachable: bool
) -> dict[str, Any]:
    """The cluster's health: `unavailable` while a model role has no ready replica
    (turns would fail), `degraded` while every role is served but Redis is
    unreachable or some replica is not ready, else `ok`; with each component's
    state. `wanted` holds each role's configured replica count: a role none of
    whose replicas reported yet is starting, and each replica fewer than wanted
    is pending (Serve has not placed it, e.g. its node is lost)."""
    roles = list(wanted)
    for role, count in wanted.items():
        reported = sum(1 for engine in engines if engine["role"] == role)
        if not reported:
            engines.append(
                {"role": role, "state": "starting", "detail": "no replica has reported yet"}
            )
            reported = 1
        engines.extend(
            {"role": role, "state": "pending", "detail": PENDING_DETAIL}
            for _ in range(count - reported)
        )
    ready = {
        role: sum(1 for e in engines if e["role"] == role and e["state"] == EngineState.READY.value)
        for role in roles
    }
    components: dict[str, dict[str, Any]] = {}
    for role in roles:
        replicas = sum(1 for e in engines if e["role"] == role)
        status = (
            "unavailable" if not ready[role] else "ok" if ready[role] == replicas else "degraded"
        )
        components[role] = {"status": status, "ready_replicas": ready[role], "replicas": replicas}
    components["redis"] = (
        {"status": "ok"}
        if redis_reachable
        else {"status": "unreachable", "detail": REDIS_DOWN_DETAIL}
    )
    if not all(ready.values()):
        status = "unavailable"
    elif all(component["status"] == "ok" for component in components.values()):
        status = "ok"
    else:
        status = "degraded"
    return {
        "status": status,
        "components": components,
        "engines": engines,
        "ready_replicas": ready,
    }


class HealthRoutes(IngressState):
    @app.get("/health")
    async def health(self) -> JSONResponse:
        """Every replica's engine (as reported to Redis; one per role without
        reports) and Redis itself: 200 while each model role has a ready replica
        (`ok` or `degraded`), else 503 (`unavailable`)."""
        roles = {"main": self._main} | ({"draft": self._draft} if self._draft else {})
        wanted = {role: self._wanted_replicas.get(role, 1) for role in roles}
        reports = await self._replica_statuses.statuses(self._deployment_id)
        engines = [
            report.as_report()
            for report in sorted(reports or [], key=lambda r: (r.role, r.replica_id))
        ]
        # A role without reports (Redis down, or just back and not yet re-announced
        # to) is asked directly: one of its replicas answers for it.
        reported = {engine["role"] for engine in engines}
        engines += [
            await self._status_of(role, model)
            for role, model in roles.items()
            if role not in reported
        ]
        report = health_report(wanted, engines, redis_reachable=reports is not None)
        if report["status"] == "unavailable":
            waiting = [e for e in engines if e["state"] != EngineState.READY.value] or engines
            not_ready = "; ".join(f"{e['role']}: {e['detail']}" for e in waiting)
            body = engine_not_ready(not_ready).body() | report
            return JSONResponse(body, status_code=503)
        return JSONResponse(report)

    async def check_health(self) -> None:
        """Ray Serve's health probe: with the main model in this replica, a dead
        engine makes Serve replace the replica."""
        if isinstance(self._main, InProcessClient):
            await self._main.check_health()

    async def _status_of(self, role: str, model: ModelClient) -> dict[str, Any]:
        try:
            status: ReplicaStatus = await asyncio.wait_for(model.status(), _STATUS_TIMEOUT_S)
        except Exception as error:
            return {
                "role": role,
                "state": "unreachable",
                "detail": f"replica unreachable: {type(error).__name__}",
            }
        return status.as_report()
