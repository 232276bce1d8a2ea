"""Errors in each surface's own envelope.

OpenAI surfaces: `{"error": {"message", "type", "param", "code"}}`.
Anthropic Messages: `{"type": "error", "error": {"type", "message"}}`.
Messages never carry a stack trace or a private name (adapter ids, paths).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from macaron_ray.observability.metrics import REJECT_REASONS


@dataclass
class APIError(Exception):
    status: int
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "invalid_request_error", 405: "invalid_request_error", 408: "invalid_request_error",
                 409: "invalid_request_error",
                 413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
                 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
                    413: "request_too_large",
                    415: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def openai_body(err: APIError) -> dict:
    return {"error": {"message": err.message, "type": _OPENAI_TYPES.get(err.status, "server_error"),
                      "param": err.param, "code": err.code}}


def anthropic_body(err: APIError) -> dict:
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(err.status, "api_error"), "message": err.message}}


def surface_of(path: str) -> str:
    """The `surface` label of a request path."""
    if path == "/v1/chat/completions":
        return "chat"
    if path == "/v1/responses" or path.startswith("/v1/responses/"):
        return "responses"
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "messages"
    return "other"


def count_rejection(metrics, path: str, err: APIError) -> None:
    """Count `err`, answered on `path`, when it is a refusal (a 4xx, or 503 overloaded)."""
    if 400 <= err.status < 500 or err.code == "overloaded":
        metrics.rejections.inc(surface=surface_of(path), reason=REJECT_REASONS.get(err.code or "", "invalid_request"))


def error_response(path: str, err: APIError):
    """`err` as a response in the envelope of the surface `path` belongs to."""
    from starlette.responses import JSONResponse

    body = anthropic_body(err) if path.startswith("/v1/messages") else openai_body(err)
    return JSONResponse(body, status_code=err.status, headers=err.headers or None)


def internal_error() -> APIError:
    return APIError(500, "The server had an error while processing the request.", code="internal_error")


def engine_unavailable() -> APIError:
    return APIError(503, "The model is temporarily unavailable; retry the request.", code="engine_unavailable",
                    headers={"Retry-After": "1"})


def store_unavailable() -> APIError:
    return APIError(503, "Conversation state is temporarily unavailable; retry the request.",
                    code="store_unavailable", headers={"Retry-After": "1"})
