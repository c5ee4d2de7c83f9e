"""Agent hints a chat request may carry, in the dialects of the serving systems
agents already use, read into one `AgentHints`.

Dialects (each field optional; the dialect's fields are removed from the body,
so vLLM never sees them):
- toolserve: `toolserve.retain_for_s`, `toolserve.expected_tool_s`,
  `toolserve.last_turn`, `toolserve.parent_session_id`.
- NVIDIA Dynamo: `nvext.agent_hints` (`priority`, higher is more important;
  `latency_sensitivity`, its deprecated alias; `osl`, `speculative_prefill`,
  `strict_priority` accepted, not used), `nvext.session_control` (`session_id`,
  `action` open/bind/close, `timeout`), and the headers `x-dynamo-session-id`,
  `x-dynamo-session-final` and `x-dynamo-parent-session-id`.
- SGLang: `session_params.id` on the chat body, the proposed `retention_seconds`,
  and the proposed `agent_hints` (`expected_tool_duration_ms`, `cache_ttl_ms`,
  `reuse_hint`).
- vLLM's proposed `agent_hint` (`session_id`, `parent_session_id`,
  `cache_control.ttl`, an `evict` edit in `context_management.edits`). vLLM's
  own top-level `priority` (lower first) and `session_id` are the request's and
  pass through as they are.

Where dialects disagree on a session id the request is refused; otherwise the
first dialect in the order above that gives a hint wins. Unknown fields inside a
dialect's object are ignored (logged at debug level); a malformed value is a 400.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deployments.api.request_limits import decode_json
from deployments.errors import RequestRejected, invalid_request

logger = logging.getLogger("toolserve.agent_hints")

DYNAMO_FIELD = "nvext"
SGLANG_SESSION_FIELD = "session_params"
SGLANG_RETENTION_FIELD = "retention_seconds"
SGLANG_HINTS_FIELD = "agent_hints"
VLLM_HINT_FIELD = "agent_hint"
DYNAMO_SESSION_HEADER = "x-dynamo-session-id"
DYNAMO_FINAL_HEADER = "x-dynamo-session-final"
DYNAMO_PARENT_HEADER = "x-dynamo-parent-session-id"
_TRUE_HEADER_VALUES = frozenset({"1", "true", "yes"})
_FALSE_HEADER_VALUES = frozenset({"0", "false", "no", ""})


@dataclass(frozen=True)
class AgentHints:
    """What a request said about its program, whichever dialect it spoke.

    `retain_for_s`: keep the program's KV this long after the turn (inf: as long
    as allowed); `expected_tool_s`: how long the tool it calls will take;
    `priority`: vLLM's order, lower first; `parent_session_id`: the program
    this one was forked from (a sub-agent's parent); `given`: `dialect.hint`
    for each hint taken, for metrics."""

    session_id: str | None = None
    parent_session_id: str | None = None
    retain_for_s: float | None = None
    expected_tool_s: float | None = None
    last_turn: bool = False
    priority: int | None = None
    given: tuple[str, ...] = ()


class Dialect(BaseModel):
    """A dialect's object: fields toolserve does not use are accepted and ignored."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


_I32 = 2**31


class DynamoAgentHints(Dialect):
    """Dynamo's `nvext.agent_hints`: `priority` (higher is more important) and
    its deprecated alias `latency_sensitivity` are used."""

    priority: int | None = Field(default=None, ge=-_I32, lt=_I32)
    latency_sensitivity: float | None = Field(default=None, ge=-_I32, lt=_I32)
    osl: int | None = Field(default=None, ge=0)
    speculative_prefill: bool | None = None
    strict_priority: int | None = Field(default=None, ge=0, lt=_I32)


class DynamoSessionControl(Dialect):
    """Dynamo's `nvext.session_control`: the session is the program; `close`
    ends it after this turn."""

    session_id: str = Field(min_length=1)
    action: Literal["open", "bind", "close"] | None = None
    timeout: int | None = Field(default=None, ge=0)


class DynamoExtension(Dialect):
    """Dynamo's `nvext` request extension."""

    agent_hints: DynamoAgentHints | None = None
    session_control: DynamoSessionControl | None = None
    extra_fields: list[str] | None = None


class SglangSessionParams(Dialect):
    """SGLang's `session_params`: `id` names the program (the rest concerns
    SGLang's token splicing)."""

    id: str | None = Field(default=None, min_length=1)
    rid: str | None = None
    offset: int | None = None
    replace: bool | None = None
    drop_previous_output: bool | None = None


class SglangAgentHints(Dialect):
    """SGLang's proposed `agent_hints`: expected tool time and cache TTL, in milliseconds."""

    expected_tool_duration_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cache_ttl_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    reuse_hint: str | None = None


class VllmCacheControl(Dialect):
    """`cache_control` of vLLM's proposed `agent_hint`: keep the KV `ttl` seconds."""

    type: Literal["ephemeral"] = "ephemeral"
    ttl: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class VllmEdit(Dialect):
    """An edit of vLLM's proposed context management; a whole-context `evict` ends the program."""

    type: Literal["offload", "prefetch", "evict"]
    block_start: int | None = Field(default=None, ge=0)
    block_end: int | None = Field(default=None, ge=0)


class VllmContextManagement(Dialect):
    """`context_management` of vLLM's proposed `agent_hint`."""

    manage_request: bool | None = None
    edits: list[VllmEdit] = []


class VllmAgentHint(Dialect):
    """vLLM's proposed `agent_hint`."""

    session_id: str | None = Field(default=None, min_length=1)
    parent_session_id: str | None = Field(default=None, min_length=1)
    cache_control: VllmCacheControl | None = None
    context_management: VllmContextManagement | None = None


class SglangOpenSession(Dialect):
    """The body of SGLang's `/open_session` (`capacity_of_str_len`, `streaming`
    and `timeout` concern SGLang's own session store and are not used)."""

    session_id: str | None = Field(default=None, min_length=1)
    capacity_of_str_len: int | None = Field(default=None, ge=0)
    streaming: bool | None = None
    timeout: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class SglangCloseSession(Dialect):
    """The body of SGLang's `/close_session`."""

    session_id: str = Field(min_length=1)


def _sglang_body(raw: bytes) -> Any:
    try:
        return decode_json(raw)
    except ValueError as error:
        raise RequestRejected(
            invalid_request(f"Request body is not valid JSON: {error}")
        ) from error


def parse_sglang_open(raw: bytes) -> str | None:
    """The session id of an SGLang `/open_session` body (None: the server names
    one). Raises RequestRejected (400)."""
    opened: SglangOpenSession = _parse(SglangOpenSession, _sglang_body(raw), "body")
    return opened.session_id


def parse_sglang_close(raw: bytes) -> str:
    """The session id of an SGLang `/close_session` body. Raises RequestRejected (400)."""
    closed: SglangCloseSession = _parse(SglangCloseSession, _sglang_body(raw), "body")
    return closed.session_id


DIALECT_MODELS: dict[str, type[BaseModel]] = {
    DYNAMO_FIELD: DynamoExtension,
    SGLANG_SESSION_FIELD: SglangSessionParams,
    SGLANG_HINTS_FIELD: SglangAgentHints,
    VLLM_HINT_FIELD: VllmAgentHint,
}
"""The dialects' objects on a chat body, by field (for the OpenAPI document)."""
RETENTION_SCHEMA = {"type": "number", "minimum": 0}


class _Collected:
    """Hints in dialect order: the first value of each hint is kept."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.session_ids: dict[str, str] = {}

    def add(self, dialect: str, hint: str, value: Any) -> None:
        if value is None or hint in self.values:
            return
        self.values[hint] = value
        self.sources[hint] = f"{dialect}.{hint}"

    def session(self, where: str, session_id: str | None) -> None:
        if session_id:
            self.session_ids[where] = session_id

    def hints(self) -> AgentHints:
        distinct = set(self.session_ids.values())
        if len(distinct) > 1:
            named = ", ".join(f"{where}={value!r}" for where, value in self.session_ids.items())
            raise RequestRejected(invalid_request(f"Session ids disagree: {named}", "session_id"))
        return AgentHints(
            session_id=next(iter(distinct), None),
            retain_for_s=self.values.get("retain_for_s"),
            expected_tool_s=self.values.get("expected_tool_s"),
            parent_session_id=self.values.get("parent_session_id"),
            last_turn=bool(self.values.get("last_turn", False)),
            priority=self.values.get("priority"),
            given=tuple(self.sources.values()),
        )


def _parse(model: type[Dialect], raw: Any, where: str) -> Any:
    try:
        parsed = model.model_validate(raw)
    except ValidationError as error:
        item = error.errors()[0]
        location = ".".join([where, *(str(part) for part in item["loc"])])
        raise RequestRejected(
            invalid_request(f"Invalid {location}: {item['msg']}", location)
        ) from error
    _log_ignored(parsed, where)
    return parsed


def _log_ignored(parsed: Dialect, where: str) -> None:
    ignored = parsed.ignored_fields()
    if ignored:
        logger.debug("ignored unknown hint fields in %s: %s", where, ", ".join(ignored))
    for name, value in parsed:
        if isinstance(value, Dialect):
            _log_ignored(value, f"{where}.{name}")


def _header_flag(headers: Mapping[str, str], name: str) -> bool:
    value = headers.get(name)
    if value is None:
        return False
    normalised = value.strip().lower()
    if normalised in _TRUE_HEADER_VALUES:
        return True
    if normalised in _FALSE_HEADER_VALUES:
        return False
    raise RequestRejected(invalid_request(f"{name} must be true or false, not {value!r}", name))


def read_agent_hints(
    body: dict[str, Any],
    headers: Mapping[str, str],
    *,
    retain_for_s: float | None = None,
    expected_tool_s: float | None = None,
    last_turn: bool = False,
    parent_session_id: str | None = None,
) -> AgentHints:
    """Removes the dialects' fields from `body` and reads them, after the
    toolserve options given as keywords. `headers` are looked up lower-case."""
    collected = _Collected()
    collected.add("toolserve", "retain_for_s", retain_for_s)
    collected.add("toolserve", "expected_tool_s", expected_tool_s)
    collected.add("toolserve", "last_turn", last_turn or None)
    collected.add("toolserve", "parent_session_id", parent_session_id)

    raw_vllm = body.pop(VLLM_HINT_FIELD, None)
    if raw_vllm is not None:
        vllm: VllmAgentHint = _parse(VllmAgentHint, raw_vllm, VLLM_HINT_FIELD)
        collected.session(f"{VLLM_HINT_FIELD}.session_id", vllm.session_id)
        collected.add("vllm", "parent_session_id", vllm.parent_session_id)
        if vllm.cache_control is not None and vllm.cache_control.ttl is not None:
            collected.add("vllm", "retain_for_s", vllm.cache_control.ttl)
        edits = vllm.context_management.edits if vllm.context_management else []
        if any(edit.type == "evict" and edit.block_start is None for edit in edits):
            collected.add("vllm", "last_turn", True)

    raw_params = body.pop(SGLANG_SESSION_FIELD, None)
    if raw_params is not None:
        session: SglangSessionParams = _parse(SglangSessionParams, raw_params, SGLANG_SESSION_FIELD)
        collected.session(f"{SGLANG_SESSION_FIELD}.id", session.id)
    raw_retention = body.pop(SGLANG_RETENTION_FIELD, None)
    if raw_retention is not None:
        if (
            isinstance(raw_retention, bool)
            or not isinstance(raw_retention, int | float)
            or not 0 <= raw_retention < math.inf
        ):
            raise RequestRejected(
                invalid_request(
                    f"{SGLANG_RETENTION_FIELD} must be a number of seconds, 0 or more",
                    SGLANG_RETENTION_FIELD,
                )
            )
        # SGLang's proposal: 0 retains for good; here that is as long as allowed.
        collected.add("sglang", "retain_for_s", float(raw_retention) or math.inf)
    raw_sglang_hints = body.pop(SGLANG_HINTS_FIELD, None)
    if raw_sglang_hints is not None:
        sglang: SglangAgentHints = _parse(SglangAgentHints, raw_sglang_hints, SGLANG_HINTS_FIELD)
        if sglang.cache_ttl_ms is not None:
            collected.add("sglang", "retain_for_s", sglang.cache_ttl_ms / 1000)
        if sglang.expected_tool_duration_ms is not None:
            collected.add("sglang", "expected_tool_s", sglang.expected_tool_duration_ms / 1000)

    raw_dynamo = body.pop(DYNAMO_FIELD, None)
    if raw_dynamo is not None:
        dynamo: DynamoExtension = _parse(DynamoExtension, raw_dynamo, DYNAMO_FIELD)
        control = dynamo.session_control
        if control is not None:
            collected.session(f"{DYNAMO_FIELD}.session_control.session_id", control.session_id)
            if control.action == "close":
                collected.add("dynamo", "last_turn", True)
        agent = dynamo.agent_hints
        if agent is not None:
            importance = agent.priority
            if importance is None and agent.latency_sensitivity is not None:
                importance = round(agent.latency_sensitivity)
            # Dynamo: higher is more important; vLLM (and here): lower runs first.
            collected.add("dynamo", "priority", None if importance is None else -importance)
    collected.session(DYNAMO_SESSION_HEADER, headers.get(DYNAMO_SESSION_HEADER))
    if _header_flag(headers, DYNAMO_FINAL_HEADER):
        collected.add("dynamo", "last_turn", True)
    collected.add("dynamo", "parent_session_id", headers.get(DYNAMO_PARENT_HEADER) or None)
    return collected.hints()
