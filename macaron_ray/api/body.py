"""Reading a request body: size limit, UTF-8, JSON, then a lenient pydantic model.

Wire models accept unknown fields (they are logged and ignored), as vLLM's do.
Validation errors name the offending field as `param` (OpenAI style, dotted).
"""

from __future__ import annotations

import json
import logging

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from macaron_ray.api.errors import APIError

logger = logging.getLogger(__name__)


async def read_json(request: Request, limit_bytes: int) -> dict:
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
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    return data


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
