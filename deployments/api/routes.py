"""The ingress's FastAPI application, its error answers, and `api_route`: how
every authenticated route checks the caller's key, answers a rejection and is
counted, once for all of them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.api.openapi_schema import with_request_bodies
from deployments.errors import ApiError, RequestRejected, retry_after_header

if TYPE_CHECKING:
    from deployments.api.state import IngressState

app = FastAPI(title="toolserve", docs_url=None, redoc_url=None)


def _openapi_with_request_bodies() -> dict[str, Any]:
    if app.openapi_schema is None:
        app.openapi_schema = with_request_bodies(
            get_openapi(title=app.title, version=app.version, routes=app.routes)
        )
    return app.openapi_schema


app.openapi = _openapi_with_request_bodies  # type: ignore[method-assign]


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    if error.retry_after_s is not None:
        headers = (headers or {}) | {"Retry-After": retry_after_header(error.retry_after_s)}
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


@app.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(ApiError.from_status(exc.status_code, str(exc.detail)))


@app.exception_handler(Exception)
async def _unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    return error_response(ApiError(500, f"internal error: {type(exc).__name__}", "internal_error"))


def rejected_response(rejected: RequestRejected) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if rejected.error.status == 401 else None
    return error_response(rejected.error, headers)


Handler = Callable[..., Awaitable[Response]]


def api_route(route: str) -> Callable[[Handler], Handler]:
    """Wraps a route method `(self, request, tenant, **path)`: the caller's tenant
    from its API key (401 otherwise), a `RequestRejected` answered as its error,
    and every answer counted by `route` and status. FastAPI sees the method
    without `tenant`."""

    def decorate(handler: Handler) -> Handler:
        signature = inspect.signature(handler, eval_str=True)

        @functools.wraps(handler)
        async def endpoint(self: IngressState, request: Request, **path: Any) -> Response:
            try:
                response = await handler(self, request, self._tenant(request), **path)
            except RequestRejected as rejected:
                response = rejected_response(rejected)
            self._count(route, response.status_code)
            return response

        endpoint.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p for name, p in signature.parameters.items() if name != "tenant"]
        )
        return endpoint

    return decorate
