"""A deterministic EngineClient for tests: scripted routing, scripted answers, a toy prefix cache.

- Route requests (those with `choice`) are answered by `router(user_text)` (the new
  message, without the context block), by default a keyword rule; it may return a
  non-label to exercise the fallback.
- Summary requests (the summary scaffold as system prompt) get `summarizer(user text)`,
  by default "Summary: <user text>".
- Answers echo the adapter and the last user text in word-sized chunks; when tools
  are offered and the user text contains "tool:<name>", the answer is one call
  to that tool.
- `fail` lets a test make a chosen request fail, before or during streaming; `stall`
  makes it hang there for a while instead.
- Usage counts whitespace tokens; cached tokens are the longest common prefix
  with an earlier prompt of the same adapter and cache salt, as an engine's prefix cache would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from macaron_ray import prompts
from macaron_ray.core import route_hop
from macaron_ray.core.conversation import FunctionCall, ToolCall
from macaron_ray.core.engine_client import EngineDelta, EngineError, EngineRequest, Usage

KEYWORDS = {"L1": ("book", "remind", "schedule", "send"), "L2": ("code", "python", "bug", "sql"),
            "L3": ("chart", "form", "widget", "card")}


def keyword_router(text: str) -> str:
    low = text.lower()
    for label, words in KEYWORDS.items():
        if any(w in low for w in words):
            return label
    return "L0"


@dataclass
class Failure:
    when: Callable[[EngineRequest], bool]
    after_chunks: int = 0
    """Raise after this many chunks were yielded (0: before the first)."""
    times: int = 1
    error: type[EngineError] = EngineError
    """What to raise: EngineError, or a subclass saying why (EngineUnavailable, EngineTimeout)."""
    stall_s: float = 0.0
    """Instead of raising, stall this long there (an engine that hangs without dying), then go on."""


class WhitespaceTokenCounter:
    """A TokenCounter for tests: whitespace-separated pieces of the rendered JSON."""

    def count(self, messages: list[dict], tools: list[dict] | None) -> int:
        return len(json.dumps([messages, tools]).split())


@dataclass
class FakeEngine:
    router: Callable[[str], str] = keyword_router
    summarizer: Callable[[str], str] = lambda asked: f"Summary: {asked}"
    """The summary of a turn, from its user message."""
    tag: Callable[[str], str] = lambda adapter: adapter
    """How an answer names the adapter that made it (tests of private names map it to a label)."""
    chunk_delay_s: float = 0.0
    requests: list[EngineRequest] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    _seen: dict[tuple[str, str | None], list[list[str]]] = field(default_factory=dict)

    def fail(self, when: Callable[[EngineRequest], bool], *, after_chunks: int = 0, times: int = 1,
             error: type[EngineError] = EngineError) -> None:
        self.failures.append(Failure(when, after_chunks, times, error))

    def stall(self, when: Callable[[EngineRequest], bool], seconds: float, *, after_chunks: int = 0,
              times: int = 1) -> None:
        self.failures.append(Failure(when, after_chunks, times, stall_s=seconds))

    @staticmethod
    def kind(req: EngineRequest) -> str:
        if req.choice is not None:
            return "route"
        if req.messages and req.messages[0].get("content") == prompts.load("summary"):
            return "summary"
        return "answer"

    def _failure(self, req: EngineRequest) -> Failure | None:
        for f in self.failures:
            if f.times > 0 and f.when(req):
                f.times -= 1
                return f
        return None

    def _usage(self, req: EngineRequest, completion: list[str]) -> Usage:
        prompt = " ".join(json.dumps(m, sort_keys=True) for m in req.messages).split()
        best = 0
        cache = (req.adapter, req.cache_salt)  # a salt partitions the cache, as vLLM's does
        for earlier in self._seen.get(cache, []):
            n = 0
            for a, b in zip(earlier, prompt):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._seen.setdefault(cache, []).append(prompt)
        return Usage(prompt_tokens=len(prompt), completion_tokens=len(completion), cached_tokens=best)

    def _answer(self, req: EngineRequest) -> tuple[list[str], tuple[ToolCall, ...]]:
        kind = self.kind(req)
        user = next((m.get("content") or "" for m in reversed(req.messages) if m["role"] == "user"), "")
        if kind == "route":
            label = self.router(user.rsplit(route_hop.NEW_MESSAGE, 1)[-1])  # the context block is not routed on
            if req.continue_final_message:  # the reply was begun in the prompt: continue it
                label = label.removeprefix(req.messages[-1]["content"])
            return [label], ()
        if kind == "summary":
            asked = user.split("\n", 1)[0].removeprefix("User: ")
            summary = self.summarizer(asked)
            return [" " + summary if req.continue_final_message else summary], ()  # after the begun subject
        last = req.messages[-1]
        if last["role"] == "tool":
            return [f"[{self.tag(req.adapter)}]", " done:", f" {last.get('content')}"], ()
        if req.tools and "tool:" in user:
            name = user.split("tool:", 1)[1].split()[0]
            call = ToolCall(id=f"call_{len(self.requests)}", function=FunctionCall(name=name, arguments='{"x": 1}'))
            return [], (call,)
        reply = f"[{self.tag(req.adapter)}] reply to: {user}"
        for stop in req.stop or ():
            if stop in reply:
                reply = reply[:reply.index(stop)]
        words = reply.split(" ")
        chunks = [words[0]] + [" " + w for w in words[1:]]
        if req.max_tokens is not None:
            chunks = chunks[:req.max_tokens]
        return chunks, ()

    async def stream(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:
        self.requests.append(request)
        failure = self._failure(request)
        chunks, calls = self._answer(request)
        usage = self._usage(request, chunks)
        for i, chunk in enumerate(chunks):
            if failure is not None and i == failure.after_chunks:
                if not failure.stall_s:
                    raise failure.error("fake engine failure")
                await asyncio.sleep(failure.stall_s)
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
            yield EngineDelta(text=chunk)
        if failure is not None and not failure.stall_s:
            raise failure.error("fake engine failure")
        finish = "tool_calls" if calls else (
            "length" if request.max_tokens is not None and len(chunks) >= request.max_tokens else "stop")
        user = next((m.get("content") or "" for m in reversed(request.messages) if m["role"] == "user"), "")
        matched = next((s for s in request.stop or () if s in user), None) if self.kind(request) == "answer" else None
        yield EngineDelta(tool_calls=calls, finish_reason=finish, usage=usage,
                          stop_sequence=matched if finish == "stop" else None, request_id=f"fake-{id(request):x}")

    def of_kind(self, kind: str) -> list[EngineRequest]:
        return [r for r in self.requests if self.kind(r) == kind]
