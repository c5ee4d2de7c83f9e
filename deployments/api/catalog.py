"""What the cluster serves: `/v1/models` (the main model, and the draft model
clients may ask for predictions) and `/v1/tools` (the hosted tools' schemas, with
each one's speculation policy and the caller's speculation ledger)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from deployments.api.routes import api_route, app
from deployments.api.state import IngressState


class CatalogRoutes(IngressState):
    @app.get("/v1/models")
    @api_route("models")
    async def models(self, request: Request, tenant: str) -> Response:
        """The main model, and the draft model (clients may ask it for predictions)."""
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": self._created,
                        "owned_by": "toolserve",
                        "max_model_len": self._max_model_len,
                    }
                    for name in self._model_names()
                ],
            }
        )

    @app.get("/v1/tools")
    @api_route("tools")
    async def hosted_tools(self, request: Request, tenant: str) -> Response:
        """The hosted tools' OpenAI schemas, to put in a request's `tools`; beside
        them (`toolserve`) each tool's speculation policy and the caller's
        speculation ledger."""
        return JSONResponse(
            {
                "object": "list",
                "data": self._tools.registry.openai_schemas(),
                "toolserve": {
                    "speculation_policies": self._speculator.policies(),
                    "speculation_ledger": await self._speculator.ledger(tenant),
                },
            }
        )
