"""Reading a request body: size limit, UTF-8, JSON, then a lenient pydantic model.

Wire models accept unknown fields (they are logged and ignored), as vLLM's do.
Validation errors name the offending field as `param` (OpenAI style, dotted).
"""

from __future__ import annotations

import json
import logging
import math
import re

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from macaron_ray.api.errors import APIError

logger = logging.getLogger(__name__)


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: the only way a string of the body can hold one (raw UTF-8 cannot)."""


async def read_json(request: Request, limit_bytes: int) -> dict:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type and media_type != "application/json" and not media_type.endswith("+json"):
        raise APIError(415, f"Content-Type must be application/json, not {media_type[:64]!r}",
                       code="unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise APIError(413, f"request body is larger than the limit of {limit_bytes} bytes", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise APIError(413, f"request body is larger than the limit of {limit_bytes} bytes",
                           code="request_too_large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not valid UTF-8 (byte {exc.start})", code="invalid_encoding") from None
    if not text.strip():
        raise APIError(400, "request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = loads(text)
    except NonFiniteNumber as exc:
        raise APIError(400, f"request body has a non-finite number ({exc}); JSON numbers must be finite",
                       code="invalid_json") from None
    except json.JSONDecodeError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                       code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "request body is nested too deeply", code="invalid_json") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise APIError(400, f"request body has a number that is too large: {str(exc)[:80]}",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    if SURROGATE_ESCAPE.search(text) and _lone_surrogate(data):
        raise APIError(400, "request body has a string with a lone UTF-16 surrogate escape (\\ud800-\\udfff "
                            "without its pair); it is not text", code="invalid_encoding")
    return data


class NonFiniteNumber(ValueError):
    """`NaN`, `Infinity`, `-Infinity`, or a literal too large for a float (`1e999`): not JSON (RFC 8259),
    and not something a tool schema, the store or an engine can take back out."""


def loads(text: str):
    """`json.loads`, refusing non-finite numbers (`NonFiniteNumber`)."""
    return json.loads(text, parse_constant=_non_finite, parse_float=_finite_float)


def _non_finite(literal: str):
    raise NonFiniteNumber(literal)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise NonFiniteNumber(literal[:32])
    return value


def _lone_surrogate(value) -> bool:
    """Whether any string (or key) in the parsed body holds a code point of U+D800..U+DFFF (a pair
    escaped as two \\u escapes is joined by the parser into one character and is fine)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def validate(model: type[BaseModel], data: dict) -> BaseModel:
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(400, f"invalid value for '{param}': {first['msg']}" if param else first["msg"],
                       param=param, code="invalid_value") from None
    extra = sorted((parsed.model_extra or {}).keys())
    if extra:
        logger.info("ignoring unknown request fields: %s", extra)
    return parsed
