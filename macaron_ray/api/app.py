"""The FastAPI application: three surfaces over one TurnRunner.

`build_api(surfaces)` is mounted by the Ray Serve ingress and also runs
standalone (uvicorn) against any EngineClient. Errors are rendered in the
envelope of the surface whose path was called. Every response is counted by
surface and status class; standalone, `/metrics` serves the Prometheus
exposition (under Ray, Ray's metrics agent exports the same names).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from macaron_ray.api import chat_completions, messages, responses
from macaron_ray.api.errors import APIError, count_rejection, error_response, internal_error, surface_of
from macaron_ray.api.gate import Gate
from macaron_ray.api.surface import Surfaces
from macaron_ray.observability.metrics import MoLMetrics, PrometheusExporter

logger = logging.getLogger(__name__)


class RequestMetrics:
    """ASGI middleware: counts each response by surface and status class when its head is sent
    (a stream counts as it starts); an exception that escapes the app counts as a 5xx."""

    def __init__(self, app, metrics: MoLMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        surface = surface_of(scope["path"])
        started = False

        async def counting_send(message):
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self.metrics.requests.inc(surface=surface, status_class=f"{message['status'] // 100}xx")
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:
                self.metrics.requests.inc(surface=surface, status_class="5xx")
            raise


def _error_response(request: Request, err: APIError) -> JSONResponse:
    return error_response(request.url.path, err)


def build_api(s: Surfaces, lifespan=None, *, metrics_endpoint: bool = False) -> FastAPI:
    """The app; `lifespan` (an async context manager factory) owns what the caller must close.
    `metrics_endpoint`: serve the runner's Prometheus registry at /metrics (standalone)."""
    app = FastAPI(title="macaron-ray", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    # The gate (auth, limits) runs before any route reads a body; the request counter sees its refusals.
    app.add_middleware(Gate, keys=s.keys, limits=s.limits, metrics=s.metrics, body_limit_bytes=s.body_limit_bytes)
    app.add_middleware(RequestMetrics, metrics=s.metrics)
    if metrics_endpoint:
        exporter = s.metrics.exporter
        if not isinstance(exporter, PrometheusExporter):
            raise ValueError("/metrics serves a PrometheusExporter's registry")
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        @app.get("/metrics")
        async def metrics():
            return Response(generate_latest(exporter.registry), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        count_rejection(s.metrics, request.url.path, exc)
        return _error_response(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        message = {404: f"no route for {request.method} {request.url.path}",
                   405: f"method {request.method} is not allowed on {request.url.path}"}.get(exc.status_code, "error")
        err = APIError(exc.status_code, message)
        count_rejection(s.metrics, request.url.path, err)
        return _error_response(request, err)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        logger.exception("unhandled error", exc_info=exc)
        return _error_response(request, internal_error())

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models(request: Request):
        s.tenant(request)
        return {"object": "list", "data": [_model(s)]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(request: Request, model_id: str):
        s.tenant(request)
        s.check_model(model_id)
        return _model(s)

    @app.post("/v1/chat/completions")
    async def _chat(request: Request):
        return await chat_completions.chat_completions(request, s)

    @app.post("/v1/responses")
    async def _create_response(request: Request):
        return await responses.create_response(request, s)

    @app.get("/v1/responses/{response_id}")
    async def _get_response(request: Request, response_id: str):
        return await responses.get_response(request, s, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def _delete_response(request: Request, response_id: str):
        return await responses.delete_response(request, s, response_id)

    @app.get("/v1/responses/{response_id}/input_items")
    async def _input_items(request: Request, response_id: str):
        return await responses.input_items(request, s, response_id)

    @app.post("/v1/messages")
    async def _messages(request: Request):
        return await messages.create_message(request, s)

    @app.post("/v1/messages/count_tokens")
    async def _count_tokens(request: Request):
        return await messages.count_tokens(request, s)

    return app


def _model(s: Surfaces) -> dict:
    return {"id": s.public_model, "object": "model", "created": 0, "owned_by": "macaron"}
