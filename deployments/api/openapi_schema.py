"""The API's OpenAPI document with the request bodies its routes read.

The routes read their bodies themselves (size caps, strict JSON, OpenAI-style
errors), so FastAPI cannot see what they accept; this module says it, so
clients and fuzzers generating requests from `/openapi.json` know each body.
The chat body is vLLM's own request model, which the ingress validates with,
plus toolserve's `toolserve` turn options and the agent-hint dialects' fields."""

from __future__ import annotations

from typing import Any

from deployments.api.agent_hints import (
    DIALECT_MODELS,
    RETENTION_SCHEMA,
    SGLANG_RETENTION_FIELD,
    SglangCloseSession,
    SglangOpenSession,
)
from deployments.api.tool_api import (
    TURN_OPTIONS_FIELD,
    PostedToolOutput,
    SessionOpening,
    TurnOptions,
)

COMPONENT_REF = "#/components/schemas/{model}"


def chat_request_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The chat completion body's schema and the component schemas it refers to."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    schema = ChatCompletionRequest.model_json_schema(ref_template=COMPONENT_REF)
    components = schema.pop("$defs", {})
    schema["properties"][TURN_OPTIONS_FIELD] = TurnOptions.model_json_schema()
    for field, model in DIALECT_MODELS.items():
        dialect = model.model_json_schema(ref_template=COMPONENT_REF)
        components.update(dialect.pop("$defs", {}))
        schema["properties"][field] = dialect
    schema["properties"][SGLANG_RETENTION_FIELD] = RETENTION_SCHEMA
    return schema, components


def tool_outputs_schema() -> dict[str, Any]:
    return {
        "type": "array",
        "items": PostedToolOutput.model_json_schema(),
        "description": "Outputs of tools the client ran for one of its responses.",
    }


TOOL_STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The slot's scenario (for BFCL's backends, a class's `initial_config`).",
}


SESSION_HEADER_PARAMETER: dict[str, Any] = {
    "name": "X-Session-ID",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "The agent program this turn belongs to (or the body's `session_id`).",
}


def with_request_bodies(document: dict[str, Any]) -> dict[str, Any]:
    """`document` (FastAPI's generated OpenAPI) with each route's JSON request body."""
    chat, components = chat_request_schema()
    bodies = {
        ("/v1/chat/completions", "post"): chat,
        ("/cache-tool-output/{response_id}", "post"): tool_outputs_schema(),
        ("/v1/sessions/{program_id}/tool-state/{slot}", "put"): TOOL_STATE_SCHEMA,
        ("/v1/sessions", "post"): SessionOpening.model_json_schema(),
        ("/open_session", "post"): SglangOpenSession.model_json_schema(),
        ("/close_session", "post"): SglangCloseSession.model_json_schema(),
    }
    paths = document.get("paths", {})
    for (path, method), schema in bodies.items():
        operation = paths.get(path, {}).get(method)
        if operation is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema}},
            }
    chat_operation = paths.get("/v1/chat/completions", {}).get("post")
    if chat_operation is not None:
        chat_operation.setdefault("parameters", []).append(SESSION_HEADER_PARAMETER)
    document.setdefault("components", {}).setdefault("schemas", {}).update(components)
    return document
