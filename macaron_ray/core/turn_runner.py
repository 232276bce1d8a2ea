"""TurnRunner: one user turn in three hops, transactional.

    route hop   L0, constrained to a canonical label (skipped for tool results)
    answer hop  the chosen specialist, on its own-view, streamed
    summary hop L0, after the answer is delivered, off the critical path
                (skipped for tool results)

State changes follow stage -> deliver -> commit. Nothing of a turn is written
before its final event has been delivered (the consumer pulled past it), so an
engine error or a client disconnect leaves the store as it was and the same
turn can be retried. A delivered turn is committed exactly once
(`ConversationStore.put_turn` is insert-if-absent). Its summary is written
later; a failed summary is retried and never un-delivers the turn, and a turn
that needs a summary still pending waits for it or re-derives it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from macaron_ray.core import route_hop, summary_hop
from macaron_ray.core.conversation import (
    History, HistoryError, Message, ToolCall, Turn, TurnMeta, pending_tool_results, split_turns,
)
from macaron_ray.core.engine_client import EngineClient, EngineDelta, EngineRequest, Usage
from macaron_ray.core.own_view import own_view
from macaron_ray.core.registry import SpecialistRegistry
from macaron_ray.store.base import ConversationStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    """The client's sampling settings for the answer hop."""

    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None


@dataclass(frozen=True)
class TurnRequest:
    tenant: str
    messages: tuple[Message, ...]
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    sampling: Sampling = field(default_factory=Sampling)


@dataclass
class HopTiming:
    route_s: float | None = None
    """None when the turn skipped routing (tool results)."""
    answer_ttft_s: float | None = None
    answer_s: float | None = None
    summary_s: float | None = None
    """Filled when the summary hop finishes (after delivery); see `TurnRunner.wait_summary`."""


@dataclass(frozen=True)
class TurnEvent:
    """A text delta, or (final=True) the end of the answer with its calls, usage and timing."""

    text: str = ""
    final: bool = False
    label: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    stop_sequence: str | None = None
    usage: Usage | None = None
    timing: HopTiming | None = None
    turn_key: str = ""
    """Private cache key of the turn (for `wait_summary`); never sent to a client."""


@dataclass
class RunnerStats:
    turns_committed: int = 0
    turns_rolled_back: int = 0
    routing_errors: int = 0
    """Route outputs that were not a canonical label (fell back to L0)."""
    summaries_failed: int = 0
    cache_misses: int = 0
    """Past turns whose metadata was missing and had to be re-derived."""


class TurnRunner:
    """Owns the hops and the pending summary tasks of one process (one ingress replica)."""

    def __init__(self, registry: SpecialistRegistry, engine: EngineClient, store: ConversationStore, *,
                 router: EngineClient | None = None, summary_attempts: int = 3,
                 summary_retry_delay_s: float = 0.5, summary_wait_s: float = 60.0):
        """`engine` serves the answer hops; `router` (default: `engine`) the route and summary hops."""
        self.registry = registry
        self.engine = engine
        self.router = router or engine
        self.store = store
        self.summary_attempts = summary_attempts
        self.summary_retry_delay_s = summary_retry_delay_s
        self.summary_wait_s = summary_wait_s
        self.stats = RunnerStats()
        # (tenant, key) -> the summary task of a delivered turn. Tasks are held here so
        # they are not garbage-collected, and so the next turn can await them.
        self._pending: dict[tuple[str, str], asyncio.Task] = {}

    # -- the turn ---------------------------------------------------------------------------

    async def run(self, req: TurnRequest) -> AsyncIterator[TurnEvent]:
        """Stream one turn. Commits only after the final event was delivered."""
        history = split_turns(req.tenant, req.messages)
        current = history.turns[-1]
        continuation = pending_tool_results(current)
        if continuation is None and current.rest:
            raise HistoryError("the last message must be a user message or tool results")
        if continuation is not None:
            call_msg, results = continuation
            known = {c.id for c in call_msg.tool_calls or ()}
            for r in results:
                if r.tool_call_id not in known:
                    raise HistoryError(f"tool result for unknown tool_call_id {r.tool_call_id!r}")
        timing = HopTiming()
        past = await self._past_metas(req.tenant, history)

        if continuation is not None:
            # Tool-result stickiness: back to the specialist that made the call, no route hop.
            meta = await self.store.get_turn(req.tenant, current.key)
            label = meta.label if meta else await self._rederive_label(req.tenant, current)
        else:
            started = time.perf_counter()
            label = await self.route(current.user.content or "")
            timing.route_s = time.perf_counter() - started

        past = await self._with_summaries(req.tenant, past, label)
        view = own_view(label, history.instructions, past, current)
        answer = EngineRequest(
            adapter=self.registry.adapter(label), messages=view, tools=req.tools, tool_choice=req.tool_choice,
            max_tokens=req.sampling.max_tokens, temperature=req.sampling.temperature,
            top_p=req.sampling.top_p, stop=req.sampling.stop, seed=req.sampling.seed)

        delivered = False
        text: list[str] = []
        try:
            started = time.perf_counter()
            final: EngineDelta | None = None
            async for delta in self.engine.stream(answer):
                if timing.answer_ttft_s is None:
                    timing.answer_ttft_s = time.perf_counter() - started
                if delta.text:
                    text.append(delta.text)
                    yield TurnEvent(text=delta.text, label=label)
                if delta.finish_reason is not None:
                    final = delta
            if final is None:
                raise RuntimeError("engine stream ended without a final delta")
            timing.answer_s = time.perf_counter() - started
            yield TurnEvent(final=True, label=label, tool_calls=final.tool_calls,
                            finish_reason=final.finish_reason, stop_sequence=final.stop_sequence,
                            usage=final.usage, timing=timing,
                            turn_key=current.key)
            delivered = True
        finally:
            if not delivered:
                self.stats.turns_rolled_back += 1
        if continuation is None:
            await self._commit(req.tenant, current, label, "".join(text), final.tool_calls, timing)

    async def _commit(self, tenant: str, turn: Turn, label: str, text: str,
                      tool_calls: tuple[ToolCall, ...], timing: HopTiming) -> None:
        if not await self.store.put_turn(tenant, turn.key, TurnMeta(label=label)):
            return  # already committed (a retry of a delivered turn, or another replica)
        self.stats.turns_committed += 1
        digest = summary_hop.answer_digest(
            text, [(c.function.name, _json_or_text(c.function.arguments)) for c in tool_calls])
        task = asyncio.create_task(self._summarize(tenant, turn.key, turn.user.content or "", digest, timing))
        self._pending[(tenant, turn.key)] = task
        task.add_done_callback(lambda _: self._pending.pop((tenant, turn.key), None))

    # -- hops -------------------------------------------------------------------------------

    async def route(self, user_text: str) -> str:
        """The route hop. A non-canonical output is a routing error and falls back to L0."""
        labels = self.registry.labels
        req = route_hop.route_request(self.registry.adapter(self.registry.entry_label), user_text, labels)
        output = "".join([d.text async for d in self.router.stream(req)])
        label = route_hop.parse_label(output, labels)
        if label is None:
            self.stats.routing_errors += 1
            logger.warning("routing error: non-canonical route output (%d chars); falling back", len(output))
            return self.registry.entry_label
        return label

    async def summarize(self, user_text: str, digest: str) -> str:
        req = EngineRequest(adapter=self.registry.adapter(self.registry.entry_label),
                            messages=summary_hop.summary_messages(user_text, digest),
                            max_tokens=summary_hop.SUMMARY_BUDGET_TOKENS, temperature=0.0)
        text = "".join([d.text async for d in self.router.stream(req)]).strip()
        return text or f"The user asked: {user_text}"

    async def _summarize(self, tenant: str, key: str, user_text: str, digest: str,
                         timing: HopTiming | None = None) -> str | None:
        for attempt in range(1, self.summary_attempts + 1):
            started = time.perf_counter()
            try:
                summary = await self.summarize(user_text, digest)
            except Exception as exc:  # noqa: BLE001 - any failure is retried, then left pending
                logger.warning("summary attempt %d failed: %s", attempt, type(exc).__name__)
                await asyncio.sleep(self.summary_retry_delay_s * attempt)
                continue
            elapsed = time.perf_counter() - started
            if timing is not None:
                timing.summary_s = elapsed
            await self.store.set_summary(tenant, key, summary, elapsed)
            return summary
        self.stats.summaries_failed += 1
        return None

    # -- past turns -------------------------------------------------------------------------

    async def _past_metas(self, tenant: str, history: History) -> list[tuple[Turn, TurnMeta]]:
        past = history.turns[:-1]
        metas = await asyncio.gather(*(self.store.get_turn(tenant, t.key) for t in past))
        out = []
        for turn, meta in zip(past, metas):
            if meta is None:
                self.stats.cache_misses += 1
                meta = TurnMeta(label=await self._rederive_label(tenant, turn))
            out.append((turn, meta))
        return out

    async def _rederive_label(self, tenant: str, turn: Turn) -> str:
        label = await self.route(turn.user.content or "")
        await self.store.put_turn(tenant, turn.key, TurnMeta(label=label))
        return label

    async def _with_summaries(self, tenant: str, past: list[tuple[Turn, TurnMeta]],
                              label: str) -> list[tuple[Turn, TurnMeta]]:
        """Every other specialist's turn with its summary: awaited if pending, else re-derived."""
        out = []
        for turn, meta in past:
            if meta.label != label and meta.summary is None:
                meta = await self._summary_for(tenant, turn, meta)
            out.append((turn, meta))
        return out

    async def _summary_for(self, tenant: str, turn: Turn, meta: TurnMeta) -> TurnMeta:
        task = self._pending.get((tenant, turn.key))
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), self.summary_wait_s)
            except asyncio.TimeoutError:
                pass
        stored = await self.store.get_turn(tenant, turn.key)
        if stored is not None and stored.summary is not None:
            return stored
        answer = next((m for m in turn.rest if m.role == "assistant"), None)
        calls = [(c.function.name, _json_or_text(c.function.arguments)) for c in (answer.tool_calls or ())] \
            if answer else []
        digest = summary_hop.answer_digest(answer.content if answer else "", calls)
        summary = await self._summarize(tenant, turn.key, turn.user.content or "", digest)
        if summary is None:
            summary = f"The user asked: {turn.user.content}"  # last resort: never block the turn
        return TurnMeta(label=meta.label, summary=summary)

    async def wait_summary(self, tenant: str, key: str) -> TurnMeta | None:
        """Wait for a delivered turn's summary hop (benchmarks and tests)."""
        task = self._pending.get((tenant, key))
        if task is not None:
            await task
        return await self.store.get_turn(tenant, key)

    async def drain(self) -> None:
        """Wait for every pending summary (shutdown)."""
        if self._pending:
            await asyncio.gather(*list(self._pending.values()), return_exceptions=True)


def _json_or_text(arguments: str) -> dict | str:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
