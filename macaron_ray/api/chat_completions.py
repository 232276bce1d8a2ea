"""POST /v1/chat/completions: stateless, streaming SSE, function tools."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import Request

from macaron_ray.api.body import read_json, validate
from macaron_ray.api.errors import openai_body
from macaron_ray.api.surface import Surfaces, collect, first_event, new_id, now, to_api_error
from macaron_ray.api.timing import DONE_FRAME
from macaron_ray.api.tools import check_arguments, check_choice, check_tools
from macaron_ray.core.conversation import FunctionCall, Message, ToolCall
from macaron_ray.core.turn_runner import Sampling, TurnEvent, TurnRequest


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextPart(_Wire):
    type: Literal["text"]
    text: str


class FunctionIn(_Wire):
    name: str = Field(min_length=1)
    arguments: str


class ToolCallIn(_Wire):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionIn


class ChatMessageIn(_Wire):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Wire):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict | None = None


class ToolDef(_Wire):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Wire):
    include_usage: bool = False


class ChatCompletionRequest(_Wire):
    model: str
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-2**63, le=2**63 - 1)
    """vLLM takes a 64-bit signed seed; a larger one is a 400 here, not an engine error."""
    n: int | None = Field(default=None, ge=1, le=1)

    @field_validator("messages")
    @classmethod
    def _roles_have_their_fields(cls, messages: list[ChatMessageIn]) -> list[ChatMessageIn]:
        for i, m in enumerate(messages):
            if m.role == "tool" and not m.tool_call_id:
                raise ValueError(f"messages[{i}]: a tool message needs tool_call_id")
            if m.role in ("system", "developer", "user") and m.content is None:
                raise ValueError(f"messages[{i}]: a {m.role} message needs content")
        return messages


def text_of(content: str | list | None) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return "".join(p.text for p in content)


def to_core(messages: list[ChatMessageIn]) -> tuple[Message, ...]:
    out = []
    for m in messages:
        calls = tuple(ToolCall(id=c.id, function=FunctionCall(name=c.function.name, arguments=c.function.arguments))
                      for c in m.tool_calls) if m.tool_calls else None
        out.append(Message(role="system" if m.role == "developer" else m.role, content=text_of(m.content),
                           tool_calls=calls, tool_call_id=m.tool_call_id if m.role == "tool" else None))
    return tuple(out)


def turn_request(body: ChatCompletionRequest, tenant: str) -> TurnRequest:
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    check_tools(tools, "tools", "function.parameters")
    for i, m in enumerate(body.messages):
        for j, c in enumerate(m.tool_calls or ()):
            check_arguments(c.function.arguments, f"messages.{i}.tool_calls.{j}.function.arguments")
    return TurnRequest(
        tenant=tenant, messages=to_core(body.messages), tools=tools,
        tool_choice=check_choice(body.tool_choice, tools),
        sampling=Sampling(max_tokens=body.max_completion_tokens or body.max_tokens,
                          temperature=body.temperature if body.temperature is not None else 0.0,
                          top_p=body.top_p, stop=stop, seed=body.seed),
        surface="chat")


def _usage(final: TurnEvent) -> dict:
    u = final.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _tool_calls(final: TurnEvent) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in final.tool_calls]


def _finish(final: TurnEvent) -> str:
    return "tool_calls" if final.tool_calls else (final.finish_reason if final.finish_reason in ("length",) else "stop")


async def chat_completions(request: Request, s: Surfaces):
    data = await read_json(request, s.body_limit_bytes)
    body = validate(ChatCompletionRequest, data)
    tenant = s.tenant(request)
    s.check_model(body.model)
    req = turn_request(body, tenant)
    await s.check_request(req, max_tokens_param="max_completion_tokens" if body.max_completion_tokens else "max_tokens",
                          prompt_param="messages")
    cid, created = new_id("chatcmpl-"), now()
    if not body.stream:
        text, final = await collect(s.runner, req, param="messages")
        message = {"role": "assistant", "content": text if text or not final.tool_calls else None}
        if final.tool_calls:
            message["tool_calls"] = _tool_calls(final)
        return s.json({"id": cid, "object": "chat.completion", "created": created, "model": s.public_model,
                       "choices": [{"index": 0, "message": message, "finish_reason": _finish(final),
                                    "logprobs": None}],
                       "usage": _usage(final)}, final)
    first, events = await first_event(s.runner.run(req), param="messages")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return s.stream(req, first, _stream(s, cid, created, first, events, include_usage))


async def _stream(s: Surfaces, cid: str, created: int, first: TurnEvent | None,
                  events: AsyncIterator[TurnEvent], include_usage: bool) -> AsyncIterator[str]:
    def chunk(delta: dict, finish: str | None = None, **extra) -> str:
        body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": s.public_model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    held: str | None = None  # the last content delta is held back to carry finish_reason
    ev = first
    try:
        while ev is not None:
            if ev.final:
                # The whole answer's text went out: the turn commits before the finish chunk, so a
                # next turn sent on it finds the turn (no re-derived label, no second route hop).
                await anext(events, None)
                if ev.tool_calls:
                    if held:
                        yield chunk({"content": held})
                    calls = [{"index": i, **c} for i, c in enumerate(_tool_calls(ev))]
                    yield chunk({"tool_calls": calls}, _finish(ev))
                else:
                    yield chunk({"content": held or ""}, _finish(ev))
                if include_usage:
                    body = {"id": cid, "object": "chat.completion.chunk", "created": created,
                            "model": s.public_model, "choices": [], "usage": _usage(ev)}
                    yield f"data: {json.dumps(body)}\n\n"
                break
            if held is not None:
                yield chunk({"content": held})
            held = ev.text
            ev = await anext(events, None)
    except Exception as exc:  # noqa: BLE001 - after the stream started, errors go in-band
        yield f"data: {json.dumps(openai_body(to_api_error(exc)))}\n\n"
        return
    yield DONE_FRAME
