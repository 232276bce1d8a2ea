"""The load test's records and the figures made of them (pure: no I/O)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from macaron_ray.bench.stats import percentile

SERVER_HOPS = ("route", "wait", "ttft", "answer", "total")
"""What the ingress reports in `Server-Timing` (seconds)."""
CLIENT_HOPS = ("client_ttft", "client_total")


@dataclass
class RequestRecord:
    """One HTTP request of the load test: a user turn, or the tool result that continues one."""

    conversation: str
    turn: int
    kind: str
    """"user" or "tool_result"."""
    surface: str
    concurrency: int
    started_s: float
    """Since the start of the run."""
    expect: str = ""
    ok: bool = False
    status: int | None = None
    """HTTP status of an error (None when the request succeeded or never got an answer)."""
    error: str | None = None
    disconnected: bool = False
    """The client closed the stream on purpose (the disconnect rate)."""
    tool_call: bool = False
    client_ttft_s: float | None = None
    client_total_s: float | None = None
    server: dict[str, float] = field(default_factory=dict)


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": sum(values) / len(values), "p50": percentile(values, 50),
            "p95": percentile(values, 95), "p99": percentile(values, 99), "max": max(values)}


def hop_values(records: list[RequestRecord], hop: str) -> list[float]:
    if hop == "client_ttft":
        return [r.client_ttft_s for r in records if r.client_ttft_s is not None]
    if hop == "client_total":
        return [r.client_total_s for r in records if r.client_total_s is not None]
    return [r.server[hop] for r in records if hop in r.server]


def overhead_share(record: RequestRecord) -> float | None:
    """Routing overhead on the user's critical path: the route hop plus any wait for an earlier
    turn's summary, over the latency the client saw."""
    if not record.client_total_s or "route" not in record.server:
        return None
    return (record.server["route"] + record.server.get("wait", 0.0)) / record.client_total_s


def unattributed_s(record: RequestRecord) -> float | None:
    """The part of the ingress's turn no hop accounts for: total - (route + wait + answer)."""
    s = record.server
    if not {"total", "answer"} <= set(s):
        return None
    return s["total"] - (s.get("route", 0.0) + s.get("wait", 0.0) + s["answer"])


def user_hop_mean(records: list[RequestRecord], hop: str) -> float | None:
    """Mean of one Server-Timing hop over the user turns that succeeded (tool results are left out:
    they have no route hop and no summary)."""
    values = hop_values([r for r in records if r.ok and r.kind == "user"], hop)
    return sum(values) / len(values) if values else None


def summarize(records: list[RequestRecord], wall_s: float) -> dict:
    """Counts, per-hop latency, routing overhead and throughput of one run (one concurrency)."""
    done = [r for r in records if r.ok]
    user = [r for r in done if r.kind == "user"]
    shares = [s for s in (overhead_share(r) for r in user) if s is not None]
    route_wait = sum(r.server["route"] + r.server.get("wait", 0.0) for r in user
                     if "route" in r.server and r.client_total_s)
    seen = sum(r.client_total_s for r in user if "route" in r.server and r.client_total_s)
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok and not r.disconnected:
            key = str(r.status) if r.status is not None else (r.error or "error").split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    return {
        "requests": {"sent": len(records), "ok": len(done), "user_turns_ok": len(user),
                     "tool_results_ok": sum(r.kind == "tool_result" for r in done),
                     "tool_calls": sum(r.tool_call for r in done),
                     "disconnected": sum(r.disconnected for r in records), "errors": errors},
        "wall_s": wall_s,
        "throughput_turns_per_s": len(user) / wall_s if wall_s > 0 else 0.0,
        "hops_s": {hop: _stats(hop_values(done, hop)) for hop in (*SERVER_HOPS, *CLIENT_HOPS)},
        "routing_overhead_share": {**_stats(shares), "aggregate": route_wait / seen if seen else None},
        "unattributed_s": _stats([u for u in (unattributed_s(r) for r in done) if u is not None]),
    }


def records_json(records: list[RequestRecord]) -> list[dict]:
    return [asdict(r) for r in records]
