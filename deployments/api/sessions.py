"""Sessions: `/v1/sessions` (open, fork, look up, end), SGLang's
`/open_session` and `/close_session` on the same records, and a session's
stateful tools' state (`/v1/sessions/{id}/tool-state/{slot}`)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from cluster.policies.tenancy import scoped_program_id, unscoped_program_id
from cluster.store.pins import ControlOperation, PinningControl
from cluster.store.tool_state import ToolStateUnavailable
from deployments.api.agent_hints import parse_sglang_close, parse_sglang_open
from deployments.api.request_limits import check_session_id
from deployments.api.routes import api_route, app, error_response
from deployments.api.state import IngressState
from deployments.api.tool_api import SessionOpening, parse_session_opening, parse_tool_state
from deployments.errors import ApiError, RequestRejected, engine_not_ready, invalid_request

_STATUS_TIMEOUT_S = 10.0


def _no_session(client_program_id: str | None, param: str) -> ApiError:
    return ApiError(404, f"No session {client_program_id!r}", "session_not_found", param)


class SessionRoutes(IngressState):
    @app.post("/v1/sessions")
    @api_route("sessions")
    async def open_session(self, request: Request, tenant: str) -> Response:
        """Opens a session before its first turn, or forks one from a parent
        session (a sub-agent: see `SessionOpening`)."""
        opening = parse_session_opening(await self._body(request))
        client_program_id, program_id = await self._open_session(tenant, opening)
        return JSONResponse(
            await self._session_view(client_program_id, program_id, opening.parent_id)
        )

    @app.post("/open_session")
    @api_route("sessions")
    async def open_sglang_session(self, request: Request, tenant: str) -> Response:
        """SGLang's session opening; answers the session's id as a JSON string."""
        opening = SessionOpening(id=parse_sglang_open(await self._body(request)))
        client_program_id, _ = await self._open_session(tenant, opening)
        return JSONResponse(client_program_id)

    @app.post("/close_session")
    @api_route("sessions")
    async def close_sglang_session(self, request: Request, tenant: str) -> Response:
        """SGLang's session closing: `DELETE /v1/sessions/{id}`, answered with an
        empty 200."""
        await self._end_session(tenant, parse_sglang_close(await self._body(request)))
        return Response(status_code=200)

    async def _open_session(self, tenant: str, opening: SessionOpening) -> tuple[str, str]:
        """Records a new session (or a fork of the caller's `parent_id`); its id as
        the caller names it and as the cluster keys it. Raises RequestRejected."""
        for given in (opening.id, opening.parent_id):
            if given is not None:
                check_session_id(given, self._limits.max_session_id_chars)
        client_program_id = opening.id or f"session-{uuid.uuid4().hex}"
        program_id = scoped_program_id(tenant, client_program_id)
        parent_id = scoped_program_id(tenant, opening.parent_id) if opening.parent_id else None
        if parent_id == program_id:
            raise RequestRejected(
                invalid_request("A session cannot be forked from itself", "parent_id")
            )
        if parent_id is not None:
            parent = await self._sessions.lookup(parent_id)
            if parent is not None and not parent[0]:
                raise RequestRejected(_no_session(opening.parent_id, "parent_id"))
        await self._sessions.touch(program_id, self._tenancy.session_ttl_s, parent_id)
        return client_program_id, program_id

    @app.get("/v1/sessions/{program_id}")
    @api_route("sessions")
    async def get_session(self, request: Request, tenant: str, program_id: str) -> Response:
        """A session the caller's key knows: its parent and where its KV is pinned."""
        client_program_id = program_id
        program_id = scoped_program_id(tenant, client_program_id)
        known = await self._sessions.lookup(program_id)
        if known is not None and not known[0]:
            raise RequestRejected(_no_session(client_program_id, "program_id"))
        parent = known[1] if known is not None else None
        client_parent = unscoped_program_id(tenant, parent) if parent is not None else None
        return JSONResponse(await self._session_view(client_program_id, program_id, client_parent))

    async def _session_view(
        self, client_program_id: str, program_id: str, client_parent: str | None
    ) -> dict[str, Any]:
        """A session as the API shows it: `pinned` is its KV's replica, tokens and
        expiry (Unix seconds) while pinned, else null; `prefix` is what its
        prompts did with the prefix the engine held for them (counts and the last
        turn's check), null before a returning turn."""
        try:
            entry, prefix = await asyncio.wait_for(
                asyncio.gather(self._pins.lookup(program_id), self._sessions.prefix(program_id)),
                _STATUS_TIMEOUT_S,
            )
        except Exception:  # Redis down or slow: the session is still served
            entry, prefix = None, None
        pinned = (
            None
            if entry is None
            else {
                "replica": entry.replica_id,
                "tokens": entry.tokens,
                "expires_at": entry.expires_at,
            }
        )
        return {
            "id": client_program_id,
            "object": "session",
            "parent_id": client_parent,
            "pinned": pinned,
            "prefix": prefix,
        }

    @app.delete("/v1/sessions/{program_id}")
    @api_route("sessions")
    async def end_session(self, request: Request, tenant: str, program_id: str) -> Response:
        """The client's agent is done: release the program's pinned KV now, on
        whichever replica holds it, and drop its stateful tools' state."""
        await self._end_session(tenant, program_id)
        return JSONResponse({"id": program_id, "object": "session", "deleted": True})

    async def _end_session(self, tenant: str, client_program_id: str) -> None:
        """Raises RequestRejected: 404 for a session the caller's key does not
        know, 503 when no model replica can be told."""
        program_id = scoped_program_id(tenant, client_program_id)
        if await self._sessions.forget(program_id) is False:
            raise RequestRejected(_no_session(client_program_id, "program_id"))
        try:
            ended = PinningControl(ControlOperation.END_PROGRAM, program_id)
            if await self._pins.send_control(ended) == 0:
                await self._main.end_program(program_id)  # Redis down: one replica
        except Exception as error:
            raise RequestRejected(
                engine_not_ready(f"model replica unavailable: {type(error).__name__}")
            ) from error
        with contextlib.suppress(ToolStateUnavailable):  # it expires with its TTL
            await self._tools.states.clear(tenant, program_id)
        program = self._programs.ended(program_id)
        self._program_metrics.ended([program] if program else [])

    @app.put("/v1/sessions/{program_id}/tool-state/{slot}")
    @api_route("tool_state")
    async def set_tool_state(
        self, request: Request, tenant: str, program_id: str, slot: str
    ) -> Response:
        """Starts a stateful tool slot of the program over from the scenario in the
        body (for BFCL's backends, the class's `initial_config`)."""
        check_session_id(program_id, self._limits.max_session_id_chars)
        scenario = parse_tool_state(
            await self._body(request), slot, self._tools.registry.state_slots()
        )
        scoped_id = scoped_program_id(tenant, program_id)
        try:
            await self._tools.states.set_scenario(tenant, scoped_id, slot, scenario)
        except ToolStateUnavailable as error:
            return error_response(
                ApiError(503, f"tool state unavailable: {error}", "state_unavailable")
            )
        await self._sessions.touch(scoped_id, self._tenancy.session_ttl_s)
        return JSONResponse(
            {"object": "tool_state", "program_id": program_id, "slot": slot, "reset": True}
        )
