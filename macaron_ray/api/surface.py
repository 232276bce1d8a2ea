"""What the three surfaces share: settings, auth -> tenant, the public model check, running a turn.

Each surface translates its wire format into a `TurnRequest`, runs it through
the one TurnRunner, and translates the events back. Errors raised by the core
are mapped here to `APIError`s, so no surface leaks an internal message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from macaron_ray.api.errors import APIError, engine_unavailable, internal_error, store_unavailable
from macaron_ray.api.gate import TENANT_STATE, Limits, authenticate
from macaron_ray.api.keys import KeyRing
from macaron_ray.api.timing import DONE_FRAME, SPECIALIST_HEADER, server_timing, sse_comment
from macaron_ray.core.conversation import HistoryError
from macaron_ray.core.engine_client import EngineError
from macaron_ray.core.turn_runner import TurnEvent, TurnRequest, TurnRunner
from macaron_ray.observability.metrics import MoLMetrics
from macaron_ray.store.base import ConversationStore, StoreError

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_BODY_LIMIT_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_MESSAGES = 1024
TEMPLATE_BYTES, TEMPLATE_BYTES_PER_MESSAGE = 1024, 64
"""More than the chat template adds to a prompt (a default system prompt, tool instructions) and
around each message (role markers, separators), in bytes: the bound that spares tokenizing."""


class TokenCounter(Protocol):
    def count(self, messages: list[dict], tools: list[dict] | None) -> int:
        """Prompt tokens of `messages` (+ tools) as the base model's chat template renders them."""
        ...


@dataclass
class Surfaces:
    """Everything the API routes need, built once per process (one ingress replica)."""

    runner: TurnRunner
    tokens: TokenCounter
    keys: KeyRing | None = None
    """When set, every request but /health must present one of its keys (checked by the gate before
    the body is read); when None, any key (or none) names its own tenant."""
    limits: Limits = field(default_factory=Limits)
    """Per-tenant rate and concurrency, and this replica's turns in flight (the gate)."""
    body_limit_bytes: int = DEFAULT_BODY_LIMIT_BYTES
    debug_headers: bool = False
    """Send the specialist label of each turn (`x-macaron-specialist`); off by default."""
    context_tokens: int | None = None
    """The engines' context (`max_model_len`): a request whose completion budget, or prompt plus
    budget, cannot fit is refused with a 400 before any engine call. None: not checked here."""

    max_messages: int = DEFAULT_MAX_MESSAGES
    """Messages in one request, at most: each past turn the store does not hold costs a route hop
    and a summary to re-derive."""

    def check_message_count(self, count: int, param: str) -> None:
        if count > self.max_messages:
            raise APIError(400, f"{param} has {count} messages; at most {self.max_messages} are accepted in one "
                                f"request", param=param, code="too_many_messages")

    async def check_request(self, req: TurnRequest, *, max_tokens_param: str, prompt_param: str) -> None:
        """400 in the surface's envelope when `req` has more messages than allowed or cannot fit the
        context (the engine would refuse it), before any engine call.

        The prompt is counted as the base's chat template renders the request, on a worker thread;
        a request whose UTF-8 size already fits is not tokenized (a byte-level BPE token covers at
        least one byte). A specialist's own view may differ from the request by its scaffold and the
        summaries of other turns, so the engine can still refuse a request at the edge."""
        self.check_message_count(len(req.messages), prompt_param)
        context = self.context_tokens
        if context is None:
            return
        budget = req.sampling.max_tokens
        if budget is not None and budget >= context:
            raise APIError(400, f"{max_tokens_param} is {budget}; this model's context is {context} tokens, "
                                f"prompt included, so it must be below {context}", param=max_tokens_param,
                           code="invalid_value")
        limit = context - (budget or 1)
        size = TEMPLATE_BYTES + sum(len((m.content or "").encode()) + TEMPLATE_BYTES_PER_MESSAGE
                                    for m in req.messages)
        size += sum(len(json.dumps(c.model_dump()).encode()) for m in req.messages for c in m.tool_calls or ())
        size += len(json.dumps(req.tools).encode()) if req.tools else 0
        if size <= limit:
            return
        prompt = await asyncio.to_thread(self.tokens.count, [m.to_openai() for m in req.messages], req.tools)
        if prompt > limit:
            raise APIError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                                f"{prompt + (budget or 0)} tokens ({prompt} in the {prompt_param}, {budget or 0} "
                                f"in the completion). Please reduce the length of the {prompt_param} or completion.",
                           param=prompt_param, code="context_length_exceeded")

    @property
    def store(self) -> ConversationStore:
        """Conversation state, responses included (the runner's store)."""
        return self.runner.store

    @property
    def metrics(self) -> MoLMetrics:
        return self.runner.metrics

    def turn_headers(self, event: TurnEvent | None, *, whole: bool) -> dict[str, str]:
        """Server-Timing (and, with debug headers on, the specialist) of a turn's response."""
        headers = {}
        if event is not None:
            headers["Server-Timing"] = server_timing(event.timing, whole=whole)
            if self.debug_headers and event.label:
                headers[SPECIALIST_HEADER] = event.label
        return headers

    def json(self, body: dict, final: TurnEvent) -> JSONResponse:
        """A whole turn's response, with its timing."""
        return JSONResponse(body, headers=self.turn_headers(final, whole=True))

    def stream(self, req: TurnRequest, first: TurnEvent | None, frames: AsyncIterator[str]) -> StreamingResponse:
        """A turn's SSE response: route timing in the header, the whole turn's timing in a closing
        comment, and the stream counted in flight while it is open.

        The comment goes before Chat Completions' `data: [DONE]`: the openai SDK stops reading at
        that sentinel and drains what follows for only 0.1 s, so a comment after it can be lost."""
        def closing() -> str:  # read when sent: the runner fills the timing in as the turn goes
            return sse_comment(first.timing if first is not None else None)

        async def counted() -> AsyncIterator[str]:
            self.metrics.streams_in_flight.add(1, surface=req.surface)
            timed = False
            try:
                async for frame in frames:
                    if frame == DONE_FRAME:
                        timed = True
                        yield closing()
                    yield frame
                if not timed:
                    yield closing()
            finally:
                self.metrics.streams_in_flight.add(-1, surface=req.surface)

        return StreamingResponse(counted(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", **self.turn_headers(first, whole=False)})

    @property
    def public_model(self) -> str:
        return self.runner.registry.public_model

    def tenant(self, request: Request) -> str:
        """The request's tenant id, as the gate authenticated it."""
        tenant = request.scope.get("state", {}).get(TENANT_STATE)
        return tenant if tenant is not None else authenticate(self.keys, request.headers, request.url.path)

    def check_model(self, model: str) -> None:
        if model != self.public_model:
            raise APIError(404, f"The model '{model}' does not exist", param="model", code="model_not_found")


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def to_api_error(exc: BaseException, *, param: str = "messages") -> APIError:
    """Map a core or engine failure to a client-safe error."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, HistoryError):
        return APIError(400, str(exc), param=param if exc.param == "messages" else exc.param, code="invalid_value")
    if isinstance(exc, EngineError):
        logger.warning("engine error: %s", exc)
        if exc.status == 400:  # its message may name private models: say what it means instead
            return APIError(400, "The model could not take this request as given: its prompt, as the specialist "
                                 "sees it, and its token budget must fit the model's context. Shorten the "
                                 "conversation or lower the token budget.", param=param, code="invalid_request")
        return engine_unavailable() if exc.retryable else internal_error()
    if isinstance(exc, StoreError):
        logger.warning("%s", exc)
        return store_unavailable()
    logger.exception("unexpected error in a turn", exc_info=exc)
    return internal_error()


async def stored(call: Awaitable[T]) -> T:
    """A store call made by a route itself (outside a turn): its failure is the 503 + Retry-After
    a turn's store failure gets, not a 500."""
    try:
        return await call
    except StoreError as exc:
        raise to_api_error(exc) from None


async def first_event(events: AsyncIterator[TurnEvent], *, param: str) -> tuple[TurnEvent | None, AsyncIterator[TurnEvent]]:
    """Pull the first event before a stream starts, so early failures still get an HTTP status."""
    try:
        return await events.__anext__(), events
    except StopAsyncIteration:
        return None, events
    except Exception as exc:  # noqa: BLE001 - mapped to the surface's envelope
        raise to_api_error(exc, param=param) from None


async def collect(runner: TurnRunner, req: TurnRequest, *, param: str) -> tuple[str, TurnEvent]:
    """Run a whole turn (non-streaming). The turn commits when this returns."""
    parts, final = [], None
    try:
        async for ev in runner.run(req):
            if ev.final:
                final = ev
            else:
                parts.append(ev.text)
    except Exception as exc:  # noqa: BLE001 - mapped to the surface's envelope
        raise to_api_error(exc, param=param) from None
    assert final is not None
    return "".join(parts), final
