"""What crosses from the ingress to a model replica with a turn, and back: the
turn's context beyond its body, the reply's head and (streamed) tail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cluster.openai_protocol import LAST_STEP_ARG, ModelToolCall
from deployments.errors import ApiError

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest


@dataclass(frozen=True)
class TurnContext:
    """What the ingress knows about a turn beyond its body."""

    tenant: str
    execute_tools: bool
    wants_calls: bool = False
    """A streamed reply ends with a `ReplyTail` of its calls (the ingress is settling
    a speculation against them); otherwise nobody reads them."""
    stop_invalid_calls: bool | None = None
    """The request's own choice; None: the deployment's."""
    stream_client_calls: bool | None = None
    """The request's own choice; None: the deployment's."""


@dataclass(frozen=True)
class ReplyTail:
    """Last item of a streamed chat reply: every call it made (those the server
    ran, then the reply's own), so the stream is parsed once, here."""

    tool_calls: list[ModelToolCall]


@dataclass(frozen=True)
class ReplyHead:
    """First item of every chat reply: how the ingress should answer."""

    replica_id: str
    streaming: bool
    body: dict[str, Any] | None = None
    error: ApiError | None = None
    prefix: dict[str, Any] | None = None
    """The turn's prompt against the prefix the engine held for its program
    (`PrefixCheck.as_json`); None when there was nothing to check against."""


def is_last_step(request: ChatCompletionRequest) -> bool:
    """The client (or the ingress, for a turn without a session) marked the turn
    its program's last."""
    return bool(request.vllm_xargs and request.vllm_xargs.get(LAST_STEP_ARG))
