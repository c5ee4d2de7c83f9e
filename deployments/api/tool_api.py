"""Request-side pieces of the tool and session API: a turn's `toolserve`
options, the body of `POST /cache-tool-output/{response_id}`, that of
`PUT /v1/sessions/{program_id}/tool-state/{slot}` and that of `POST /v1/sessions`."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deployments.api.request_limits import decode_json
from deployments.errors import ApiError, RequestRejected, invalid_request

TURN_OPTIONS_FIELD = "toolserve"


class TurnOptions(BaseModel):
    """The `toolserve` object a chat request may carry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    execute_tools: bool = Field(
        default=True,
        description="Let the server run calls of hosted tools (and use results the "
        "client posted) and continue the turn; false: every call goes to the client.",
    )
    stop_invalid_calls: bool | None = Field(
        default=None,
        description="Stop decoding a call of a hosted or undeclared tool as soon as it "
        "can no longer be valid and let the model write it again; unset: the "
        "deployment's `tools.continuation.stop_invalid_calls`.",
    )
    stream_client_calls: bool | None = Field(
        default=None,
        description="Stream a call of a tool the client runs as the model writes it "
        "(the round then goes to the client; a result the client posts for it is not "
        "waited for); false: hold a streamed round's calls to its end; unset: the "
        "deployment's `tools.continuation.stream_client_calls`.",
    )
    retain_for_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Keep the program's KV this many seconds after the turn (up to the "
        "pinning's max_ttl_s): the client knows its tool's time.",
    )
    expected_tool_s: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="How long the tool this turn calls will take: the TTL cost model "
        "prices the pin with it instead of the durations it observed.",
    )
    last_turn: bool = Field(
        default=False, description="The program's last turn: nothing is kept after it."
    )
    parent_session_id: str | None = Field(
        default=None,
        min_length=1,
        description="The program this one was forked from (a sub-agent's parent): its "
        "turns go to the parent's replica and queue in the parent's place.",
    )


def pop_turn_options(body: dict[str, Any]) -> TurnOptions:
    """Removes and validates the request's `toolserve` options (vLLM never sees them)."""
    raw = body.pop(TURN_OPTIONS_FIELD, None)
    if raw is None:
        return TurnOptions()
    try:
        return TurnOptions.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or TURN_OPTIONS_FIELD}: {item['msg']}"
            for item in error.errors()[:5]
        )
        raise RequestRejected(
            invalid_request(f"Invalid {TURN_OPTIONS_FIELD} options: {problems}", TURN_OPTIONS_FIELD)
        ) from error


class PostedToolOutput(BaseModel):
    """One entry of a `/cache-tool-output` body: the output of a call the client ran."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="The tool's name, as the model calls it.")
    params: dict[str, Any] | None = Field(
        default=None, description="The call's arguments; none for a tool without any."
    )
    output: Any = Field(description="The tool's output: text, or JSON sent as its text.")
    keep_alive: float | None = Field(
        default=None, gt=0, description="Seconds the output stays cached; none: the default."
    )

    def output_text(self) -> str:
        return self.output if isinstance(self.output, str) else json.dumps(self.output)


def unprocessable(message: str) -> ApiError:
    return ApiError(422, message, "unprocessable_entity")


def _json_body(raw: bytes) -> Any:
    try:
        return decode_json(raw)
    except ValueError as error:
        raise RequestRejected(unprocessable(f"Request body is not valid JSON: {error}")) from error


def parse_tool_state(raw: bytes, slot: str, known_slots: list[str]) -> dict[str, Any]:
    """A stateful tool slot's scenario: a JSON object (what BFCL calls a class's
    `initial_config`), for a slot some hosted tool keeps its state in."""
    if slot not in known_slots:
        known = ", ".join(known_slots) or "none"
        raise RequestRejected(
            ApiError(
                404,
                f"No hosted tool keeps state in slot {slot!r}; slots: {known}",
                "not_found",
                "slot",
            )
        )
    scenario = _json_body(raw)
    if not isinstance(scenario, dict):
        raise RequestRejected(unprocessable("Request body must be a JSON object (the scenario)"))
    return scenario


def parse_tool_outputs(raw: bytes) -> list[PostedToolOutput]:
    """A `/cache-tool-output` body: a JSON array of `{name, params?, output, keep_alive?}`."""
    body = _json_body(raw)
    if not isinstance(body, list):
        raise RequestRejected(
            unprocessable(
                "Request body must be a JSON array of {name, params?, output, keep_alive?}"
            )
        )
    outputs = []
    for index, entry in enumerate(body):
        try:
            outputs.append(PostedToolOutput.model_validate(entry))
        except ValidationError as error:
            item = error.errors()[0]
            location = ".".join(str(part) for part in item["loc"])
            where = f"[{index}].{location}" if location else f"[{index}]"
            raise RequestRejected(unprocessable(f"Invalid entry {where}: {item['msg']}")) from error
    return outputs


class SessionOpening(BaseModel):
    """The body of `POST /v1/sessions`: open a session, or fork one from a parent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str | None = Field(
        default=None, min_length=1, description="The session's id; none: the server names one."
    )
    parent_id: str | None = Field(
        default=None,
        min_length=1,
        description="Fork from this session (a sub-agent of its program): the child's "
        "turns go to the parent's replica, share its cached prefix and queue in its "
        "place; under memory pressure the child's pin goes before the parent's.",
    )


def parse_session_opening(raw: bytes) -> SessionOpening:
    """A `POST /v1/sessions` body; an empty body opens a session the server names."""
    if not raw.strip():
        return SessionOpening()
    body = _json_body(raw)
    try:
        return SessionOpening.model_validate(body)
    except ValidationError as error:
        item = error.errors()[0]
        location = ".".join(str(part) for part in item["loc"]) or "body"
        raise RequestRejected(unprocessable(f"Invalid {location}: {item['msg']}")) from error
