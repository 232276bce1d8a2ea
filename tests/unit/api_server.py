"""Runs the API app on a loopback port in a background thread, for tests that drive it with real SDKs."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from macaron_ray.api.app import build_api
from macaron_ray.api.gate import Limits
from macaron_ray.api.keys import KeyRing
from macaron_ray.api.surface import Surfaces, TokenCounter
from macaron_ray.core.deadlines import Deadlines
from macaron_ray.core.engine_client import EngineClient
from macaron_ray.core.registry import Specialist, SpecialistRegistry
from macaron_ray.core.turn_runner import TurnRunner
from macaron_ray.observability.tracing import NO_TRACING, Tracer
from macaron_ray.store.sqlite import SQLiteStore

PUBLIC_MODEL = "Macaron-V1-Venti"
SECRET_ADAPTERS = {f"L{i}": f"secret-adapter-{i}" for i in range(4)}


def secret_registry() -> SpecialistRegistry:
    return SpecialistRegistry(public_model=PUBLIC_MODEL, specialists=tuple(
        Specialist(label=label, adapter_id=adapter, description=f"role {label}")
        for label, adapter in SECRET_ADAPTERS.items()))


@dataclass
class RunningAPI:
    base_url: str
    runner: TurnRunner
    store: SQLiteStore
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def start_api(engine: EngineClient, tokens: TokenCounter, db: Path, *, keys: KeyRing | None = None,
              limits: Limits = Limits(), deadlines: Deadlines | None = Deadlines(),
              body_limit_bytes: int | None = None, registry: SpecialistRegistry | None = None,
              debug_headers: bool = False, tracer: Tracer = NO_TRACING,
              context_tokens: int | None = None, max_messages: int | None = None) -> RunningAPI:
    """The API over `engine`, with its metrics (a Prometheus registry of its own) at /metrics."""
    store = SQLiteStore(db)
    runner = TurnRunner(registry or secret_registry(), engine, store, summary_retry_delay_s=0.0, tracer=tracer,
                        deadlines=deadlines)
    surfaces = Surfaces(runner=runner, tokens=tokens, keys=keys, limits=limits, debug_headers=debug_headers,
                        context_tokens=context_tokens)
    if body_limit_bytes is not None:
        surfaces.body_limit_bytes = body_limit_bytes
    if max_messages is not None:
        surfaces.max_messages = max_messages
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_api(surfaces, metrics_endpoint=True), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("API server did not start")
        time.sleep(0.02)
    return RunningAPI(f"http://127.0.0.1:{port}", runner, store, server, thread)
