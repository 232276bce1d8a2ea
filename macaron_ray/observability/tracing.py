"""Optional OpenTelemetry traces: one trace per turn, one span per hop.

    turn      surface, specialist, tool_result
    ├── route     the label chosen, engine.request_id
    ├── answer    engine.request_id, prompt and cached tokens
    ├── store     the commit (put_turn)
    └── summary   after delivery; engine.request_id (the turn span has ended by then)

With no OTLP endpoint configured the tracer is `NO_TRACING`: its spans are one
shared object whose methods do nothing, so tracing costs nothing. Spans are
started and ended explicitly with a parent, never through the "current span"
context variable: a turn is an async generator whose steps can run in other
contexts (the stream's consumer), where a context token could not be reset.
"""

from __future__ import annotations

from typing import Any, Protocol


class Span(Protocol):
    def set(self, key: str, value: Any) -> None:
        ...

    def error(self, exc: BaseException) -> None:
        """Mark the span failed (the exception's type only: messages may carry private names)."""
        ...

    def end(self) -> None:
        ...


class Tracer(Protocol):
    def start(self, name: str, parent: Span | None = None, **attributes: Any) -> Span:
        ...


class _NoSpan:
    def set(self, key: str, value: Any) -> None:
        pass

    def error(self, exc: BaseException) -> None:
        pass

    def end(self) -> None:
        pass


class _NoTracing:
    _span = _NoSpan()

    def start(self, name: str, parent: Span | None = None, **attributes: Any) -> Span:
        return self._span


NO_TRACING: Tracer = _NoTracing()


class _OTelSpan:
    def __init__(self, span):
        self.span = span

    def set(self, key: str, value: Any) -> None:
        if value is not None:
            self.span.set_attribute(key, value)

    def error(self, exc: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.set_status(Status(StatusCode.ERROR, type(exc).__name__))

    def end(self) -> None:
        self.span.end()


class OTelTracer:
    """Spans of an OpenTelemetry `TracerProvider` (its exporter decides where they go)."""

    def __init__(self, provider):
        self.provider = provider
        self._tracer = provider.get_tracer("macaron_ray")

    def start(self, name: str, parent: Span | None = None, **attributes: Any) -> Span:
        from opentelemetry import trace

        context = trace.set_span_in_context(parent.span) if isinstance(parent, _OTelSpan) else None
        return _OTelSpan(self._tracer.start_span(
            name, context=context, attributes={k: v for k, v in attributes.items() if v is not None}))

    def shutdown(self) -> None:
        self.provider.shutdown()


def otlp_tracer(endpoint: str | None, *, service_name: str = "macaron-ray") -> Tracer:
    """`NO_TRACING` without an endpoint; else spans batched to the OTLP/HTTP collector at `endpoint`
    (e.g. http://collector:4318/v1/traces)."""
    if not endpoint:
        return NO_TRACING
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return OTelTracer(tracer_provider(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)), service_name))


def tracer_provider(processor, service_name: str = "macaron-ray"):
    """A TracerProvider of its own (the process-wide one is left alone) with one span processor."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(processor)
    return provider
