"""The EngineClient seam: one chat request under one adapter -> a stream of deltas.

Implementations: `macaron_ray.engine.openai_http.OpenAIHTTPEngine` (a vLLM
OpenAI-compatible server) and `macaron_ray.testing.fake_engine.FakeEngine`
(deterministic, for tests). The Ray Serve handle implementation lives with the
topology. Engine errors surface as `EngineError` (`EngineUnavailable` and
`EngineTimeout` say why, for the rollback metrics); the core never retries an
answer hop itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from macaron_ray.core.conversation import ToolCall


@dataclass(frozen=True)
class EngineRequest:
    adapter: str
    """Engine-side adapter id (private)."""
    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float | None = None
    stop: list[str] | None = None
    choice: tuple[str, ...] | None = None
    """Constrain the output to exactly one of these strings (structured outputs)."""
    continue_final_message: bool = False
    """The last message is the assistant's reply begun: the output continues it (no new turn)."""
    seed: int | None = None
    repetition_penalty: float | None = None
    """vLLM's multiplicative penalty on tokens already in the prompt or output (None: the engine's 1.0)."""
    frequency_penalty: float | None = None
    cache_salt: str | None = None
    """Mixed into the engine's prefix-cache block hashes (vLLM `cache_salt`): requests of different
    salts never share cached blocks. The runner salts every hop with its tenant, so one tenant
    cannot learn from `cached_tokens` or from timing whether another sent a prompt."""
    priority: int = 0
    """Scheduling priority on an engine that schedules by priority (vLLM's `scheduling_policy:
    priority`; lower runs first): the route hop, which the user waits for, goes before answer
    prompts, and summaries after them. Engines without that policy never receive it."""


ROUTE_PRIORITY = -1
SUMMARY_PRIORITY = 1


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens served from the engine's prefix cache."""


@dataclass(frozen=True)
class EngineDelta:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = field(default=())
    """Complete calls; sent once, in the final delta."""
    finish_reason: str | None = None
    stop_sequence: str | None = None
    """The stop string that ended the output, if one did."""
    usage: Usage | None = None
    request_id: str | None = None
    """The engine's id of the request (final delta only): for traces and logs, never for clients."""


class EngineError(RuntimeError):
    """The engine failed. `retryable`: the same request may succeed later. `status`: the engine's
    HTTP status, where it answered one (400: it refused the request as given)."""

    def __init__(self, message: str, *, retryable: bool = True, status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class EngineUnavailable(EngineError):
    """No engine can take the request now (no running replica, connection refused, 503)."""


class EngineTimeout(EngineError):
    """The engine did not answer within its deadline."""


class EngineClient(Protocol):
    def stream(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:
        """Yield text deltas as they decode; the last delta carries finish_reason and usage."""
        ...
