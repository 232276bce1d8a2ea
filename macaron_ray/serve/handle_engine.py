"""EngineClient over a Ray Serve LLM deployment handle.

The handle points at an `LLMServer` (router, aggregated answer engine) or a
`PDDecodeServer` (which runs the remote prefill itself). The request is the
same OpenAI chat body the HTTP client sends, as Ray Serve LLM's
`ChatCompletionRequest`; the streamed chunks are the same SSE lines, so both
clients share `StreamAccumulator`.

`ReplicaWatch` follows Serve's view of each deployment: while a deployment has
no running replica, `stream` fails at once with a retryable EngineUnavailable (the
API answers 503 with Retry-After) instead of queueing behind a restart. A replica whose
vLLM engine process died answers every call with vLLM's `EngineDeadError` until Serve's
health check replaces it: that is the same restart, seen from inside the replica, and
fails as EngineUnavailable too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from macaron_ray.core.engine_client import EngineDelta, EngineError, EngineRequest, EngineUnavailable
from macaron_ray.engine.openai_http import StreamAccumulator, forced_call, request_body, text_tool_calls

logger = logging.getLogger(__name__)


class ReplicaWatch:
    """Running-replica counts of this application's deployments, refreshed in the background.

    `read` returns {deployment: running replicas}; by default it asks Serve.
    """

    def __init__(self, app_name: str, *, interval_s: float = 0.5, read=None):
        self.app_name = app_name
        self.interval_s = interval_s
        self._read = read or self._read_serve_status
        self._running: dict[str, int] = {}
        self._updated = 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def available(self, deployment: str) -> bool:
        """False only when Serve reported, recently, that the deployment has no running replica."""
        if time.monotonic() - self._updated > 10 * self.interval_s:
            return True  # no fresh view: let the request try
        return self._running.get(deployment, 1) > 0

    async def first_unavailable(self, deployments: tuple[str, ...]) -> str | None:
        """The first of `deployments` without a running replica, or None.

        A "none running" in the cached view is read again before it fails a request:
        the view can be one poll older than a replica that has just started.
        """
        if all(self.available(d) for d in deployments):
            return None
        await self.refresh()
        return next((d for d in deployments if not self.available(d)), None)

    async def refresh(self) -> None:
        try:
            running = await self._read()
        except Exception as exc:  # the controller restarting must not kill the ingress
            logger.warning("could not read Serve status: %s", exc)
            return
        if running is not None:
            self._running, self._updated = running, time.monotonic()

    async def _read_serve_status(self) -> dict[str, int] | None:
        """The controller's instance details, read as the plain dict it sends. `serve.status()`
        builds the same details into pydantic models first, pickling each deployment's request
        router on the way: about 90 ms of the ingress's CPU per call, 18 % of its samples under
        load at two polls a second (py-spy, `macaron bench ingress`, 2026-12-04)."""
        from ray.serve.context import _get_global_client

        client = _get_global_client(raise_if_no_controller_running=False)
        if client is None:
            return None
        details = await asyncio.to_thread(client.get_serve_details)
        app = (details.get("applications") or {}).get(self.app_name)
        if app is None:
            return None
        return {name: sum(r.get("state") == "RUNNING" for r in d.get("replicas") or ())
                for name, d in (app.get("deployments") or {}).items()}

    async def _poll(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval_s)


def sse_payloads(item) -> list[str]:
    """The `data:` payloads of one item of an LLM deployment's chat stream.

    Streams yield SSE strings (or lists of them, when Serve batched several);
    a non-streaming call yields the response object itself.
    """
    if isinstance(item, list):
        return [line for part in item for line in sse_payloads(part)]
    if isinstance(item, str):
        return [line[6:] for line in item.splitlines() if line.startswith("data: ")]
    error = getattr(item, "error", None)
    if error is not None and type(item).__name__ == "ErrorResponse":
        code = getattr(error, "code", None) or 500
        raise EngineError(f"engine answered {code}: {getattr(error, 'message', '')[:300]}",
                          retryable=code >= 500 or code == 429, status=code)
    if hasattr(item, "model_dump_json"):
        return [item.model_dump_json()]
    raise EngineError(f"unexpected engine chunk type {type(item).__name__}", retryable=False)


class ServeHandleEngine:
    def __init__(self, handle, *, watch: ReplicaWatch | None = None, also_needs: tuple[str, ...] = (),
                 priority: bool = False, tool_call_parser: str | None = None, method: str = "chat"):
        """`also_needs`: deployments the handle's own calls go through (the decode server calls
        prefill); while any of them has no running replica, requests fail at once too.
        `priority`: the engine schedules by priority; requests carry theirs.
        `tool_call_parser`: the engine's; see `OpenAIHTTPEngine`.
        `method`: the deployment's chat method (`chat_local`: the decode engine alone)."""
        self._method = method
        self._priority = priority
        self._tool_call_parser = tool_call_parser
        self._handle = handle.options(stream=True)
        self._deployment = handle.deployment_name
        self._needs = (handle.deployment_name, *also_needs)
        self._watch = watch

    async def stream(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:
        from ray.exceptions import RayActorError, RayTaskError  # ActorDiedError, ActorUnavailableError
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
        from ray.serve.llm.openai_api_models import ChatCompletionRequest

        if self._watch is not None and (missing := await self._watch.first_unavailable(self._needs)):
            raise EngineUnavailable(f"{missing} has no running replica")
        text_calls = text_tool_calls(request, self._tool_call_parser)
        try:
            body = ChatCompletionRequest(**request_body(request, priority=self._priority, text_calls=text_calls))
        except Exception as exc:  # vLLM's own validators (VLLMValidationError, pydantic's): the request as given
            raise EngineError(f"the engine's request model refused the request: {type(exc).__name__}",
                              retryable=False, status=400) from exc
        acc = StreamAccumulator(text_calls=text_calls, forced=forced_call(request))
        answer = getattr(self._handle, self._method).remote(body)
        finished = False
        try:
            async for item in answer:
                for data in sse_payloads(item):
                    if data == "[DONE]":
                        continue
                    delta = acc.feed(json.loads(data))
                    if delta is not None:
                        yield delta
            finished = True
        except (RayActorError, DeploymentUnavailableError, BackPressureError) as exc:
            raise EngineUnavailable(f"{self._deployment} unavailable: {type(exc).__name__}") from exc
        except RayTaskError as exc:
            if not engine_dead(exc):
                raise
            raise EngineUnavailable(f"{self._deployment}: its engine died and is being replaced") from exc
        finally:
            if not finished:
                # Abandoned (a disconnect, a deadline, an error): cancel the replica's generator, which
                # aborts the engine request. Dropping the handle's generator alone leaves it decoding.
                answer.cancel()
        yield acc.final()


def engine_dead(exc: BaseException) -> bool:
    """Whether `exc` is, or wraps, vLLM's EngineDeadError (by name: vLLM is not imported here).
    Ray wraps a replica's exception in RayTaskError (`.cause`), once per hop: the decode server's
    call to the prefill server adds one more."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(t.__name__ == "EngineDeadError" for t in type(exc).__mro__):
            return True
        cause = getattr(exc, "cause", None)
        exc = cause if isinstance(cause, BaseException) else exc.__cause__
    return False
