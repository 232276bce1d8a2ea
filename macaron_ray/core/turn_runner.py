"""TurnRunner: one user turn in three hops, transactional.

    route hop   L0 on the new message and the previous turn (its specialist and summary),
                constrained to a canonical label (skipped for tool results)
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
from contextlib import aclosing
from dataclasses import dataclass, field, replace

from macaron_ray.core import route_hop, summary_hop
from macaron_ray.core.conversation import (
    History, HistoryError, Message, ToolCall, Turn, TurnMeta, answer_key, pending_tool_results, split_turns,
)
from macaron_ray.core.deadlines import DeadlineEngine, Deadlines
from macaron_ray.core.engine_client import (
    SUMMARY_PRIORITY, EngineClient, EngineDelta, EngineError, EngineRequest, EngineTimeout, EngineUnavailable,
    Usage,
)
from macaron_ray.core.own_view import VIEWS
from macaron_ray.core.registry import SpecialistRegistry
from macaron_ray.observability.metrics import MoLMetrics
from macaron_ray.observability.tracing import NO_TRACING, Span, Tracer
from macaron_ray.store.base import ConversationStore, StoreError
from macaron_ray.store.metered import MeteredStore

logger = logging.getLogger(__name__)

DEFAULT_MAX_REDERIVED_TURNS = 32


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
    surface: str = "chat"
    """The API surface the turn came through (a metrics label): chat, responses or messages."""


@dataclass
class HopTiming:
    """One turn's hop times in seconds, filled as the turn runs (events share this object)."""

    route_s: float | None = None
    """None when the turn skipped routing (tool results)."""
    summary_wait_s: float = 0.0
    """Time spent waiting for (or re-deriving) earlier turns' summaries before the answer."""
    answer_ttft_s: float | None = None
    answer_s: float | None = None
    turn_s: float | None = None
    """The whole turn, from the runner's start to the final event."""
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
    """The turn's timing so far (the same object on every event: the route is known from the first)."""
    turn_key: str = ""
    """Private cache key of the turn (for `wait_summary`); never sent to a client."""


def rollback_cause(exc: BaseException) -> str:
    """Why a turn was rolled back, as the `cause` label of the rollback counter."""
    if isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
        return "client_disconnect"  # the consumer closed the stream or its task was cancelled
    if isinstance(exc, (EngineTimeout, TimeoutError)):
        return "timeout"
    if isinstance(exc, EngineUnavailable):
        return "unavailable"
    if isinstance(exc, EngineError):
        return "engine_error"
    if isinstance(exc, StoreError):
        return "store_error"
    return "internal"


class TurnRunner:
    """Owns the hops and the pending summary tasks of one process (one ingress replica)."""

    def __init__(self, registry: SpecialistRegistry, engine: EngineClient, store: ConversationStore, *,
                 router: EngineClient | None = None, summarizer: EngineClient | None = None,
                 metrics: MoLMetrics | None = None,
                 tracer: Tracer = NO_TRACING, summary_attempts: int = 3,
                 summary_retry_delay_s: float = 0.5, summary_wait_s: float = 60.0, view: str = "own",
                 deadlines: Deadlines | None = Deadlines(), summary_timeout_s: float = 120.0,
                 max_rederived_turns: int = DEFAULT_MAX_REDERIVED_TURNS):
        """`engine` serves the answer hops; `router` (default: `engine`) the route hops, `summarizer`
        (default: `router`) the summary hops.
        `metrics` default: a Prometheus registry of the runner's own. `store` is wrapped so that its
        failures are counted and raised as `StoreError`. `view`: "own" (own-view), or "naive" (the
        whole history verbatim for every specialist: the baseline `macaron bench ownview` measures).
        `deadlines`: on every engine call (None: none). `summary_timeout_s`: one summary attempt, at
        most. `max_rederived_turns`: route hops, and summary hops, one request may run for past turns
        the store does not know (or whose summary it lacks); beyond them the entry specialist, and
        the user message, stand in (`_past_metas`, `_with_summaries`)."""
        self.registry = registry
        router, summarizer = router or engine, summarizer or router or engine
        if deadlines is not None:
            wrapped: dict[int, DeadlineEngine] = {}  # one wrapper per distinct engine
            engine, router, summarizer = (wrapped.setdefault(id(e), DeadlineEngine(e, deadlines))
                                          for e in (engine, router, summarizer))
        self.engine, self.router, self.summarizer = engine, router, summarizer
        self.summary_timeout_s = summary_timeout_s
        self.max_rederived_turns = max_rederived_turns
        self.turn_deadline_s = deadlines.turn_s if deadlines is not None else None
        self.metrics = metrics if metrics is not None else MoLMetrics()
        self.tracer = tracer
        self.store = MeteredStore(store, self.metrics)
        self.summary_attempts = summary_attempts
        self.summary_retry_delay_s = summary_retry_delay_s
        self.summary_wait_s = summary_wait_s
        self.view = VIEWS[view]
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
        m, surface = self.metrics, req.surface
        timing = HopTiming()
        turn_started = time.perf_counter()
        span = self.tracer.start("turn", surface=surface, tool_result=continuation is not None)
        m.turns_in_flight.add(1, surface=surface)
        delivered = False
        # What this turn learned of turns the store did not hold (labels re-derived, summaries of
        # edited answers): written only once the turn is delivered, like the turn itself.
        staged: dict[str, TurnMeta] = {}
        deadline = None if self.turn_deadline_s is None else asyncio.get_running_loop().time() + self.turn_deadline_s
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    label, past = await self._prepare(req, history, current, continuation is not None, staged,
                                                      timing, span)
            except TimeoutError:
                raise EngineTimeout(f"the turn ran past its deadline of {self.turn_deadline_s:g} s before its "
                                    "answer began") from None
            span.set("specialist", label)

            view = self.view(label, history.instructions, past, current)
            specialist = self.registry.get(label)
            answer = EngineRequest(
                adapter=specialist.adapter_id, messages=view, tools=req.tools, tool_choice=req.tool_choice,
                max_tokens=req.sampling.max_tokens, temperature=req.sampling.temperature,
                top_p=req.sampling.top_p, stop=req.sampling.stop, seed=req.sampling.seed,
                cache_salt=cache_salt(req.tenant), **specialist.answer_sampling.model_dump())
            text: list[str] = []
            hop = self.tracer.start("answer", span, specialist=label)
            started = time.perf_counter()
            final: EngineDelta | None = None
            try:
                # Closed on any exit (a deadline, an error, the client leaving), so the engine request is
                # cancelled then, not when the generator is collected.
                async with aclosing(self.engine.stream(answer)) as deltas:
                    async for delta in deltas:
                        if deadline is not None and asyncio.get_running_loop().time() > deadline:
                            raise EngineTimeout(f"the turn ran past its deadline of {self.turn_deadline_s:g} s")
                        if timing.answer_ttft_s is None:
                            timing.answer_ttft_s = time.perf_counter() - started
                            m.answer_ttft.observe(timing.answer_ttft_s, specialist=label, surface=surface)
                        if delta.text:
                            text.append(delta.text)
                            yield TurnEvent(text=delta.text, label=label, timing=timing)
                        if delta.finish_reason is not None:
                            final = delta
                if final is None:
                    raise EngineError("engine stream ended without a final delta", retryable=False)
                hop.set("engine.request_id", final.request_id)
                if final.usage is not None:
                    hop.set("prompt_tokens", final.usage.prompt_tokens)
                    hop.set("cached_tokens", final.usage.cached_tokens)
            except BaseException as exc:
                hop.error(exc)
                raise
            finally:
                hop.end()
            timing.answer_s = time.perf_counter() - started
            m.answer.observe(timing.answer_s, specialist=label, surface=surface)
            m.tokens("answer", label, final.usage)
            timing.turn_s = time.perf_counter() - turn_started
            yield TurnEvent(final=True, label=label, tool_calls=final.tool_calls,
                            finish_reason=final.finish_reason, stop_sequence=final.stop_sequence,
                            usage=final.usage, timing=timing, turn_key=current.key)
            delivered = True
            m.turn.observe(timing.turn_s, specialist=label, surface=surface)
            if continuation is None:
                await self._commit(req.tenant, current, label, "".join(text), final.tool_calls, timing, surface,
                                   span)
            await self._write_staged(req.tenant, staged)
        except BaseException as exc:
            if not delivered and not isinstance(exc, HistoryError):  # a client error: nothing ran
                m.rollbacks.inc(cause=rollback_cause(exc), surface=surface)
            span.error(exc)
            raise
        finally:
            m.turns_in_flight.add(-1, surface=surface)
            span.end()

    async def _prepare(self, req: TurnRequest, history: History, current: Turn, tool_results: bool,
                       staged: dict[str, TurnMeta], timing: HopTiming, span: Span) -> tuple[str, list]:
        """Everything before the answer hop: the past turns' metas, the specialist (route hop, or
        stickiness for tool results) and the summaries its view needs. Writes nothing: what the
        store lacked goes into `staged`."""
        m, surface = self.metrics, req.surface
        past = await self._past_metas(req.tenant, history, staged)
        if tool_results:
            # Tool-result stickiness: back to the specialist that made the call, no route hop. The call
            # is this turn's answer: when it is not the one committed under the turn's key (a request
            # that raced it won the commit), it is the turn under its own answer's key (`_commit`).
            meta = await self.store.get_turn(req.tenant, current.key)
            if meta is not None and meta.answer_sha not in (None, sha := _answer_sha(current)):
                meta = await self.store.get_turn(req.tenant, answer_key(current.key, sha)) or meta
            if meta is None:  # a call this deployment never stored: the tool specialist answers its result
                label = self.registry.tool_result_label or await self.route(current.user.content or "",
                                                                             tenant=req.tenant)
                meta = staged[current.key] = TurnMeta(label=label)
            label = meta.label
            m.stickiness_hits.inc(specialist=label)
        else:
            started = time.perf_counter()
            label = await self.route(current.user.content or "", parent=span, context=route_context(past),
                                     tenant=req.tenant)
            timing.route_s = time.perf_counter() - started
            m.route_hop.observe(timing.route_s, specialist=label, surface=surface)
            m.route_decisions.inc(specialist=label)
        started = time.perf_counter()
        past = await self._with_summaries(req.tenant, past, label, surface, staged)
        timing.summary_wait_s = time.perf_counter() - started
        m.summary_wait.observe(timing.summary_wait_s, specialist=label, surface=surface)
        return label, past

    async def _write_staged(self, tenant: str, staged: dict[str, TurnMeta]) -> None:
        """What a delivered turn learned of turns the store lacked. Best effort: each is a cache entry
        a later request can derive again, and the client already has its answer."""
        for key, meta in staged.items():
            try:
                await self.store.put_turn(tenant, key, meta)
            except StoreError as exc:
                logger.warning("%s; a later request derives it again", exc)

    async def _commit(self, tenant: str, turn: Turn, label: str, text: str, tool_calls: tuple[ToolCall, ...],
                      timing: HopTiming, surface: str, span: Span) -> None:
        digest = summary_hop.answer_digest(
            text, [(c.function.name, _json_or_text(c.function.arguments)) for c in tool_calls])
        sha = summary_hop.answer_sha(digest)
        store = self.tracer.start("store", span, operation="put_turn")
        try:
            written = await self.store.put_turn(tenant, turn.key, TurnMeta(label=label, answer_sha=sha))
            if not written:
                # Committed already: a retry of this delivered turn (the same answer), or a request that
                # raced this one on the same history with another answer. Then this answer is the turn
                # under its own answer's key, so a conversation continued from it is credited to the
                # specialist that gave it (as an edited answer is, `_past_metas`).
                first = await self.store.get_turn(tenant, turn.key)
                if first is not None and first.answer_sha not in (None, sha):
                    turn = replace(turn, key=answer_key(turn.key, sha))
                    written = await self.store.put_turn(tenant, turn.key, TurnMeta(label=label, answer_sha=sha))
        finally:
            store.end()
        if not written:
            return  # already committed (a retry of a delivered turn, or another replica)
        self.metrics.turns_committed.inc(specialist=label, surface=surface)
        task = asyncio.create_task(self._summarize(tenant, turn.key, turn.user.content or "", digest, label,
                                                   surface, timing, span))
        self._pending[(tenant, turn.key)] = task
        task.add_done_callback(lambda _: self._pending.pop((tenant, turn.key), None))

    # -- hops -------------------------------------------------------------------------------

    @staticmethod
    async def _whole(engine: EngineClient, req: EngineRequest) -> tuple[str, EngineDelta | None]:
        """One route or summary request on `engine`: its whole text and its final delta."""
        parts, final = [], None
        async with aclosing(engine.stream(req)) as deltas:
            async for delta in deltas:
                parts.append(delta.text)
                if delta.finish_reason is not None:
                    final = delta
        return "".join(parts), final

    async def route(self, user_text: str, parent: Span | None = None,
                    context: route_hop.RouteContext | None = None, *, tenant: str | None = None) -> str:
        """The route hop (prefix cache salted by `tenant`). A non-canonical output is a routing error
        and falls back to L0."""
        labels, entry = self.registry.labels, self.registry.entry_label
        span = self.tracer.start("route", parent)
        try:
            req = route_hop.route_request(self.registry.adapter(entry), user_text, labels, context=context)
            output, final = await self._whole(self.router, replace(req, cache_salt=cache_salt(tenant)))
            self.metrics.tokens("route", entry, final.usage if final else None)
            label = route_hop.parse_label(output, labels)
            if label is None:
                self.metrics.router_noncanonical.inc()
                logger.warning("routing error: non-canonical route output (%d chars); falling back", len(output))
                label = entry
            span.set("specialist", label)
            span.set("engine.request_id", final.request_id if final else None)
            return label
        except BaseException as exc:
            span.error(exc)
            raise
        finally:
            span.end()

    async def summarize(self, user_text: str, digest: str, parent: Span | None = None, label: str | None = None,
                        *, tenant: str | None = None) -> str:
        """The summary hop on a turn `label` answered (its subject begins the summary; the prefix
        cache salted by `tenant`)."""
        entry = self.registry.entry_label
        messages = summary_hop.summary_messages(user_text, digest, label)
        req = EngineRequest(adapter=self.registry.adapter(entry), messages=messages,
                            max_tokens=summary_hop.SUMMARY_BUDGET_TOKENS, temperature=0.0,
                            continue_final_message=bool(summary_hop.begun(messages)), priority=SUMMARY_PRIORITY,
                            cache_salt=cache_salt(tenant))
        span = self.tracer.start("summary", parent)
        try:
            text, final = await self._whole(self.summarizer, req)
            span.set("engine.request_id", final.request_id if final else None)
        except BaseException as exc:
            span.error(exc)
            raise
        finally:
            span.end()
        self.metrics.tokens("summary", entry, final.usage if final else None)
        if not summary_hop.usable(text):
            logger.info("summary hop output unusable (empty or a repetition loop); the user message stands in")
        return summary_hop.stored_summary(messages, text, user_text)

    async def _summarize(self, tenant: str, key: str, user_text: str, digest: str, label: str, surface: str,
                         timing: HopTiming | None = None, parent: Span | None = None, *,
                         write: bool = True, attempts: int | None = None) -> str | None:
        """The summary of a turn, stored as its turn's (`write`: the turn is in the store). When
        another request stored one first, that one is returned: every view of the turn then holds
        the same bytes (a prefix-cache hit), and it is not summarized again. `attempts`: default
        `summary_attempts`; a turn waiting for the summary makes one, then the user message stands in."""
        attempts = attempts or self.summary_attempts
        for attempt in range(1, attempts + 1):
            started = time.perf_counter()
            try:
                async with asyncio.timeout(self.summary_timeout_s):
                    summary = await self.summarize(user_text, digest, parent, label, tenant=tenant)
                elapsed = time.perf_counter() - started
                if write and not await self.store.set_summary(tenant, key, summary, elapsed):
                    first = await self.store.get_turn(tenant, key)
                    summary = first.summary if first is not None and first.summary is not None else summary
            except Exception as exc:  # noqa: BLE001 - any failure is retried, then left pending
                logger.warning("summary attempt %d failed: %s", attempt, type(exc).__name__)
                if attempt < attempts:
                    await asyncio.sleep(self.summary_retry_delay_s * attempt)
                continue
            if timing is not None:
                timing.summary_s = elapsed
            self.metrics.summary_hop.observe(elapsed, specialist=label, surface=surface)
            return summary
        self.metrics.summary_failures.inc()
        return None

    # -- past turns -------------------------------------------------------------------------

    async def _past_metas(self, tenant: str, history: History,
                          staged: dict[str, TurnMeta]) -> list[tuple[Turn, TurnMeta]]:
        """Each past turn with its meta, read in one store round trip (two when answers were edited).

        A turn the store does not hold gets its label re-derived by a route hop: the latest
        `max_rederived_turns` of them in one request, and the entry specialist stands for any older
        ones (a history from elsewhere, or keyed before an upgrade, is served, never refused). A
        turn whose answer is not the one committed (the client regenerated or edited it) is the
        turn under its answer's own key, which needs a summary of its own (`_with_summaries` caps
        those)."""
        past = history.turns[:-1]
        if not past:
            return []
        metas = await self.store.get_turns(tenant, [t.key for t in past])
        edited: dict[int, Turn] = {}
        for i, (turn, meta) in enumerate(zip(past, metas)):
            if meta is not None and meta.answer_sha is not None and meta.answer_sha != (sha := _answer_sha(turn)):
                edited[i] = replace(turn, key=answer_key(turn.key, sha))
        alt = dict(zip(edited, await self.store.get_turns(tenant, [t.key for t in edited.values()]))) if edited else {}
        unknown = [i for i, meta in enumerate(metas) if meta is None]
        routed = set(unknown[len(unknown) - self.max_rederived_turns:]) if self.max_rederived_turns else set()
        out = []
        for i, (turn, meta) in enumerate(zip(past, metas)):
            if meta is None:
                self.metrics.ownview_cache_misses.inc()
                label = await self.route(turn.user.content or "", tenant=tenant) if i in routed \
                    else self.registry.entry_label
                meta = staged[turn.key] = TurnMeta(label=label)
            elif i in edited:
                turn, meta = edited[i], alt[i]
                if meta is None:
                    meta = staged[turn.key] = TurnMeta(label=metas[i].label, answer_sha=_answer_sha(turn))
            out.append((turn, meta))
        return out

    async def _with_summaries(self, tenant: str, past: list[tuple[Turn, TurnMeta]], label: str,
                              surface: str, staged: dict[str, TurnMeta]) -> list[tuple[Turn, TurnMeta]]:
        """Every other specialist's turn with its summary: awaited if pending, else re-derived, at most
        `max_rederived_turns` of them in one request (a summary engine that keeps failing must not
        make each request run a hop for every past turn)."""
        out = []
        budget = self.max_rederived_turns  # summary hops this request may run, the latest turns first
        for turn, meta in reversed(past):
            if meta.label != label and meta.summary is None:
                if budget > 0 or (tenant, turn.key) in self._pending:
                    budget -= (tenant, turn.key) not in self._pending
                    meta = await self._summary_for(tenant, turn, meta, surface, staged)
                else:  # past the cap: the user message stands in, and a later request may summarize it
                    meta = replace(meta, summary=summary_hop.fallback_summary(turn.user.content or ""))
            out.append((turn, meta))
        return out[::-1]

    async def _summary_for(self, tenant: str, turn: Turn, meta: TurnMeta, surface: str,
                           staged: dict[str, TurnMeta]) -> TurnMeta:
        if turn.key in staged:  # not in the store yet: its summary is staged with it
            summary = await self._summarize(tenant, turn.key, turn.user.content or "", _past_digest(turn),
                                            meta.label, surface, write=False, attempts=1)
            if summary is not None:
                staged[turn.key] = replace(meta, summary=summary)
            return replace(meta, summary=summary or summary_hop.fallback_summary(turn.user.content or ""))
        task = self._pending.get((tenant, turn.key))
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), self.summary_wait_s)
            except asyncio.TimeoutError:
                pass
        stored = await self.store.get_turn(tenant, turn.key)
        if stored is not None and stored.summary is not None:
            return stored
        digest = _past_digest(turn)
        summary = await self._summarize(tenant, turn.key, turn.user.content or "", digest, meta.label, surface,
                                        attempts=1)
        if summary is None:
            summary = summary_hop.fallback_summary(turn.user.content or "")  # never block the turn
        return replace(meta, summary=summary)

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


def cache_salt(tenant: str | None) -> str | None:
    """The engines' prefix-cache salt of a tenant's requests (None: unsalted, shared)."""
    return None if tenant is None else f"tenant-{tenant}"


def route_context(past: list[tuple[Turn, TurnMeta]]) -> route_hop.RouteContext | None:
    """The route hop's context block: the previous turn's specialist and its summary, or its user
    message while the summary is pending."""
    if not past:
        return None
    turn, meta = past[-1]
    return route_hop.RouteContext(label=meta.label, text=meta.summary or turn.user.content or "")


def _past_digest(turn: Turn) -> str:
    """The summary hop's digest of a past turn's answer, as the history holds it."""
    answer = next((m for m in turn.rest if m.role == "assistant"), None)
    calls = [(c.function.name, _json_or_text(c.function.arguments)) for c in (answer.tool_calls or ())] \
        if answer else []
    return summary_hop.answer_digest(answer.content if answer else "", calls)


def _answer_sha(turn: Turn) -> str:
    return summary_hop.answer_sha(_past_digest(turn))


def _json_or_text(arguments: str) -> dict | str:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
