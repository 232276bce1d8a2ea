"""Anthropic Messages: POST /v1/messages (streaming events, tool_use / tool_result) and
POST /v1/messages/count_tokens."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse

from macaron_ray.api.body import read_json, validate
from macaron_ray.api.errors import APIError, anthropic_body
from macaron_ray.api.surface import Surfaces, collect, first_event, new_id, to_api_error
from macaron_ray.api.tools import check_choice, check_tools, named
from macaron_ray.core.conversation import FunctionCall, Message, ToolCall
from macaron_ray.core.turn_runner import Sampling, TurnEvent, TurnRequest


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(_Wire):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Wire):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict


class ToolResultBlock(_Wire):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool | None = None


Block = TextBlock | ToolUseBlock | ToolResultBlock


class MessageIn(_Wire):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolIn(_Wire):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    input_schema: dict


class CountTokensRequest(_Wire):
    model: str
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolIn] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stream: bool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tool_choice: dict | None = None


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content)


def to_core(body: CountTokensRequest) -> tuple[Message, ...]:
    out: list[Message] = []
    if body.system:
        out.append(Message(role="system", content=_text(body.system)))
    for i, m in enumerate(body.messages):
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        if m.role == "assistant":
            if any(isinstance(b, ToolResultBlock) for b in blocks):
                raise APIError(400, f"messages.{i}: tool_result blocks belong in a user message", param=f"messages.{i}")
            text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
            calls = tuple(ToolCall(id=b.id, function=FunctionCall(name=b.name, arguments=json.dumps(b.input)))
                          for b in blocks if isinstance(b, ToolUseBlock))
            out.append(Message(role="assistant", content=text or None, tool_calls=calls or None))
            continue
        if any(isinstance(b, ToolUseBlock) for b in blocks):
            raise APIError(400, f"messages.{i}: tool_use blocks belong in an assistant message", param=f"messages.{i}")
        for b in blocks:
            if isinstance(b, ToolResultBlock):
                content = _text(b.content)
                out.append(Message(role="tool", tool_call_id=b.tool_use_id,
                                   content=f"Error: {content}" if b.is_error else content))
        text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
        if text or not any(isinstance(b, ToolResultBlock) for b in blocks):
            out.append(Message(role="user", content=text))
    return tuple(out)


def _tools(body: CountTokensRequest) -> list[dict] | None:
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.input_schema}} for t in body.tools] if body.tools else None
    check_tools(tools, "tools", "input_schema")
    return tools


def _tool_choice(choice: dict | None) -> str | dict | None:
    if not choice:
        return None
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        return named(choice.get("name"))
    raise APIError(400, "tool_choice.type must be one of auto, any, tool, none", param="tool_choice")


def _check_headers(request: Request) -> None:
    if not request.headers.get("anthropic-version"):
        raise APIError(400, "anthropic-version header is required", code="missing_header")


def _stop(final: TurnEvent) -> tuple[str, str | None]:
    if final.tool_calls:
        return "tool_use", None
    if final.finish_reason == "length":
        return "max_tokens", None
    if final.stop_sequence:
        return "stop_sequence", final.stop_sequence
    return "end_turn", None


def _usage(final: TurnEvent) -> dict:
    u = final.usage
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0}


async def count_tokens(request: Request, s: Surfaces) -> JSONResponse:
    """Tokenized on a worker thread: a long body must not stall the replica's streams. The gate
    limits it as it limits a turn, and it takes as many messages as a turn."""
    _check_headers(request)
    body = validate(CountTokensRequest, await read_json(request, s.body_limit_bytes))
    s.tenant(request)
    s.check_model(body.model)
    messages, tools = to_core(body), _tools(body)
    s.check_message_count(len(messages), "messages")
    count = await asyncio.to_thread(s.tokens.count, [m.to_openai() for m in messages], tools)
    return JSONResponse({"input_tokens": count})


async def create_message(request: Request, s: Surfaces):
    _check_headers(request)
    body = validate(MessagesRequest, await read_json(request, s.body_limit_bytes))
    tenant = s.tenant(request)
    s.check_model(body.model)
    tools = _tools(body)
    req = TurnRequest(tenant=tenant, messages=to_core(body), tools=tools,
                      tool_choice=check_choice(_tool_choice(body.tool_choice), tools),
                      sampling=Sampling(max_tokens=body.max_tokens, stop=body.stop_sequences,
                                        temperature=body.temperature if body.temperature is not None else 0.0,
                                        top_p=body.top_p),
                      surface="messages")
    await s.check_request(req, max_tokens_param="max_tokens", prompt_param="messages")
    mid = new_id("msg_")
    if not body.stream:
        text, final = await collect(s.runner, req, param="messages")
        stop_reason, stop_sequence = _stop(final)
        content = ([{"type": "text", "text": text}] if text else []) + [
            {"type": "tool_use", "id": c.id, "name": c.function.name, "input": _input(c.function.arguments)}
            for c in final.tool_calls]
        return s.json({"id": mid, "type": "message", "role": "assistant", "model": s.public_model,
                       "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                       "usage": _usage(final)}, final)
    first, events = await first_event(s.runner.run(req), param="messages")
    return s.stream(req, first, _stream(s, mid, body, first, events))


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


async def _stream(s: Surfaces, mid: str, body: MessagesRequest, first: TurnEvent | None,
                  events: AsyncIterator[TurnEvent]) -> AsyncIterator[str]:
    def event(kind: str, **fields) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"

    yield event("message_start", message={
        "id": mid, "type": "message", "role": "assistant", "model": s.public_model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                  "cache_creation_input_tokens": 0}})
    ev, index, text_open, text = first, 0, False, []
    try:
        while ev is not None and not ev.final:
            if not text_open:
                yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
                text_open = True
            text.append(ev.text)
            yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": ev.text})
            ev = await anext(events, None)
        final = ev
        if text_open:
            yield event("content_block_stop", index=index)
            index += 1
        for c in final.tool_calls:
            yield event("content_block_start", index=index,
                        content_block={"type": "tool_use", "id": c.id, "name": c.function.name, "input": {}})
            yield event("content_block_delta", index=index,
                        delta={"type": "input_json_delta", "partial_json": json.dumps(_input(c.function.arguments))})
            yield event("content_block_stop", index=index)
            index += 1
        # The whole answer went out: the turn commits before the client hears the message is complete,
        # so a next turn sent on message_stop finds it (no re-derived label, no second route hop).
        await anext(events, None)
        stop_reason, stop_sequence = _stop(final)
        yield event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    usage={"output_tokens": final.usage.completion_tokens})
        yield event("message_stop")
    except Exception as exc:  # noqa: BLE001 - after the stream started, errors go in-band
        yield event("error", error=anthropic_body(to_api_error(exc))["error"])
