"""EngineClient over a vLLM OpenAI-compatible HTTP server (streaming chat completions)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

from macaron_ray.core.conversation import FunctionCall, ToolCall
from macaron_ray.core.engine_client import (
    EngineDelta, EngineError, EngineRequest, EngineTimeout, EngineUnavailable, Usage,
)
from macaron_ray.engine.text_tool_calls import TEXT_PARSERS, may_become_calls, pythonic_calls, whole_calls


def text_tool_calls(req: EngineRequest, tool_call_parser: str | None) -> bool:
    """Whether `req`'s calls are parsed from the engine's plain text (`engine.text_tool_calls`): the
    engine's parser is one the clients read themselves and the model chooses whether to call."""
    return tool_call_parser in TEXT_PARSERS and bool(req.tools) and req.tool_choice in (None, "auto")


def forced_call(req: EngineRequest) -> bool:
    """Whether `req` forces a call ("required", or a named function)."""
    return bool(req.tools) and req.tool_choice not in (None, "auto", "none")


def request_body(req: EngineRequest, *, priority: bool = False, text_calls: bool = False) -> dict:
    """The chat-completions body of `req`; `priority`: the engine schedules by priority, send it;
    `text_calls`: ask for plain text (tools in the prompt, no parsing: the caller parses the calls)."""
    body: dict = {"model": req.adapter, "messages": req.messages, "stream": True,
                  "stream_options": {"include_usage": True}, "temperature": req.temperature}
    for name in ("tools", "tool_choice", "max_tokens", "top_p", "stop", "seed", "repetition_penalty",
                 "frequency_penalty", "cache_salt"):
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if not req.tools:
        body.pop("tools", None)
        body.pop("tool_choice", None)
    elif text_calls:
        body["tool_choice"] = "none"
    if req.choice is not None:
        body["structured_outputs"] = {"choice": list(req.choice)}
    if req.continue_final_message:
        body.update(continue_final_message=True, add_generation_prompt=False)
    if priority and req.priority:
        body["priority"] = req.priority  # vLLM rejects a priority its scheduler does not use
    return body


class StreamAccumulator:
    """Turns OpenAI chat-completion stream chunks (dicts) into EngineDeltas.

    Shared by every EngineClient that speaks the OpenAI chunk format: over HTTP
    and over Ray Serve handles.
    """

    def __init__(self, *, text_calls: bool = False, forced: bool = False) -> None:
        """`text_calls`: the engine streams plain text and the calls are parsed from it here
        (`engine.text_tool_calls`); text that may become calls is held until the answer is whole.
        `forced`: the request forced a call (see `whole_calls`)."""
        self._forced = forced
        self._holding = text_calls
        self._held: list[str] = []
        self._calls: dict[int, dict] = {}
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._stop_sequence: str | None = None
        self._request_id: str | None = None

    def feed(self, chunk: dict) -> EngineDelta | None:
        """Absorb one chunk; return a text delta if it carried text. An error chunk (vLLM streams
        `{"error": ...}` when the engine fails mid-answer) raises, so the turn rolls back."""
        if chunk.get("error"):
            error = chunk["error"]
            code = error.get("code") if isinstance(error, dict) else None
            code = code if isinstance(code, int) else 500
            raise EngineError(f"engine failed mid-stream ({code})", retryable=code >= 500 or code == 429, status=code)
        self._request_id = chunk.get("id") or self._request_id
        if chunk.get("usage"):
            u = chunk["usage"]
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            self._usage = Usage(u.get("prompt_tokens", 0), u.get("completion_tokens", 0), cached)
        text = ""
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            for tc in delta.get("tool_calls") or []:
                slot = self._calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            text += delta.get("content") or ""
            self._finish = choice.get("finish_reason") or self._finish
            if isinstance(choice.get("stop_reason"), str):
                self._stop_sequence = choice["stop_reason"]
        if self._holding and text:
            self._held.append(text)
            text = "".join(self._held)
            if may_become_calls(text):
                return EngineDelta()  # no text yet, but the engine is answering: its deadlines see that
            self._holding, self._held = False, []
        return EngineDelta(text=text) if text else None

    def final(self) -> EngineDelta:
        """The last delta: the calls, finish reason and usage, and any text held back (the whole
        answer, when it was not a list of calls after all)."""
        tool_calls = tuple(
            ToolCall(id=c["id"] or f"call_{i}", function=FunctionCall(name=c["name"], arguments=c["arguments"] or "{}"))
            for i, c in sorted(self._calls.items()))
        finish = self._finish or "stop"
        held = "".join(self._held)
        if held and (parsed := pythonic_calls(held)) is not None:
            tool_calls, held, finish = parsed, "", "tool_calls"
        return EngineDelta(text=held, tool_calls=whole_calls(tool_calls, forced=self._forced), finish_reason=finish,
                           usage=self._usage or Usage(), stop_sequence=self._stop_sequence if finish == "stop" else None,
                           request_id=self._request_id)


class OpenAIHTTPEngine:
    """One client per server; safe to share between concurrent turns (httpx pools connections)."""

    def __init__(self, base_url: str, *, timeout_s: float = 300.0, api_key: str | None = None,
                 tool_call_parser: str | None = None):
        """`tool_call_parser`: the engine's (vLLM `--tool-call-parser`); one of `TEXT_PARSERS` is
        parsed here from plain text for "auto" turns (`engine.text_tool_calls`)."""
        self._tool_call_parser = tool_call_parser
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers,
                                         timeout=httpx.Timeout(timeout_s, connect=10.0))

    async def aclose(self) -> None:
        await self._client.aclose()

    async def stream(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:
        text_calls = text_tool_calls(request, self._tool_call_parser)
        acc = StreamAccumulator(text_calls=text_calls, forced=forced_call(request))
        try:
            async with self._client.stream("POST", "/v1/chat/completions",
                                           json=request_body(request, text_calls=text_calls)) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")[:500]
                    error = EngineUnavailable if resp.status_code == 503 else EngineError
                    raise error(f"engine answered {resp.status_code}: {detail}",
                                retryable=resp.status_code >= 500 or resp.status_code == 429, status=resp.status_code)
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    delta = acc.feed(json.loads(data))
                    if delta is not None:
                        yield delta
        except httpx.TimeoutException as exc:
            raise EngineTimeout(f"engine timed out: {type(exc).__name__}") from exc
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            raise EngineUnavailable(f"engine unreachable: {type(exc).__name__}") from exc
        except httpx.HTTPError as exc:
            raise EngineError(f"engine request failed: {type(exc).__name__}") from exc
        yield acc.final()
