"""OpenAI-style API errors: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

_CONTEXT_OVERFLOW_MARKER = "maximum context length"


@dataclass(frozen=True)
class ApiError:
    """An error the API answers with instead of a result (plain data: it crosses Ray)."""

    status: int
    message: str
    code: str
    param: str | None = None
    retry_after_s: float | None = None
    """For a 429 or 503: when a retry may pass (the `Retry-After` header)."""

    @property
    def type(self) -> str:
        if self.status >= 500:
            return "service_unavailable_error" if self.status == 503 else "server_error"
        if self.status == HTTPStatus.TOO_MANY_REQUESTS:
            return "requests"
        return "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    @classmethod
    def from_status(cls, status: int, message: str, param: str | None = None) -> ApiError:
        """Wrap an error reported by vLLM as (HTTP status, message)."""
        if _CONTEXT_OVERFLOW_MARKER in message:
            code = "context_length_exceeded"
        elif status == HTTPStatus.NOT_FOUND:
            code = "not_found"
        else:
            code = HTTPStatus(status).phrase.lower().replace(" ", "_")
        return cls(status=status, message=message, code=code, param=param)


class RequestRejected(Exception):
    """Raised by request parsing: answer with `error` (a 4xx)."""

    def __init__(self, error: ApiError):
        super().__init__(error.message)
        self.error = error


def retry_after_header(retry_after_s: float) -> str:
    """`Retry-After` in whole seconds, never 0 for a wait that is not."""
    return str(max(1, math.ceil(retry_after_s)))


def rate_limited(message: str, retry_after_s: float) -> ApiError:
    return ApiError(
        HTTPStatus.TOO_MANY_REQUESTS, message, "rate_limit_exceeded", None, retry_after_s
    )


def invalid_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(HTTPStatus.BAD_REQUEST, message, "invalid_request", param)


def model_not_found(model: str, available: list[str]) -> ApiError:
    return ApiError(
        HTTPStatus.NOT_FOUND,
        f"The model `{model}` does not exist. Available models: {', '.join(available)}.",
        "model_not_found",
        "model",
    )


def engine_not_ready(detail: str) -> ApiError:
    return ApiError(HTTPStatus.SERVICE_UNAVAILABLE, detail, "engine_not_ready")
