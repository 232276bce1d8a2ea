"""The Responses API: POST /v1/responses (stateful, streaming), GET/DELETE /v1/responses/{id},
GET /v1/responses/{id}/input_items.

A stored response keeps the conversation it ended (previous input AND output
items, as core messages) so that `previous_response_id` replays it; the
request's `instructions` are a system message for that request only and are
never carried over. A response is stored only after it was delivered, and only
with `store: true` (the default).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse

from macaron_ray.api.body import read_json, validate
from macaron_ray.api.errors import APIError
from macaron_ray.api.surface import Surfaces, collect, first_event, new_id, now, stored, to_api_error
from macaron_ray.api.tools import check_arguments, check_choice, check_tools, named
from macaron_ray.core.conversation import FunctionCall, Message, ToolCall
from macaron_ray.core.turn_runner import Sampling, TurnEvent, TurnRequest


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class InputText(_Wire):
    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(_Wire):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]


class FunctionCallItem(_Wire):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Wire):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str


InputItem = FunctionCallItem | FunctionCallOutputItem | MessageItem


class FunctionTool(_Wire):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class CreateResponse(_Wire):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    metadata: dict[str, str] | None = None


def _tool_choice(choice: str | dict | None) -> str | dict | None:
    """The Responses shape of a tool choice in the chat shape the core takes: a named function is
    `{"type": "function", "name": ...}` here. Hosted tools and allowed-tools lists are not served."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "function" and "function" not in choice:
        return named(choice.get("name"))
    raise APIError(400, "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}; "
                        "hosted tools and allowed-tools lists are not served by this model", param="tool_choice",
                   code="invalid_value")


def _text(content: str | list[InputText]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


def input_messages(items: str | list[InputItem]) -> tuple[list[Message], list[dict]]:
    """(core messages, input items with ids as `input_items` lists them)."""
    if isinstance(items, str):
        items = [MessageItem(role="user", content=items)]
    if not items:
        raise APIError(400, "input must not be empty", param="input", code="invalid_value")
    messages: list[Message] = []
    listed: list[dict] = []
    for i, item in enumerate(items):
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append(Message(role=role, content=_text(item.content)))
            part = "output_text" if item.role == "assistant" else "input_text"
            listed.append({"id": new_id("msg_"), "type": "message", "role": item.role, "status": "completed",
                           "content": [{"type": part, "text": _text(item.content),
                                        **({"annotations": []} if part == "output_text" else {})}]})
        elif isinstance(item, FunctionCallItem):
            check_arguments(item.arguments, f"input.{i}.arguments")
            call = ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            if messages and messages[-1].role == "assistant" and messages[-1].tool_calls and not messages[-1].content:
                messages[-1] = Message(role="assistant", tool_calls=(*messages[-1].tool_calls, call))
            else:
                messages.append(Message(role="assistant", tool_calls=(call,)))
            listed.append({"id": new_id("fc_"), "type": "function_call", "call_id": item.call_id,
                           "name": item.name, "arguments": item.arguments, "status": "completed"})
        else:
            messages.append(Message(role="tool", tool_call_id=item.call_id, content=item.output))
            listed.append({"id": new_id("fco_"), "type": "function_call_output", "call_id": item.call_id,
                           "output": item.output, "status": "completed"})
    return messages, listed


class _Draft:
    """The response object under construction, in the SDK's shape."""

    def __init__(self, s: Surfaces, body: CreateResponse, tools: list[dict] | None):
        self.id = new_id("resp_")
        self.obj = {
            "id": self.id, "object": "response", "created_at": now(), "status": "in_progress", "model": s.public_model,
            "output": [], "error": None, "incomplete_details": None, "instructions": body.instructions,
            "metadata": body.metadata or {}, "parallel_tool_calls": True, "temperature": body.temperature,
            "top_p": body.top_p, "tool_choice": body.tool_choice if isinstance(body.tool_choice, (str, dict)) else "auto",
            "tools": [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description"),
                       "parameters": t["function"].get("parameters") or {}, "strict": False} for t in tools or []],
            "max_output_tokens": body.max_output_tokens, "previous_response_id": body.previous_response_id,
            "store": body.store, "text": {"format": {"type": "text"}}, "truncation": "disabled", "usage": None,
        }

    def finish(self, text_item: dict | None, calls: list[dict], final: TurnEvent) -> dict:
        self.obj["output"] = ([text_item] if text_item else []) + calls
        u = final.usage
        self.obj["usage"] = {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
                             "total_tokens": u.prompt_tokens + u.completion_tokens,
                             "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
                             "output_tokens_details": {"reasoning_tokens": 0}}
        if final.finish_reason == "length" and not final.tool_calls:
            self.obj["status"] = "incomplete"
            self.obj["incomplete_details"] = {"reason": "max_output_tokens"}
        else:
            self.obj["status"] = "completed"
            self.obj["completed_at"] = now()
        return self.obj


def _message_item(item_id: str, text: str, status: str) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status != "in_progress" else []}


def _call_items(final: TurnEvent) -> list[dict]:
    return [{"id": new_id("fc_"), "type": "function_call", "call_id": c.id, "name": c.function.name,
             "arguments": c.function.arguments, "status": "completed"} for c in final.tool_calls]


def _conversation_after(messages: tuple[Message, ...], text: str, final: TurnEvent) -> list[dict]:
    """The conversation a stored response ends, for `previous_response_id` (instructions excluded)."""
    answer = Message(role="assistant", content=text or None, tool_calls=final.tool_calls or None)
    return [m.model_dump(mode="json") for m in (*messages, answer)]


async def create_response(request: Request, s: Surfaces):
    data = await read_json(request, s.body_limit_bytes)
    body = validate(CreateResponse, data)
    tenant = s.tenant(request)
    s.check_model(body.model)
    new_messages, listed = input_messages(body.input)
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                "parameters": t.parameters or {"type": "object", "properties": {}}}}
             for t in body.tools] if body.tools else None
    check_tools(tools, "tools", "parameters")
    tool_choice = check_choice(_tool_choice(body.tool_choice), tools)
    history: list[Message] = []
    if body.previous_response_id is not None:
        prev = await stored(s.store.get_response(tenant, body.previous_response_id))
        if prev is None:
            raise APIError(404, f"Previous response with id '{body.previous_response_id}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
        history = [Message.model_validate(m) for m in prev["conversation"]]
    conversation = (*history, *new_messages)
    instructions = (Message(role="system", content=body.instructions),) if body.instructions else ()
    req = TurnRequest(tenant=tenant, messages=(*instructions, *conversation), tools=tools, tool_choice=tool_choice,
                      sampling=Sampling(max_tokens=body.max_output_tokens,
                                        temperature=body.temperature if body.temperature is not None else 0.0,
                                        top_p=body.top_p),
                      surface="responses")
    await s.check_request(req, max_tokens_param="max_output_tokens", prompt_param="input")
    draft = _Draft(s, body, tools)

    async def store(text: str, final: TurnEvent, obj: dict) -> None:
        if body.store:
            await stored(s.store.put_response(tenant, draft.id, {
                "response": obj, "input_items": listed, "conversation": _conversation_after(conversation, text, final)}))

    if not body.stream:
        text, final = await collect(s.runner, req, param="input")
        obj = draft.finish(_message_item(new_id("msg_"), text, "completed") if text or not final.tool_calls else None,
                           _call_items(final), final)
        await store(text, final, obj)
        return s.json(obj, final)
    first, events = await first_event(s.runner.run(req), param="input")
    return s.stream(req, first, _stream(draft, first, events, store))


async def _stream(draft: _Draft, first: TurnEvent | None, events: AsyncIterator[TurnEvent], store) -> AsyncIterator[str]:
    seq = 0

    def event(kind: str, **fields) -> str:
        nonlocal seq
        payload = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def open_message(msg_id: str) -> list[str]:
        return [event("response.output_item.added", output_index=0, item=_message_item(msg_id, "", "in_progress")),
                event("response.content_part.added", item_id=msg_id, output_index=0, content_index=0,
                      part={"type": "output_text", "text": "", "annotations": []})]

    yield event("response.created", response=dict(draft.obj))
    yield event("response.in_progress", response=dict(draft.obj))
    msg_id, text, index = None, [], 0
    ev = first
    try:
        while ev is not None and not ev.final:
            if msg_id is None:
                msg_id = new_id("msg_")
                yield "".join(open_message(msg_id))
            text.append(ev.text)
            yield event("response.output_text.delta", item_id=msg_id, output_index=0, content_index=0,
                        delta=ev.text, logprobs=[])
            ev = await anext(events, None)
        final = ev
        full = "".join(text)
        text_item = None
        if msg_id is not None or not final.tool_calls:
            if msg_id is None:
                msg_id = new_id("msg_")
                yield "".join(open_message(msg_id))
            status = "incomplete" if final.finish_reason == "length" else "completed"
            text_item = _message_item(msg_id, full, status)
            yield event("response.output_text.done", item_id=msg_id, output_index=0, content_index=0, text=full,
                        logprobs=[])
            yield event("response.content_part.done", item_id=msg_id, output_index=0, content_index=0,
                        part={"type": "output_text", "text": full, "annotations": []})
            yield event("response.output_item.done", output_index=0, item=text_item)
            index = 1
        calls = _call_items(final)
        for i, item in enumerate(calls, start=index):
            yield event("response.output_item.added", output_index=i, item={**item, "arguments": "", "status": "in_progress"})
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=i,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                        arguments=item["arguments"], name=item["name"])
            yield event("response.output_item.done", output_index=i, item=item)
        obj = draft.finish(text_item, calls, final)
        await anext(events, None)  # the whole answer went out: let the turn commit
        # Stored before the client hears it is complete: a GET or a `previous_response_id` sent on
        # `response.completed` finds it.
        await store(full, final, obj)
        yield event("response.incomplete" if obj["status"] == "incomplete" else "response.completed", response=obj)
    except Exception as exc:  # noqa: BLE001 - after the stream started, errors go in-band
        err = to_api_error(exc, param="input")
        code = "rate_limit_exceeded" if err.status == 429 else "invalid_prompt" if err.status < 500 else "server_error"
        draft.obj.update(status="failed", error={"code": code, "message": err.message})
        yield event("response.failed", response=draft.obj)


async def get_response(request: Request, s: Surfaces, response_id: str) -> JSONResponse:
    doc = await _stored(request, s, response_id)
    return JSONResponse(doc["response"])


async def delete_response(request: Request, s: Surfaces, response_id: str) -> JSONResponse:
    tenant = s.tenant(request)
    if not await stored(s.store.delete_response(tenant, response_id)):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def input_items(request: Request, s: Surfaces, response_id: str) -> JSONResponse:
    doc = await _stored(request, s, response_id)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, "order must be 'asc' or 'desc'", param="order", code="invalid_value")
    try:
        limit = int(request.query_params.get("limit", "20"))
    except ValueError:
        raise APIError(400, "limit must be an integer", param="limit", code="invalid_value") from None
    if not 1 <= limit <= 100:
        raise APIError(400, "limit must be between 1 and 100", param="limit", code="invalid_value")
    items = doc["input_items"] if order == "asc" else list(reversed(doc["input_items"]))
    after = request.query_params.get("after")
    if after:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else "",
                         "last_id": page[-1]["id"] if page else "", "has_more": len(items) > limit})


async def _stored(request: Request, s: Surfaces, response_id: str) -> dict:
    doc = await stored(s.store.get_response(s.tenant(request), response_id))
    if doc is None:
        raise _not_found(response_id)
    return doc


def _not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param="response_id", code="not_found")
