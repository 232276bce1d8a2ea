"""The MoL application without Ray: the API app over one OpenAI-compatible engine server.

`macaron serve` runs this in front of a local vLLM engine; the Ray Serve
topology mounts the same `build_api` with handle-based engine clients.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from macaron_ray.api.app import build_api
from macaron_ray.api.gate import Limits
from macaron_ray.api.keys import KeyRing
from macaron_ray.api.surface import Surfaces
from macaron_ray.api.tokens import TemplateTokenCounter
from macaron_ray.core.deadlines import Deadlines
from macaron_ray.core.registry import DEFAULT_PUBLIC_MODEL, SpecialistRegistry
from macaron_ray.core.turn_runner import TurnRunner
from macaron_ray.engine.local_server import TOOL_CALL_PARSER
from macaron_ray.engine.openai_http import OpenAIHTTPEngine
from macaron_ray.observability.metrics import MoLMetrics, PrometheusExporter
from macaron_ray.observability.tracing import OTelTracer, otlp_tracer
from macaron_ray.store.sqlite import SQLiteStore

STORE_TTL_S = 30 * 24 * 3600
"""Turn metadata, summaries and stored responses expire after 30 days (as profiles' `store.ttl_s`)."""


def build_standalone_app(engine_url: str, model_dir: Path, store_path: Path, *,
                         public_model: str = DEFAULT_PUBLIC_MODEL, keys: KeyRing | None = None,
                         limits: Limits = Limits(), deadlines: Deadlines = Deadlines(),
                         debug_headers: bool = False, otlp_endpoint: str | None = None,
                         context_tokens: int | None = None, store_ttl_s: float | None = STORE_TTL_S) -> FastAPI:
    """The API over one engine server; its metrics (prometheus-client, the names Ray exports) at /metrics.
    `context_tokens`: the engine's `max_model_len` (requests that cannot fit get a 400 first)."""
    engine = OpenAIHTTPEngine(engine_url, tool_call_parser=TOOL_CALL_PARSER)
    store = SQLiteStore(store_path, ttl_s=store_ttl_s)
    tracer = otlp_tracer(otlp_endpoint)
    runner = TurnRunner(SpecialistRegistry.from_manifest(public_model), engine, store,
                        metrics=MoLMetrics(PrometheusExporter()), tracer=tracer, deadlines=deadlines)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await runner.drain()
        await engine.aclose()
        await store.close()
        if isinstance(tracer, OTelTracer):
            tracer.shutdown()  # flushes the last spans

    surfaces = Surfaces(runner=runner, tokens=TemplateTokenCounter.embedded(model_dir), keys=keys, limits=limits,
                        debug_headers=debug_headers, context_tokens=context_tokens)
    return build_api(surfaces, lifespan, metrics_endpoint=True)
