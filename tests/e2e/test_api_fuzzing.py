"""Property-based fuzzing of the HTTP API from its own OpenAPI document
(schemathesis): every route, bodies that fit the schema and bodies that do not.
No answer is a 5xx, every error is OpenAI-shaped, the server is healthy after.

`TOOLSERVE_FUZZ_EXAMPLES` sets the examples per route and generation phase
(CI: 30; the recorded run in docs/reliability.md used more)."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from openai import OpenAI
from programs import TEST_CLIENT_AUTH
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from cluster.launch.launcher import Endpoints

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("healthy_after")]

FUZZ_EXAMPLES = int(os.environ.get("TOOLSERVE_FUZZ_EXAMPLES", "30"))
# Generation is cut short so each fuzzed turn costs the CPU engine a fraction of
# a second; the hand cases in test_bad_inputs.py send the huge values.
_GENERATION_CAPS = {"max_tokens": 8, "max_completion_tokens": 8, "min_tokens": 8, "n": 2}


ROUTES = [
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/v1/tools"),
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions/{program_id}"),
    ("DELETE", "/v1/sessions/{program_id}"),
    ("POST", "/open_session"),
    ("POST", "/close_session"),
    ("PUT", "/v1/sessions/{program_id}/tool-state/{slot}"),
    ("POST", "/cache-tool-output/{response_id}"),
    ("GET", "/health"),
]


@pytest.fixture(scope="session")
def api_schema(cluster: Endpoints) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{_root(cluster)}/openapi.json")


def _root(cluster: Endpoints) -> str:
    return cluster.api_base.removesuffix("/v1")


def _capped(body: Any) -> None:
    if not isinstance(body, dict):
        return
    limits = (body.get("max_tokens"), body.get("max_completion_tokens"))
    if all(limit is None for limit in limits):  # absent or null: up to the context length
        body["max_tokens"] = _GENERATION_CAPS["max_tokens"]
    for field, cap in _GENERATION_CAPS.items():
        value = body.get(field)
        # Pydantic takes 1e6 (a float without a fraction) for an int field too.
        if isinstance(value, int | float) and not isinstance(value, bool) and value > cap:
            body[field] = cap


def _error_problem(error: Any) -> str | None:
    if not isinstance(error, dict):
        return "no `error` object"
    if not (isinstance(error.get("message"), str) and error["message"]):
        return "no `error.message`"
    if not isinstance(error.get("type"), str):
        return "no `error.type`"
    if "code" not in error:
        return "no `error.code`"
    return None


def openai_shaped_errors(ctx: Any, response: schemathesis.Response, case: Any) -> None:
    """A 4xx body is `{"error": {"message", "type", "param", "code"}}`; an error
    inside a 200 event stream is too, and is not a server error."""
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError as error:
            raise AssertionError(
                f"{response.status_code} body is not JSON: {response.text[:200]}"
            ) from error
        problem = _error_problem(body.get("error") if isinstance(body, dict) else None)
        assert problem is None, (
            f"{response.status_code} error body has {problem}: {response.text[:300]}"
        )
        return
    if "text/event-stream" not in (response.headers.get("content-type") or [""])[0]:
        return
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line.removeprefix("data: "))
        if "error" in event:
            problem = _error_problem(event["error"])
            assert problem is None, f"stream error event has {problem}: {line[:300]}"
            code = event["error"].get("code")
            assert not (isinstance(code, int) and code >= 500), (
                f"server error in stream: {line[:300]}"
            )


def test_the_fuzzed_routes_are_every_route_of_the_api(api_schema: schemathesis.BaseSchema) -> None:
    served = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    assert served == set(ROUTES)


BODY_ROUTES = [(method, path) for method, path in ROUTES if method in ("POST", "PUT")]
FUZZ_CASES = [
    *((method, path, GenerationMode.POSITIVE, False) for method, path in ROUTES),
    # Only bodies can be made not to fit: path parameters are strings either way.
    *((method, path, GenerationMode.NEGATIVE, False) for method, path in BODY_ROUTES),
    # With a real response id or tool-state slot, the body is read, not refused
    # for the path.
    *(
        (method, path, mode, True)
        for method, path in BODY_ROUTES
        if "{" in path
        for mode in GenerationMode
    ),
]


@pytest.fixture(scope="session")
def known_path_parameters(
    client: OpenAI, model_name: str, weather_tool: dict[str, Any]
) -> dict[str, dict[str, str]]:
    """Path parameters naming things that exist: a response to a request with tools
    (the caller's own), and a slot a hosted tool keeps state in."""
    reply = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[weather_tool],  # type: ignore[list-item]
        max_tokens=8,
    )
    return {
        "/cache-tool-output/{response_id}": {"response_id": reply.id},
        "/v1/sessions/{program_id}/tool-state/{slot}": {"slot": "GorillaFileSystem"},
    }


@pytest.mark.parametrize(("method", "path", "mode", "known"), FUZZ_CASES)
def test_no_input_gets_a_server_error_or_a_non_openai_error(
    api_schema: schemathesis.BaseSchema,
    cluster: Endpoints,
    method: str,
    path: str,
    mode: GenerationMode,
    known: bool,
    known_path_parameters: dict[str, dict[str, str]],
) -> None:
    operation = api_schema[path][method]
    path_parameters = known_path_parameters[path] if known else None
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    def send(case: schemathesis.Case) -> None:
        _capped(case.body)
        response = case.call_and_validate(
            base_url=_root(cluster),
            headers=TEST_CLIENT_AUTH,
            checks=[not_a_server_error, openai_shaped_errors],
            timeout=120,
        )
        statuses[response.status_code] += 1

    send()
    print(
        f"{method} {path} {mode.value} {path_parameters}: statuses {dict(sorted(statuses.items()))}"
    )
    if (path, mode) == ("/v1/chat/completions", GenerationMode.POSITIVE):
        assert statuses[200], "no generated turn reached the engine"
