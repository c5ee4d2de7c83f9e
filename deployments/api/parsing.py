"""A chat completion request read once: its body decoded and validated into
vLLM's request model, its `toolserve` options and agent hints taken out, its
program id chosen; and what the hints hand the engine."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from cluster.config import ServerConfig
from cluster.openai_protocol import EXPECTED_TOOL_ARG, LAST_STEP_ARG, RETAIN_FOR_ARG
from deployments.api.agent_hints import AgentHints, read_agent_hints
from deployments.api.request_limits import check_message_count, check_session_id, decode_json
from deployments.api.tool_api import TurnOptions, pop_turn_options
from deployments.errors import RequestRejected, invalid_request, model_not_found
from router.prefix import conversation_key

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

SESSION_HEADER = "X-Session-ID"
MAX_SESSION_ID_CHARS = ServerConfig.model_fields["max_session_id_chars"].default
MAX_MESSAGES = ServerConfig.model_fields["max_messages"].default
ONESHOT_PREFIX = "oneshot-"
CONVERSATION_PREFIX = "conversation-"


def program_id_for(
    header_value: str | None,
    body: dict[str, Any],
    max_chars: int = MAX_SESSION_ID_CHARS,
    hinted: str | None = None,
    derive: bool = False,
) -> str:
    """The program id of a request: header, else body field, else an agent-hint
    dialect's session id, else (with `derive`) one named by how its conversation
    opens, else a fresh one-turn id."""
    body_value = body.get("session_id")
    if body_value is not None and not (isinstance(body_value, str) and body_value):
        raise RequestRejected(
            invalid_request("session_id must be a non-empty string", "session_id")
        )
    given = {
        f"{SESSION_HEADER} header": header_value,
        "body session_id": body_value,
        "the agent hints' session id": hinted,
    }
    named = {where: value for where, value in given.items() if value}
    if len(set(named.values())) > 1:
        raise RequestRejected(
            invalid_request(
                " and ".join(f"{where} ({value!r})" for where, value in named.items())
                + " disagree",
                "session_id",
            )
        )
    chosen = next(iter(named.values()), None)
    if not chosen:
        opening = conversation_key(body.get("messages"), body.get("tools")) if derive else None
        return CONVERSATION_PREFIX + opening if opening else ONESHOT_PREFIX + uuid.uuid4().hex
    check_session_id(chosen, max_chars)
    return chosen


def mark_last_step(request: ChatCompletionRequest) -> None:
    """Tells the engine this turn is its program's last: nothing to pin after it."""
    request.vllm_xargs = (request.vllm_xargs or {}) | {LAST_STEP_ARG: 1}


def apply_agent_hints(
    request: ChatCompletionRequest, hints: AgentHints, schedules_by_priority: bool = True
) -> None:
    """Hands the engine what the hints say about the program's KV and order; the
    request's own `priority` wins over a dialect's, which engines that do not
    schedule by priority never see (they would refuse the request)."""
    if hints.last_turn:
        mark_last_step(request)
    retention: dict[str, Any] = {}
    if hints.retain_for_s is not None:
        retention[RETAIN_FOR_ARG] = hints.retain_for_s
    if hints.expected_tool_s is not None:
        retention[EXPECTED_TOOL_ARG] = hints.expected_tool_s
    if retention:
        request.vllm_xargs = (request.vllm_xargs or {}) | retention
    if hints.priority is not None and request.priority == 0 and schedules_by_priority:
        request.priority = hints.priority


def _validation_message(error: ValidationError) -> str:
    problems = []
    for item in error.errors()[:5]:
        location = ".".join(str(part) for part in item["loc"] if part != "body")
        problems.append(f"{location}: {item['msg']}" if location else item["msg"])
    return "Invalid request: " + "; ".join(problems)


OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


_OBJECT_FIELDS = ("structured_outputs",)
"""Fields vLLM's request model reads as objects before it validates their type."""


def _check_object_fields(body: dict[str, Any]) -> None:
    for name in _OBJECT_FIELDS:
        value = body.get(name)
        if value is not None and not isinstance(value, dict):
            raise RequestRejected(invalid_request(f"{name} must be an object", name))


def _check_messages(messages: Any) -> None:
    """OpenAI's message rules that vLLM's permissive request model does not enforce."""
    if not isinstance(messages, list) or not messages:
        raise RequestRejected(invalid_request("messages must be a non-empty array", "messages"))
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestRejected(invalid_request(f"{param} must be an object", param))
        role = message.get("role")
        if role not in OPENAI_ROLES:
            raise RequestRejected(
                invalid_request(
                    f"Invalid value for {param}.role: {role!r}. Supported values are: "
                    + ", ".join(repr(known) for known in OPENAI_ROLES),
                    f"{param}.role",
                )
            )
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise RequestRejected(
                invalid_request(
                    f"{param} has role 'tool' but no tool_call_id", f"{param}.tool_call_id"
                )
            )
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not (
            isinstance(tool_calls, list) and all(isinstance(call, dict) for call in tool_calls)
        ):
            raise RequestRejected(
                invalid_request(
                    f"{param}.tool_calls must be an array of objects", f"{param}.tool_calls"
                )
            )


@dataclass(frozen=True)
class ParsedChat:
    """A chat completion body, its `toolserve` options taken out."""

    body: dict[str, Any]
    """The JSON body (what the speculator reads)."""
    request: ChatCompletionRequest
    """The same body validated, once: what crosses to the model replica."""
    options: TurnOptions
    hints: AgentHints


def parse_chat_body(
    raw: bytes,
    served_models: list[str],
    max_messages: int = MAX_MESSAGES,
    headers: Mapping[str, str] | None = None,
) -> ParsedChat:
    """Decode and validate a chat completion body; raises RequestRejected with a 4xx."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.exceptions import VLLMClientError

    try:
        body = decode_json(raw)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError among them
        raise RequestRejected(
            invalid_request(f"Request body is not valid JSON: {error}")
        ) from error
    if not isinstance(body, dict):
        raise RequestRejected(invalid_request("Request body must be a JSON object"))
    model = body.get("model")
    if model is not None and model not in served_models:
        raise RequestRejected(model_not_found(str(model), served_models))
    _check_messages(body.get("messages"))
    _check_object_fields(body)
    check_message_count(body["messages"], max_messages)
    options = pop_turn_options(body)
    hints = read_agent_hints(
        body,
        headers or {},
        retain_for_s=options.retain_for_s,
        expected_tool_s=options.expected_tool_s,
        last_turn=options.last_turn,
        parent_session_id=options.parent_session_id,
    )
    try:
        request = ChatCompletionRequest.model_validate(body)
        _read_lazy_message_fields(request)
    except ValidationError as error:
        raise RequestRejected(invalid_request(_validation_message(error))) from error
    except RecursionError as error:
        raise RequestRejected(invalid_request("Request nested too deeply")) from error
    except (ValueError, TypeError, AttributeError, VLLMClientError) as error:
        # vLLM's own before-validators assume shapes the schema has not checked yet
        raise RequestRejected(invalid_request(f"Invalid request: {error}")) from error
    return ParsedChat(body, request, options, hints)


def _read_lazy_message_fields(request: ChatCompletionRequest) -> None:
    """vLLM types some message fields (a user message's content parts, an
    assistant's tool calls) as iterables, which pydantic validates lazily, as they
    are read: read them now, so an invalid part is refused here, not wherever the
    replica first reads it. Raises pydantic's ValidationError."""
    for message in request.messages:
        if isinstance(message, dict):
            for key, value in message.items():
                if isinstance(value, Iterator):
                    message[key] = list(value)
