"""EngineClient over a vLLM OpenAI-compatible HTTP server (streaming chat completions)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

from macaron_ray.core.conversation import FunctionCall, ToolCall
from macaron_ray.core.engine_client import EngineDelta, EngineError, EngineRequest, Usage


def request_body(req: EngineRequest) -> dict:
    body: dict = {"model": req.adapter, "messages": req.messages, "stream": True,
                  "stream_options": {"include_usage": True}, "temperature": req.temperature}
    for name in ("tools", "tool_choice", "max_tokens", "top_p", "stop", "seed"):
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.choice is not None:
        body["structured_outputs"] = {"choice": list(req.choice)}
    return body


class OpenAIHTTPEngine:
    """One client per server; safe to share between concurrent turns (httpx pools connections)."""

    def __init__(self, base_url: str, *, timeout_s: float = 300.0, api_key: str | None = None):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers,
                                         timeout=httpx.Timeout(timeout_s, connect=10.0))

    async def aclose(self) -> None:
        await self._client.aclose()

    async def stream(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:
        calls: dict[int, dict] = {}
        finish, usage, stop_sequence = None, None, None
        try:
            async with self._client.stream("POST", "/v1/chat/completions", json=request_body(request)) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")[:500]
                    raise EngineError(f"engine answered {resp.status_code}: {detail}",
                                      retryable=resp.status_code >= 500 or resp.status_code == 429)
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("usage"):
                        u = chunk["usage"]
                        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                        usage = Usage(u.get("prompt_tokens", 0), u.get("completion_tokens", 0), cached)
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        for tc in delta.get("tool_calls") or []:
                            slot = calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
                            slot["id"] = tc.get("id") or slot["id"]
                            fn = tc.get("function") or {}
                            slot["name"] += fn.get("name") or ""
                            slot["arguments"] += fn.get("arguments") or ""
                        if delta.get("content"):
                            yield EngineDelta(text=delta["content"])
                        finish = choice.get("finish_reason") or finish
                        if isinstance(choice.get("stop_reason"), str):
                            stop_sequence = choice["stop_reason"]
        except httpx.HTTPError as exc:
            raise EngineError(f"engine unreachable: {type(exc).__name__}") from exc
        tool_calls = tuple(
            ToolCall(id=c["id"] or f"call_{i}", function=FunctionCall(name=c["name"], arguments=c["arguments"] or "{}"))
            for i, c in sorted(calls.items()))
        yield EngineDelta(tool_calls=tool_calls, finish_reason=finish or "stop", usage=usage or Usage(),
                          stop_sequence=stop_sequence if finish == "stop" else None)
