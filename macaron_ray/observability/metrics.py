"""Every metric of the MoL proxy, defined once, with one interface and two exporters.

    MoLMetrics(RayExporter())         inside Ray Serve: `ray.serve.metrics`, exported by Ray's
                                      metrics agent on every node's metrics port (what KubeRay's
                                      PodMonitor scrapes), tagged with deployment and replica
    MoLMetrics(PrometheusExporter())  `macaron serve --standalone` and tests: prometheus-client,
                                      served at /metrics

Ray's agent prefixes every application metric with `ray_`, and that cannot be
turned off; the Prometheus exporter writes the same prefix, so both expose the
same names (`ray_macaron_turn_seconds`) and one set of dashboards and alert
rules reads either. Ray aggregates a histogram's observations per bucket in
each worker and reports the bucket's midpoint as the value, so under Ray a
histogram's `_sum` is approximate (its `_count` and buckets are exact).

Label values are closed sets (the canonical specialist labels, the surfaces, the
causes, ...): private adapter ids, base names and tenants can never become a
label value, and a value outside its set is a programming error (ValueError).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Protocol

EXPOSED_PREFIX = "ray_"
"""What both exporters put before each name (Ray's agent does it; the Prometheus exporter copies it)."""

LATENCY_BUCKETS_S = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5,
                     2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 20.0, 30.0, 60.0, 120.0)
"""Seconds: tens of milliseconds (GPU route hops) up to minutes (CPU answers under load)."""

SURFACES = ("chat", "responses", "messages")
REQUEST_SURFACES = (*SURFACES, "other")
"""`requests_total` also counts the paths of no surface (/v1/models, /health, unknown paths)."""
ROLLBACK_CAUSES = ("engine_error", "client_disconnect", "timeout", "unavailable", "store_error", "internal")
HOPS = ("route", "answer", "summary")
STORE_OPERATIONS = ("get_turn", "get_turns", "put_turn", "set_summary", "put_response", "get_response",
                    "delete_response")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx")
REJECT_REASONS = {
    "invalid_api_key": "unauthenticated", "rate_limit_exceeded": "rate_limited",
    "too_many_concurrent_requests": "too_many_concurrent", "overloaded": "overloaded",
    "request_too_large": "too_large", "too_many_messages": "too_many_messages",
    "context_length_exceeded": "context_length", "request_timeout": "body_timeout",
}
"""`rejected_requests_total`'s reason for each APIError code; any other 4xx is `invalid_request`."""

_SPECIALIST = re.compile(r"L[0-9]+")
_CLOSED_SETS: dict[str, tuple[str, ...]] = {
    "surface": REQUEST_SURFACES, "cause": ROLLBACK_CAUSES, "hop": HOPS, "operation": STORE_OPERATIONS,
    "status_class": STATUS_CLASSES, "reason": (*REJECT_REASONS.values(), "invalid_request"),
}

Kind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    """Name as defined (`macaron_*`); scraped as `EXPOSED_PREFIX + name`."""
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()

    @property
    def exposed(self) -> str:
        return EXPOSED_PREFIX + self.name

    def series_names(self) -> tuple[str, ...]:
        """The names Prometheus stores for this metric."""
        if self.kind == "histogram":
            return tuple(self.exposed + s for s in ("_bucket", "_sum", "_count"))
        return (self.exposed,)

    def check(self, labels: dict[str, str]) -> None:
        if tuple(sorted(labels)) != tuple(sorted(self.labels)):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {tuple(labels)}")
        for key, value in labels.items():
            allowed = _CLOSED_SETS.get(key)
            if key == "specialist" and not _SPECIALIST.fullmatch(value) or allowed and value not in allowed:
                raise ValueError(f"{self.name}: {key}={value!r} is not an allowed value")


_HOP = ("specialist", "surface")

ROUTE_HOP = MetricSpec("macaron_route_hop_seconds", "histogram",
                       "Route hop: L0 decodes the label of the new turn (the label it chose).", _HOP)
ANSWER_TTFT = MetricSpec("macaron_answer_ttft_seconds", "histogram",
                         "Answer hop: time to the specialist's first streamed delta.", _HOP)
ANSWER = MetricSpec("macaron_answer_seconds", "histogram", "Answer hop: the specialist's whole answer.", _HOP)
SUMMARY_HOP = MetricSpec("macaron_summary_hop_seconds", "histogram",
                         "Summary hop: L0 condenses a delivered turn (labelled by the turn's specialist).", _HOP)
SUMMARY_WAIT = MetricSpec("macaron_summary_wait_seconds", "histogram",
                          "Time a turn waited for earlier turns' summaries before its answer (0 when none).", _HOP)
TURN = MetricSpec("macaron_turn_seconds", "histogram",
                  "Whole turn as the user sees it: request to the last answer event, every hop included.", _HOP)
ROUTE_DECISIONS = MetricSpec("macaron_route_decisions_total", "counter",
                             "Route hops of user turns, by the label chosen.", ("specialist",))
ROUTER_NONCANONICAL = MetricSpec("macaron_router_noncanonical_total", "counter",
                                 "Router outputs that were not a canonical label (fell back to L0).")
STICKINESS_HITS = MetricSpec("macaron_stickiness_hits_total", "counter",
                             "Tool-result turns sent back to the calling specialist without a route hop.",
                             ("specialist",))
TURNS_COMMITTED = MetricSpec("macaron_turns_committed_total", "counter",
                             "Delivered turns written to the conversation store.", _HOP)
ROLLBACKS = MetricSpec("macaron_rollbacks_total", "counter",
                       "Turns rolled back (nothing written) before their answer was delivered, by cause.",
                       ("cause", "surface"))
SUMMARY_FAILURES = MetricSpec("macaron_summary_failures_total", "counter",
                              "Summary hops that failed every attempt (the turn stays delivered).")
OWNVIEW_CACHE_MISSES = MetricSpec("macaron_ownview_cache_misses_total", "counter",
                                  "Past turns whose own-view metadata was missing from the store and re-derived.")
STORE_ERRORS = MetricSpec("macaron_store_errors_total", "counter",
                          "Conversation store operations that raised.", ("operation",))
REQUESTS = MetricSpec("macaron_requests_total", "counter",
                      "HTTP requests answered, by surface and status class (streams count when they start).",
                      ("surface", "status_class"))
PROMPT_TOKENS = MetricSpec("macaron_prompt_tokens_total", "counter",
                           "Prompt tokens sent to the engines, by hop and the specialist it ran under.",
                           ("hop", "specialist"))
CACHED_PROMPT_TOKENS = MetricSpec("macaron_cached_prompt_tokens_total", "counter",
                                  "Prompt tokens the engines served from their prefix cache, by hop and specialist.",
                                  ("hop", "specialist"))
REJECTIONS = MetricSpec("macaron_rejected_requests_total", "counter",
                        "Requests refused with a 4xx or a 503 overloaded before any engine call, by surface and reason "
                        "(auth, rate, concurrency, back-pressure, size and context limits, invalid input).",
                        ("surface", "reason"))
TURNS_IN_FLIGHT = MetricSpec("macaron_turns_in_flight", "gauge", "Turns being run now.", ("surface",))
STREAMS_IN_FLIGHT = MetricSpec("macaron_streams_in_flight", "gauge", "Streamed responses open now.",
                               ("surface",))

ALL: tuple[MetricSpec, ...] = (
    ROUTE_HOP, ANSWER_TTFT, ANSWER, SUMMARY_HOP, SUMMARY_WAIT, TURN, ROUTE_DECISIONS, ROUTER_NONCANONICAL,
    STICKINESS_HITS, TURNS_COMMITTED, ROLLBACKS, SUMMARY_FAILURES, OWNVIEW_CACHE_MISSES, STORE_ERRORS, REQUESTS,
    PROMPT_TOKENS, CACHED_PROMPT_TOKENS, REJECTIONS, TURNS_IN_FLIGHT, STREAMS_IN_FLIGHT,
)


class Instrument(Protocol):
    def record(self, value: float, labels: dict[str, str]) -> None:
        """Counter: add `value` (> 0). Histogram: observe it. Gauge: add it (may be negative)."""
        ...


class Exporter(Protocol):
    def instrument(self, spec: MetricSpec) -> Instrument:
        ...


class Metric:
    """One metric of `MoLMetrics`: checks label values, then hands the value to the exporter."""

    def __init__(self, spec: MetricSpec, instrument: Instrument):
        self.spec = spec
        self._instrument = instrument

    def inc(self, value: float = 1.0, **labels: str) -> None:
        self.spec.check(labels)
        if value > 0:  # Ray's counters refuse 0; a zero increment changes nothing anyway
            self._instrument.record(float(value), labels)

    def observe(self, value: float, **labels: str) -> None:
        self.spec.check(labels)
        self._instrument.record(float(value), labels)

    def add(self, delta: float, **labels: str) -> None:
        self.spec.check(labels)
        self._instrument.record(float(delta), labels)


class MoLMetrics:
    """The proxy's metrics, one attribute per `MetricSpec`. Built once per process (per replica)."""

    def __init__(self, exporter: Exporter | None = None):
        self.exporter = exporter if exporter is not None else PrometheusExporter()

        def make(spec: MetricSpec) -> Metric:
            return Metric(spec, self.exporter.instrument(spec))

        self.route_hop = make(ROUTE_HOP)
        self.answer_ttft = make(ANSWER_TTFT)
        self.answer = make(ANSWER)
        self.summary_hop = make(SUMMARY_HOP)
        self.summary_wait = make(SUMMARY_WAIT)
        self.turn = make(TURN)
        self.route_decisions = make(ROUTE_DECISIONS)
        self.router_noncanonical = make(ROUTER_NONCANONICAL)
        self.stickiness_hits = make(STICKINESS_HITS)
        self.turns_committed = make(TURNS_COMMITTED)
        self.rollbacks = make(ROLLBACKS)
        self.summary_failures = make(SUMMARY_FAILURES)
        self.ownview_cache_misses = make(OWNVIEW_CACHE_MISSES)
        self.store_errors = make(STORE_ERRORS)
        self.requests = make(REQUESTS)
        self.prompt_tokens = make(PROMPT_TOKENS)
        self.cached_prompt_tokens = make(CACHED_PROMPT_TOKENS)
        self.rejections = make(REJECTIONS)
        self.turns_in_flight = make(TURNS_IN_FLIGHT)
        self.streams_in_flight = make(STREAMS_IN_FLIGHT)

    def tokens(self, hop: str, specialist: str, usage) -> None:
        """Prompt and cached prompt tokens of one engine call (`usage`: core `Usage` or None)."""
        if usage is not None:
            self.prompt_tokens.inc(usage.prompt_tokens, hop=hop, specialist=specialist)
            self.cached_prompt_tokens.inc(usage.cached_tokens, hop=hop, specialist=specialist)


# -- exporters -------------------------------------------------------------------------------


class PrometheusExporter:
    """prometheus-client instruments in `registry` (default: a registry of its own, so two
    runners in one process, as in tests, never share a series)."""

    def __init__(self, registry=None):
        from prometheus_client import CollectorRegistry

        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)

    def instrument(self, spec: MetricSpec) -> Instrument:
        import prometheus_client as pc

        kwargs = dict(name=spec.exposed, documentation=spec.help, labelnames=spec.labels, registry=self.registry)
        if spec.kind == "counter":
            return _PromInstrument(pc.Counter(**kwargs), "inc")
        if spec.kind == "histogram":
            return _PromInstrument(pc.Histogram(**kwargs, buckets=LATENCY_BUCKETS_S), "observe")
        return _PromInstrument(pc.Gauge(**kwargs), "inc")

    def value(self, spec: MetricSpec, suffix: str = "", **labels: str) -> float:
        """The current value of one series (0 when it has no sample yet); for tests and benchmarks.
        `suffix`: `_count`, `_sum` or `_bucket` of a histogram (counters' names end in `_total`)."""
        return self.registry.get_sample_value(spec.exposed + suffix, labels) or 0.0


class _PromInstrument:
    def __init__(self, metric, method: str):
        self._metric, self._method = metric, method

    def record(self, value: float, labels: dict[str, str]) -> None:
        target = self._metric.labels(**labels) if labels else self._metric
        getattr(target, self._method)(value)


class RayExporter:
    """`ray.serve.metrics` instruments: Ray tags each sample with its application, deployment and
    replica, and the node's metrics agent exports it. Only usable inside a Serve replica."""

    def instrument(self, spec: MetricSpec) -> Instrument:
        from ray.serve import metrics as serve_metrics

        tag_keys = spec.labels or None
        if spec.kind == "counter":
            return _RayInstrument(serve_metrics.Counter(spec.name, description=spec.help, tag_keys=tag_keys), "inc")
        if spec.kind == "histogram":
            return _RayInstrument(serve_metrics.Histogram(spec.name, description=spec.help,
                                                          boundaries=list(LATENCY_BUCKETS_S), tag_keys=tag_keys),
                                  "observe")
        return _RayGauge(serve_metrics.Gauge(spec.name, description=spec.help, tag_keys=tag_keys))


class _RayInstrument:
    def __init__(self, metric, method: str):
        self._metric, self._method = metric, method

    def record(self, value: float, labels: dict[str, str]) -> None:
        getattr(self._metric, self._method)(value, tags=labels or None)


class _RayGauge:
    """Ray's gauges only `set`; the up/down value of each label set is kept here."""

    def __init__(self, metric):
        self._metric = metric
        self._values: dict[tuple, float] = {}

    def record(self, value: float, labels: dict[str, str]) -> None:
        # Called from the replica's event loop only: read, add and set need no lock.
        key = tuple(sorted(labels.items()))
        self._values[key] = self._values.get(key, 0.0) + value
        self._metric.set(self._values[key], tags=labels or None)
