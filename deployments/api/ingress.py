"""The OpenAI-compatible ingress deployment: its state (`IngressState`) and the
route groups (chat, sessions, tool outputs, catalog, health) composed into the
one class Serve runs."""

from __future__ import annotations

from ray import serve

from deployments.api.catalog import CatalogRoutes
from deployments.api.chat import ChatRoutes
from deployments.api.health import HealthRoutes
from deployments.api.routes import app
from deployments.api.sessions import SessionRoutes
from deployments.api.tool_outputs import ToolOutputRoutes


# NOTE: Serve pickles the FastAPI app when the class is decorated. The routes stay
# in the route-group classes of importable modules, so they travel by reference; a
# route defined in this class body would travel by value, with every helper it
# calls.
@serve.ingress(app)
class OpenAIIngress(ChatRoutes, SessionRoutes, ToolOutputRoutes, CatalogRoutes, HealthRoutes):
    """`/v1/chat/completions`, `/v1/sessions`, `/cache-tool-output`, `/v1/models`,
    `/v1/tools`, `/health`."""
