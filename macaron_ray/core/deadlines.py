"""Deadlines on engine calls: a stalled engine becomes a retryable `EngineTimeout`, not a hung client.

`DeadlineEngine` wraps any `EngineClient`. The first delta must come within
`first_token_s` of the call (connecting, queueing and the prefill are in it), and
each later delta within `inter_token_s` of the one before. When a deadline
passes, the engine's stream is closed (which cancels the engine request) and
`EngineTimeout` is raised: the turn rolls back and the client gets a 503 with
Retry-After, or a stream error event once the stream has begun.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from macaron_ray.core.engine_client import EngineClient, EngineDelta, EngineRequest, EngineTimeout


@dataclass(frozen=True)
class Deadlines:
    first_token_s: float = 120.0
    """From the call to the first delta (a route hop's whole label, an answer's first token)."""
    inter_token_s: float = 30.0
    """Between two deltas of one stream."""
    turn_s: float = 600.0
    """A whole turn, from its start to its final event: route hop, summaries it waits for or
    re-derives, and the answer (enforced by the TurnRunner, whatever the engine's pace)."""

    def __post_init__(self) -> None:
        if not (self.first_token_s > 0 and self.inter_token_s > 0 and self.turn_s > 0):
            raise ValueError("deadlines must be positive")


class DeadlineEngine:
    def __init__(self, engine: EngineClient, deadlines: Deadlines):
        self.engine = engine
        self.deadlines = deadlines

    async def stream(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:
        deltas = aiter(self.engine.stream(request))
        limit, which = self.deadlines.first_token_s, "first token"
        try:
            while True:
                try:
                    async with asyncio.timeout(limit):
                        delta = await anext(deltas)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise EngineTimeout(f"no {which} from the engine within {limit:g} s") from None
                yield delta
                limit, which = self.deadlines.inter_token_s, "token"
        finally:
            await deltas.aclose()

    def __getattr__(self, name):  # aclose() and the like of the wrapped client
        return getattr(self.engine, name)
