"""Drive multi-turn conversations through the official SDKs and time every request.

Each worker plays whole conversations from the traces, turn after turn, with a
think time between turns: the conversation's state lives where each surface
keeps it (Chat Completions and Messages: the client resends the history;
Responses: `previous_response_id`). A tool-call answer is followed by the
trace's tool result. At the disconnect rate a stream is closed after its first
delta, as a user who navigates away; the turn is then dropped from the history
(the server rolled it back) and the conversation goes on.

Timing per request: the client's own TTFT and total, and the ingress's hops
from `Server-Timing` (the header, and the `: server-timing` comment that ends a
stream, which the SDKs skip): a transport under the SDK's httpx client reads
both without touching what the SDK parses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import cache
from urllib.parse import urlsplit

import httpx

from macaron_ray.core.registry import DEFAULT_PUBLIC_MODEL
from macaron_ray.loadtest.leaks import LeakScan
from macaron_ray.loadtest.report import RequestRecord
from macaron_ray.loadtest.timing import SSE_PREFIX, parse_server_timing
from macaron_ray.loadtest.traces import Conversation, Traces

SURFACES = ("chat", "responses", "messages")
REQUEST_ID_HEADER = "x-macaron-loadtest-request"


class NotLoopback(ValueError):
    """The target is not on this machine and remote targets were not allowed."""


def require_loopback(url: str, allow_remote: bool = False) -> None:
    host = urlsplit(url).hostname or ""
    if allow_remote:
        return
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise NotLoopback(f"{url} is not a loopback address; pass --allow-remote to load a remote deployment")


@dataclass(frozen=True)
class LoadConfig:
    url: str
    api_key: str = "loadtest"
    surface: str = "chat"
    model: str = DEFAULT_PUBLIC_MODEL
    conversations: int = 6
    """Conversations to play in all (the traces are cycled)."""
    max_requests: int = 200
    """Requests in all, tool results included: the run stops sending at this count."""
    duration_s: float = 300.0
    """The run stops starting turns after this long; turns in flight finish."""
    think_time_s: float = 0.0
    disconnect_rate: float = 0.0
    max_tokens: int = 64
    seed: int = 0
    request_timeout_s: float = 300.0
    allow_remote: bool = False
    """Allow a target that is not a loopback address."""
    private: tuple[str, ...] = ()
    """Strings no response may contain (adapter ids, the base's path), besides `LEAK_MARKERS`."""

    def __post_init__(self):
        if self.surface not in SURFACES:
            raise ValueError(f"surface must be one of {SURFACES}")
        if not 0.0 <= self.disconnect_rate <= 1.0:
            raise ValueError("disconnect_rate must be within 0..1")


def timing_transport(http=httpx, leaks: LeakScan | None = None):
    """A transport for `http` (the httpx module an SDK uses: httpx for openai, httpx2 for anthropic)
    that records each tagged request's `Server-Timing` header and stream comment in `.seen[tag]`,
    and scans every response's headers and bytes with `leaks`."""
    return _transport_class(http)(leaks=leaks)


@cache
def _transport_class(http):
    class TimedStream(http.AsyncByteStream):
        def __init__(self, inner, into: dict[str, float], leaks: LeakScan | None):
            self.inner, self.into, self.tail = inner, into, b""
            self.leaks = leaks.stream() if leaks is not None else None

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self.inner:
                if self.leaks is not None:
                    self.leaks.feed_bytes(chunk)
                self.tail = (self.tail + chunk)[-4096:]
                *lines, self.tail = self.tail.split(b"\n")
                for line in lines:
                    if line.startswith(SSE_PREFIX.encode()):
                        self.into.update(parse_server_timing(line[len(SSE_PREFIX):].decode()))
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class TimingTransport(http.AsyncBaseTransport):
        def __init__(self, inner=None, leaks: LeakScan | None = None):
            self.inner = inner or http.AsyncHTTPTransport()
            self.seen: dict[str, dict[str, float]] = {}
            self.leaks = leaks

        async def handle_async_request(self, request):
            response = await self.inner.handle_async_request(request)
            if self.leaks is not None:
                self.leaks.scan("\n".join(f"{k}: {v}" for k, v in response.headers.items()))
            tag = request.headers.get(REQUEST_ID_HEADER)
            timing = parse_server_timing(response.headers.get("server-timing"))
            if tag is not None:
                self.seen[tag] = timing
            return http.Response(response.status_code, headers=response.headers, extensions=response.extensions,
                                 request=request, stream=TimedStream(response.stream, timing, self.leaks))

        async def aclose(self) -> None:
            await self.inner.aclose()

    return TimingTransport


class Budget:
    """Shared stop conditions of one run: a request count and a deadline."""

    def __init__(self, max_requests: int, duration_s: float):
        self.left, self.deadline = max_requests, time.monotonic() + duration_s

    def take(self) -> bool:
        if self.left <= 0 or time.monotonic() >= self.deadline:
            return False
        self.left -= 1
        return True


class _Surface:
    """One conversation's client-side state on one API surface."""

    def __init__(self, cfg: LoadConfig, traces: Traces, http, instructions: str):
        self.cfg, self.traces, self.instructions = cfg, traces, instructions
        import anthropic
        import openai

        if cfg.surface == "messages":
            self.client = anthropic.AsyncAnthropic(base_url=cfg.url, api_key=cfg.api_key, http_client=http,
                                                   max_retries=0, timeout=cfg.request_timeout_s)
        else:
            self.client = openai.AsyncOpenAI(base_url=cfg.url.rstrip("/") + "/v1", api_key=cfg.api_key,
                                             http_client=http, max_retries=0, timeout=cfg.request_timeout_s)
        self.history: list = []
        self.previous_id: str | None = None

    async def send(self, user: str | None, tool_results: list[tuple[str, str]], tools: bool, tag: str,
                   on_delta) -> list[tuple[str, str, str]] | None:
        """Stream one request: a user message, or tool results (call id, output). Returns the answer's
        tool calls (id, name, arguments), or None when `on_delta` said to close the stream."""
        return await getattr(self, "_" + self.cfg.surface)(user, tool_results, tools, tag, on_delta)

    async def _chat(self, user, tool_results, tools, tag, on_delta):
        turn = [{"role": "user", "content": user}] if user is not None else [
            {"role": "tool", "tool_call_id": cid, "content": out} for cid, out in tool_results]
        messages = [{"role": "system", "content": self.instructions}, *self.history, *turn]
        kw = {"tools": list(self.traces.tools)} if tools else {}
        stream = await self.client.chat.completions.create(
            model=self.cfg.model, messages=messages, stream=True, max_tokens=self.cfg.max_tokens,
            temperature=0.0, extra_headers={REQUEST_ID_HEADER: tag}, **kw)
        text, calls = [], {}
        async with stream:
            async for chunk in stream:
                for choice in chunk.choices:
                    if (choice.delta.content or choice.delta.tool_calls) and not await on_delta():
                        return None
                    if choice.delta.content:
                        text.append(choice.delta.content)
                    for c in choice.delta.tool_calls or ():
                        entry = calls.setdefault(c.index, {"id": c.id, "name": "", "arguments": ""})
                        entry["id"] = c.id or entry["id"]
                        entry["name"] += (c.function.name or "") if c.function else ""
                        entry["arguments"] += (c.function.arguments or "") if c.function else ""
        answer = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            answer["tool_calls"] = [{"id": c["id"], "type": "function",
                                     "function": {"name": c["name"], "arguments": c["arguments"]}}
                                    for c in calls.values()]
        self.history += [*turn, answer]
        return [(c["id"], c["name"], c["arguments"]) for c in calls.values()]

    async def _responses(self, user, tool_results, tools, tag, on_delta):
        items = user if user is not None else [
            {"type": "function_call_output", "call_id": cid, "output": out} for cid, out in tool_results]
        kw = {"tools": [{"type": "function", **t["function"]} for t in self.traces.tools]} if tools else {}
        if self.previous_id:
            kw["previous_response_id"] = self.previous_id
        stream = await self.client.responses.create(
            model=self.cfg.model, input=items, instructions=self.instructions, stream=True,
            max_output_tokens=max(16, self.cfg.max_tokens), temperature=0.0, extra_headers={REQUEST_ID_HEADER: tag},
            **kw)
        calls, final_id = [], None
        async with stream:
            async for event in stream:
                first_token = (event.type in ("response.output_text.delta", "response.function_call_arguments.delta")
                               or (event.type == "response.output_item.done" and event.item.type == "function_call"))
                if first_token and not await on_delta():
                    return None
                if event.type == "response.output_item.done" and event.item.type == "function_call":
                    calls.append((event.item.call_id, event.item.name, event.item.arguments))
                elif event.type in ("response.completed", "response.incomplete"):
                    final_id = event.response.id
        self.previous_id = final_id or self.previous_id
        return calls

    async def _messages(self, user, tool_results, tools, tag, on_delta):
        turn = {"role": "user", "content": user} if user is not None else {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": cid, "content": out} for cid, out in tool_results]}
        kw = {"tools": [{"name": t["function"]["name"], "description": t["function"]["description"],
                         "input_schema": t["function"]["parameters"]} for t in self.traces.tools]} if tools else {}
        blocks: list[dict] = []
        async with self.client.messages.stream(
                model=self.cfg.model, system=self.instructions, messages=[*self.history, turn],
                max_tokens=self.cfg.max_tokens, extra_body={"temperature": 0.0},  # not a parameter of SDK 2.x
                extra_headers={REQUEST_ID_HEADER: tag}, **kw) as stream:
            async for event in stream:
                first_token = (event.type in ("text", "input_json")
                               or (event.type == "content_block_start" and event.content_block.type == "tool_use"))
                if first_token and not await on_delta():
                    return None
            final = await stream.get_final_message()
        calls = []
        for block in final.content:
            if block.type == "text":
                blocks.append({"type": "text", "text": block.text})
            elif block.type == "tool_use":
                blocks.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
                calls.append((block.id, block.name, json.dumps(block.input)))
        self.history += [turn, {"role": "assistant", "content": blocks or [{"type": "text", "text": ""}]}]
        return calls


def _sdk_httpx(surface: str):
    """The httpx module the surface's SDK is built on (anthropic's rejects the other)."""
    if surface == "messages":
        import httpx2

        return httpx2
    return httpx


async def _request(state: _Surface, transport, record: RequestRecord, t0: float,
                   user: str | None, tool_results, tools: bool, disconnect: bool):
    tag = uuid.uuid4().hex
    started = time.perf_counter()
    record.started_s = started - t0
    first = None

    async def on_delta() -> bool:
        nonlocal first
        if first is None:
            first = time.perf_counter()
            record.client_ttft_s = first - started
        return not disconnect

    try:
        calls = await state.send(user, tool_results, tools, tag, on_delta)
    except Exception as exc:  # noqa: BLE001 - every failure is a record, the run goes on
        record.status = getattr(exc, "status_code", None)
        record.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        return None
    finally:
        record.server = transport.seen.pop(tag, {})
    if calls is None:
        record.disconnected = True
        return None
    record.client_total_s = time.perf_counter() - started
    record.ok, record.tool_call = True, bool(calls)
    return calls


async def play(cfg: LoadConfig, traces: Traces, conversation: Conversation, index: int, concurrency: int,
               budget: Budget, records: list[RequestRecord], rng: random.Random, t0: float, progress=None,
               leaks: LeakScan | None = None) -> None:
    module = _sdk_httpx(cfg.surface)
    transport = timing_transport(module, leaks)
    async with module.AsyncClient(transport=transport, timeout=cfg.request_timeout_s) as http:
        ref = uuid.uuid4().hex[:8]
        state = _Surface(cfg, traces, http, f"Load test {cfg.seed}: {conversation.name}.")
        for n, turn in enumerate(conversation.turns):
            if n and cfg.think_time_s:
                await asyncio.sleep(cfg.think_time_s)
            if not budget.take():
                return
            record = RequestRecord(conversation=f"{conversation.name}#{index}", turn=n, kind="user",
                                   surface=cfg.surface, concurrency=concurrency, started_s=0.0, expect=turn.expect)
            records.append(record)
            # A conversation is keyed by its messages, not its instructions: a reference in the first
            # message makes each one played its own, as each of a real service's users is.
            user = f"{turn.user} (ref {ref})" if n == 0 else turn.user
            calls = await _request(state, transport, record, t0, user, [], turn.tools,
                                   rng.random() < cfg.disconnect_rate)
            if progress is not None:
                progress.update(1)
            if calls and turn.tool_result is not None and budget.take():
                follow = RequestRecord(conversation=record.conversation, turn=n, kind="tool_result",
                                       surface=cfg.surface, concurrency=concurrency, started_s=0.0,
                                       expect=turn.expect)
                records.append(follow)
                await _request(state, transport, follow, t0, None, [(cid, turn.tool_result) for cid, _, _ in calls],
                               turn.tools, False)
                if progress is not None:
                    progress.update(1)


async def run_level(cfg: LoadConfig, traces: Traces, concurrency: int, progress=None,
                    leaks: LeakScan | None = None) -> tuple[list[RequestRecord], float]:
    """Play `cfg.conversations` conversations, `concurrency` at a time, within the budget; `leaks`
    scans everything received."""
    require_loopback(cfg.url, allow_remote=cfg.allow_remote)
    budget = Budget(cfg.max_requests, cfg.duration_s)
    records: list[RequestRecord] = []
    rng = random.Random(cfg.seed)
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(cfg.conversations):
        queue.put_nowait((i, traces.conversations[i % len(traces.conversations)]))
    t0 = time.perf_counter()

    async def worker() -> None:
        while not queue.empty():
            i, conversation = queue.get_nowait()
            await play(cfg, traces, conversation, i, concurrency, budget, records, rng, t0, progress, leaks)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records, time.perf_counter() - t0
