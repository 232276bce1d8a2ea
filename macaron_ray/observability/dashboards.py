"""Grafana dashboards as code: typed panel specs, rendered with grafana-foundation-sdk.

    mol-overview   the MoL proxy: turn and hop latency, routing overhead, route mix,
                   rollbacks, stickiness, own-view prefix reuse, summary wait
    mol-engines    the vLLM engines (through Ray): TTFT, inter-token latency, queue,
                   KV-cache usage, prefix-cache hit rate, LoRA adapters, NIXL transfers
    mol-serve      Ray Serve: healthy replicas, queued and ongoing requests, errors

`macaron dashboards generate` writes `dashboards/<uid>.json` (a test fails when
the committed files differ from what this module renders); `macaron dashboards
push` uploads them with grafana-client. Every query names the exposed metric
(see `metrics.EXPOSED_PREFIX`), so the same dashboards read Ray's metrics agent
and the standalone `/metrics`; the engine and Serve dashboards need Ray.

vLLM's metrics carry the Serve replica (`ReplicaId`), not the deployment: the
per-deployment panels join them to `ray_serve_deployment_replica_healthy`,
whose `replica` label is the same id (`by_deployment`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from macaron_ray.observability import metrics as M

RATE = "$__rate_interval"
"""Grafana's rate window (at least four scrape intervals)."""
DATASOURCE_VARIABLE = "datasource"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    rare: bool = False
    """Counts events a healthy deployment may never have (a rollback, a failed transfer): the panel
    shows 0 instead of "no data" (`or vector(0)`), and the Prometheus test does not require a series."""

    @property
    def promql(self) -> str:
        return f"({self.expr}) or vector(0)" if self.rare else self.expr


@dataclass(frozen=True)
class PanelSpec:
    title: str
    question: str
    """What the panel answers (its description in Grafana and its row in the README's table)."""
    queries: tuple[Query, ...]
    unit: str = "s"
    kind: Literal["timeseries", "table"] = "timeseries"
    width: int = 12


@dataclass(frozen=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    rows: tuple[tuple[str, tuple[PanelSpec, ...]], ...]
    tags: tuple[str, ...] = field(default=("macaron",))

    def panels(self) -> list[PanelSpec]:
        return [p for _, panels in self.rows for p in panels]


# -- PromQL helpers ---------------------------------------------------------------------------


def _rate(metric: str, selector: str = "") -> str:
    return f"rate({metric}{selector}[{RATE}])"


def quantile(q: float, spec: M.MetricSpec, by: str = "") -> str:
    """The q-quantile of a MoL histogram over all replicas, optionally per label."""
    labels = ", ".join(("le", *filter(None, [by])))
    return f"histogram_quantile({q}, sum by ({labels}) ({_rate(spec.exposed + '_bucket')}))"


def mean(spec: M.MetricSpec, by: str = "") -> str:
    group = f" by ({by})" if by else ""
    return (f"sum{group} ({_rate(spec.exposed + '_sum')}) / sum{group} ({_rate(spec.exposed + '_count')})")


def mean_sum(spec: M.MetricSpec) -> str:
    """Seconds per second spent in a histogram's observations (the numerator of a time share)."""
    return f"sum ({_rate(spec.exposed + '_sum')})"


def last_reported(metric: str) -> str:
    """A gauge's last value within the window. Ray's metrics agent drops a gauge not recorded for
    two export intervals, and vLLM records its gauges only when its engine steps (the ingress its
    own when they change): an idle engine's gauges vanished ~20 s after its last request
    (measured 2026-12-04)."""
    return f"last_over_time({metric}[{RATE}])"


def total_rate(spec: M.MetricSpec, by: str = "", selector: str = "") -> str:
    group = f" by ({by})" if by else ""
    return f"sum{group} ({_rate(spec.exposed, selector)})"


REPLICA_DEPLOYMENT = ('group by (ReplicaId, deployment) (label_replace(ray_serve_deployment_replica_healthy, '
                      '"ReplicaId", "$1", "replica", "(.+)"))')
"""One series per Serve replica id, carrying its deployment: the join key for vLLM's metrics."""


def by_deployment(expr: str, by: str = "", agg: str = "sum") -> str:
    """`expr` (series with vLLM's `ReplicaId` label) aggregated per Serve deployment."""
    labels = ", ".join(("deployment", *filter(None, [by])))
    return f"{agg} by ({labels}) ({expr} * on (ReplicaId) group_left (deployment) {REPLICA_DEPLOYMENT})"


def engine_quantile(q: float, metric: str) -> str:
    return f"histogram_quantile({q}, {by_deployment(_rate(metric + '_bucket'), 'le')})"


# -- the dashboards ---------------------------------------------------------------------------

ANSWER_HOP = '{hop="answer"}'
HOPS = (("route", M.ROUTE_HOP), ("answer TTFT", M.ANSWER_TTFT), ("answer", M.ANSWER),
        ("summary", M.SUMMARY_HOP), ("summary wait", M.SUMMARY_WAIT))


def mol_overview() -> DashboardSpec:
    latency = (
        PanelSpec("Turn latency (user-visible)", "How long does a turn take, end to end, at p50 / p95 / p99?",
                  tuple(Query(quantile(q, M.TURN), f"p{int(q * 100)}") for q in (0.5, 0.95, 0.99))),
        PanelSpec("Hop latency p95", "Which hop dominates a turn: route, answer (first token, whole), summary?",
                  tuple(Query(quantile(0.95, spec), name) for name, spec in HOPS)),
        PanelSpec("Answer latency p95 by specialist", "Is one specialist slower than the others?",
                  (Query(quantile(0.95, M.ANSWER, "specialist"), "{{specialist}}"),
                   Query(quantile(0.95, M.ANSWER_TTFT, "specialist"), "TTFT {{specialist}}"))),
        PanelSpec("Turn latency p95 by surface", "Does one API surface (chat, responses, messages) add latency?",
                  (Query(quantile(0.95, M.TURN, "surface"), "{{surface}}"),)),
    )
    routing = (
        PanelSpec("Routing overhead share of the turn",
                  "What share of the user-visible turn is routing: the route hop plus any wait for a pending "
                  "summary (mean over the window)?",
                  (Query(f"({mean_sum(M.ROUTE_HOP)} + {mean_sum(M.SUMMARY_WAIT)}) / {mean_sum(M.TURN)}",
                         "route + summary wait"),
                   Query(f"{mean_sum(M.ROUTE_HOP)} / {mean_sum(M.TURN)}", "route")),
                  unit="percentunit"),
        PanelSpec("Route mix", "Which specialists do users' turns go to?",
                  (Query(f"{total_rate(M.ROUTE_DECISIONS, 'specialist')} / ignoring (specialist) group_left "
                         f"{total_rate(M.ROUTE_DECISIONS)}", "{{specialist}}"),),
                  unit="percentunit"),
        PanelSpec("Router non-canonical outputs", "Does the router ever decode something that is not a label?",
                  (Query(total_rate(M.ROUTER_NONCANONICAL), "non-canonical / s", rare=True),), unit="ops"),
        PanelSpec("Tool-result stickiness", "How many turns skip routing because they carry tool results?",
                  (Query(total_rate(M.STICKINESS_HITS, "specialist"), "{{specialist}}", rare=True),), unit="ops"),
    )
    reliability = (
        PanelSpec("Rollbacks by cause", "Why are turns rolled back (engine error, disconnect, timeout, ...)?",
                  (Query(total_rate(M.ROLLBACKS, "cause"), "{{cause}}", rare=True),), unit="ops"),
        PanelSpec("Refused requests by reason", "What is refused before any engine call: auth, rate or "
                  "concurrency limits, back-pressure (overloaded), size or context limits, invalid input?",
                  (Query(total_rate(M.REJECTIONS, "reason"), "{{reason}}", rare=True),), unit="ops"),
        PanelSpec("Requests and committed turns", "How much traffic, by status class, and how many turns commit?",
                  (Query(total_rate(M.REQUESTS, "surface, status_class"), "{{surface}} {{status_class}}"),
                   Query(total_rate(M.TURNS_COMMITTED), "turns committed")), unit="reqps"),
        PanelSpec("Summary failures, store errors, own-view cache misses",
                  "Is the conversation state healthy?",
                  (Query(total_rate(M.SUMMARY_FAILURES), "summary failures", rare=True),
                   Query(total_rate(M.STORE_ERRORS, "operation"), "store {{operation}}", rare=True),
                   Query(total_rate(M.OWNVIEW_CACHE_MISSES), "own-view cache misses", rare=True)), unit="ops"),
        PanelSpec("In flight", "How many turns and streams are open now?",
                  (Query(f"sum ({last_reported(M.TURNS_IN_FLIGHT.exposed)})", "turns"),
                   Query(f"sum by (surface) ({last_reported(M.STREAMS_IN_FLIGHT.exposed)})", "streams {{surface}}")),
                  unit="short"),
    )
    reuse = (
        PanelSpec("Own-view prefix reuse", "What share of each hop's prompt comes from the engines' prefix cache?",
                  (Query(f"{total_rate(M.CACHED_PROMPT_TOKENS, 'specialist', ANSWER_HOP)} / "
                         f"{total_rate(M.PROMPT_TOKENS, 'specialist', ANSWER_HOP)}", "answer {{specialist}}"),
                   Query(f"{total_rate(M.CACHED_PROMPT_TOKENS, 'hop')} / {total_rate(M.PROMPT_TOKENS, 'hop')}",
                         "{{hop}} (all specialists)")),
                  unit="percentunit"),
        PanelSpec("Summary wait", "How long do turns wait for an earlier turn's summary?",
                  (Query(quantile(0.95, M.SUMMARY_WAIT), "p95"), Query(mean(M.SUMMARY_WAIT), "mean"),
                   Query(quantile(0.95, M.SUMMARY_HOP), "summary hop p95")), unit="s"),
    )
    return DashboardSpec(
        uid="mol-overview", title="macaron-ray / MoL overview",
        description="The Mixture-of-LoRA proxy: every hop of every turn (ray_macaron_* metrics).",
        rows=(("Latency", latency), ("Routing", routing), ("Reliability", reliability),
              ("Own-view and summaries", reuse)))


def engines() -> DashboardSpec:
    latency = (
        PanelSpec("Engine TTFT p95 by deployment", "How fast does each engine deployment start answering?",
                  (Query(engine_quantile(0.95, "ray_vllm_time_to_first_token_seconds"), "{{deployment}}"),)),
        PanelSpec("Inter-token latency p95 by deployment", "How fast does each engine decode?",
                  (Query(engine_quantile(0.95, "ray_vllm_inter_token_latency_seconds"), "{{deployment}}"),)),
        PanelSpec("Requests running and waiting", "Is any engine queueing?",
                  (Query(by_deployment(last_reported("ray_vllm_num_requests_running")), "running {{deployment}}"),
                   Query(by_deployment(last_reported("ray_vllm_num_requests_waiting")), "waiting {{deployment}}")),
                  unit="short"),
        PanelSpec("KV-cache usage", "How full is each engine's KV cache?",
                  (Query(by_deployment(last_reported("ray_vllm_kv_cache_usage_perc"), agg="max"), "{{deployment}}"),),
                  unit="percentunit"),
    )
    cache = (
        PanelSpec("Prefix-cache hit rate", "What share of prompt tokens does each engine find in its prefix cache?",
                  (Query(f"{by_deployment(_rate('ray_vllm_prefix_cache_hits_total'))} / "
                         f"{by_deployment(_rate('ray_vllm_prefix_cache_queries_total'))}", "{{deployment}}"),),
                  unit="percentunit"),
        PanelSpec("LoRA adapters", "How many adapters can each engine hold, and which are running?",
                  (Query(by_deployment(last_reported("ray_vllm_lora_requests_info"), "max_lora, running_lora_adapters",
                                       agg="count"), "{{deployment}} max {{max_lora}}"),),
                  unit="short", kind="table"),
    )
    nixl = (
        PanelSpec("NIXL KV transfer time p95", "How long does a KV hand-over from prefill to decode take?",
                  (Query("histogram_quantile(0.95, sum by (le) "
                         f"({_rate('ray_vllm_nixl_xfer_time_seconds_bucket')}))", "p95"),
                   Query(f"sum ({_rate('ray_vllm_nixl_xfer_time_seconds_sum')}) / "
                         f"sum ({_rate('ray_vllm_nixl_xfer_time_seconds_count')})", "mean"))),
        PanelSpec("NIXL bytes per transfer and transfers", "How much KV moves per request, and how often?",
                  (Query(f"sum ({_rate('ray_vllm_nixl_bytes_transferred_sum')}) / "
                         f"sum ({_rate('ray_vllm_nixl_bytes_transferred_count')})", "bytes per transfer"),),
                  unit="bytes"),
        PanelSpec("NIXL failed transfers", "Do KV hand-overs fail?",
                  (Query(f"sum ({_rate('ray_vllm_nixl_num_failed_transfers_total')})", "failed / s", rare=True),),
                  unit="ops"),
    )
    return DashboardSpec(
        uid="mol-engines", title="macaron-ray / engines",
        description="The vLLM engines of the topology, through Ray Serve LLM (ray_vllm_* metrics).",
        rows=(("Latency and load", latency), ("Prefix cache and adapters", cache), ("KV transfer (NIXL)", nixl)))


def serve() -> DashboardSpec:
    panels = (
        PanelSpec("Healthy replicas per deployment", "Does every deployment have its replicas up?",
                  (Query("sum by (application, deployment) (ray_serve_deployment_replica_healthy)",
                         "{{deployment}}"),), unit="short"),
        PanelSpec("Queued requests per deployment", "Are requests waiting at the handles for a replica?",
                  (Query("sum by (deployment) (ray_serve_deployment_queued_queries)", "{{deployment}}"),),
                  unit="short"),
        PanelSpec("Ongoing requests per deployment", "How busy is each deployment's replicas?",
                  (Query("sum by (deployment) (ray_serve_replica_processing_queries)", "{{deployment}}"),),
                  unit="short"),
        PanelSpec("Request rate per deployment", "How many calls reach each deployment?",
                  (Query(f"sum by (deployment) ({_rate('ray_serve_deployment_request_counter_total')})",
                         "{{deployment}}"),), unit="reqps"),
        PanelSpec("Errors per deployment", "Which deployment raises exceptions?",
                  (Query(f"sum by (deployment, exception_type) "
                         f"({_rate('ray_serve_deployment_error_counter_total')})",
                         "{{deployment}} {{exception_type}}", rare=True),), unit="ops"),
        PanelSpec("Processing latency p95 per deployment", "How long does each deployment take per call?",
                  (Query("histogram_quantile(0.95, sum by (le, deployment) "
                         f"({_rate('ray_serve_deployment_processing_latency_ms_bucket')}))", "{{deployment}}"),),
                  unit="ms"),
        PanelSpec("HTTP requests by status", "What does Serve's proxy answer?",
                  (Query(f"sum by (status_code) ({_rate('ray_serve_num_http_requests_total')})",
                         "{{status_code}}"),), unit="reqps"),
    )
    return DashboardSpec(uid="mol-serve", title="macaron-ray / Ray Serve",
                         description="Ray Serve's view of the application (ray_serve_* metrics).",
                         rows=(("Deployments", panels),))


def all_dashboards() -> tuple[DashboardSpec, ...]:
    return (mol_overview(), engines(), serve())


# -- rendering --------------------------------------------------------------------------------


def render(spec: DashboardSpec) -> dict:
    """The dashboard as Grafana's JSON model (what `dashboards/<uid>.json` holds)."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, table, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    source = DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VARIABLE + "}")
    board = (dashboard.Dashboard(spec.title).uid(spec.uid).description(spec.description).tags(list(spec.tags))
             .refresh("30s").time("now-1h", "now").timezone("browser")
             .with_variable(dashboard.DatasourceVariable(DATASOURCE_VARIABLE).type("prometheus")
                            .label("Prometheus")))
    panel_id = 0
    for row_title, panels in spec.rows:
        panel_id += 1
        board = board.with_row(dashboard.Row(row_title).id(panel_id))
        for p in panels:
            panel_id += 1
            builder = table.Panel() if p.kind == "table" else timeseries.Panel()
            builder = (builder.id(panel_id).title(p.title).description(p.question).unit(p.unit)
                       .datasource(source).height(8).span(p.width))
            for ref, q in zip("ABCDEFGH", p.queries):
                target = prometheus.Dataquery().expr(q.promql).legend_format(q.legend or "__auto").ref_id(ref)
                if p.kind == "table":
                    target = target.instant().format("table")
                builder = builder.with_target(target)
            board = board.with_panel(builder)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def dashboard_json(spec: DashboardSpec) -> str:
    return json.dumps(render(spec), indent=2, sort_keys=True) + "\n"


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in all_dashboards():
        path = directory / f"{spec.uid}.json"
        path.write_text(dashboard_json(spec))
        written.append(path)
    return written


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (every name here is Ray-prefixed)."""
    return set(re.findall(r"\bray_[a-zA-Z0-9_]+", expr))


def push(url: str, token: str | None, folder: str | None = None) -> list[str]:
    """Upload every dashboard to the Grafana at `url` (overwriting); returns their URLs there."""
    from urllib.parse import urlparse

    from grafana_client import GrafanaApi

    parsed = urlparse(url)
    api = GrafanaApi.from_url(url, credential=token) if token else GrafanaApi.from_url(url)
    folder_uid = None
    if folder:
        existing = {f["title"]: f["uid"] for f in api.folder.get_all_folders()}
        folder_uid = existing.get(folder) or api.folder.create_folder(folder)["uid"]
    urls = []
    for spec in all_dashboards():
        body = {"dashboard": render(spec), "overwrite": True, "message": "macaron dashboards push"}
        if folder_uid:
            body["folderUid"] = folder_uid
        answer = api.dashboard.update_dashboard(body)
        urls.append(f"{parsed.scheme}://{parsed.netloc}{answer.get('url', '')}")
    return urls
