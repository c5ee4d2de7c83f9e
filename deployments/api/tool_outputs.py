"""`POST /cache-tool-output/{response_id}`: outputs of tools a client ran for
one of its responses, cached in that response's program."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from cluster.store.responses import ResponseOwner
from deployments.api.routes import api_route, app
from deployments.api.state import IngressState
from deployments.api.tool_api import PostedToolOutput, parse_tool_outputs
from deployments.errors import ApiError, RequestRejected
from toolworkers.cache_keys import ArgumentsError, normalized_arguments


class ToolOutputRoutes(IngressState):
    @app.post("/cache-tool-output/{response_id}")
    @api_route("cache_tool_output")
    async def cache_tool_output(self, request: Request, tenant: str, response_id: str) -> Response:
        """Outputs of tools the client ran (speculatively) for a response of its
        own: cached in that response's program, where the server's continuation
        and later turns find them."""
        owner = await self._response_owner(response_id, tenant)
        outputs = parse_tool_outputs(await self._body(request))
        cached = await self._cache_outputs(owner, outputs)
        return JSONResponse({"cached": cached})

    async def _response_owner(self, response_id: str, tenant: str) -> ResponseOwner:
        try:
            owner = await self._response_owners.owner(response_id)
        except Exception as error:
            raise RequestRejected(
                ApiError(
                    503, f"tool cache unavailable: {type(error).__name__}", "cache_unavailable"
                )
            ) from error
        if owner is None:
            raise RequestRejected(
                ApiError(
                    404,
                    f"No response with id {response_id!r} to a request that declared tools",
                    "not_found",
                    "response_id",
                )
            )
        if owner.tenant != tenant:
            raise RequestRejected(
                ApiError(
                    403,
                    f"Response {response_id!r} belongs to another caller",
                    "forbidden",
                    "response_id",
                )
            )
        return owner

    async def _cache_outputs(self, owner: ResponseOwner, outputs: list[PostedToolOutput]) -> int:
        for index, output in enumerate(outputs):
            try:
                normalized_arguments(output.params)
            except ArgumentsError as error:
                raise RequestRejected(
                    ApiError(
                        422, f"Invalid entry [{index}].params: {error}", "unprocessable_entity"
                    )
                ) from error
        stored = [
            await self._tools.post_client_result(
                output.name,
                output.params,
                output.output_text(),
                output.keep_alive,
                tenant=owner.tenant,
                program_id=owner.program_id,
            )
            for output in outputs
        ]
        return sum(stored)
