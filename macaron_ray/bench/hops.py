"""`macaron bench hops`: the report's per-hop table (Table 1), reproduced on the local topology.

The suite's 48-turn mixed multi-turn trace (`loadtest/data/traces.yaml`: six conversations of
eight turns) at temperature 0, one conversation at a time, through the whole deployment
(ingress, router, prefill/decode over NIXL): mean route, answer and summary hop per user turn
and the share of route + summary, side by side with the report's. Then the figure the design
exists for, the routing overhead on the user's critical path (route hop plus any wait for a
pending summary, over the latency the client saw), once with no think time and once with
`think_time_s` between a conversation's turns, in the same run.

Route and answer come from each response's `Server-Timing`; the summary hop, which runs after
delivery, from the ingress's histogram on Ray's metrics ports (`loadtest.hops`).
"""

from __future__ import annotations

import json
from pathlib import Path

from macaron_ray.loadtest import main as loadtest
from macaron_ray.loadtest.client import LoadConfig
from macaron_ray.loadtest.hops import REPORT_TABLE_1
from macaron_ray.loadtest.main import format_hop_table
from macaron_ray.loadtest.traces import load_traces

TARGET_OVERHEAD_WITH_THINK = 0.10


def measure(url: str, metrics_urls: list[str], out: Path, *, think_time_s: float, max_tokens: int,
            model: str, api_key: str = "bench") -> dict:
    """Both passes against a running deployment."""
    traces = load_traces()
    turns = sum(len(c.turns) for c in traces.conversations)
    result: dict = {"trace_user_turns": turns, "max_tokens": max_tokens, "think_time_s": think_time_s,
                    "report_table_1": REPORT_TABLE_1, "target_overhead_with_think": TARGET_OVERHEAD_WITH_THINK}
    for name, think in (("no_think", 0.0), ("think", think_time_s)):
        cfg = LoadConfig(url=url, api_key=api_key, model=model, conversations=len(traces.conversations),
                         max_requests=4 * turns, duration_s=3600.0, think_time_s=think, max_tokens=max_tokens)
        report = loadtest.run(cfg, (1,), out.with_name(f"hops-{name}-loadtest.json"), traces=traces,
                              progress=False, metrics_urls=metrics_urls)
        level = report["levels"][0]
        result[name] = {"requests": level["requests"], "hop_table": level["hop_table"],
                        "summary_hops": level["summary_hops"], "hops_s": level["hops_s"],
                        "routing_overhead_share": level["routing_overhead_share"]}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")  # what was measured, if the rest fails
    share = result["think"]["routing_overhead_share"].get("aggregate")
    result["meets_target"] = share is not None and share <= TARGET_OVERHEAD_WITH_THINK
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def run_local(profile: Path, out: Path, *, think_time_s: float, max_tokens: int, port: int = 8000,
              log_dir: Path = Path(".bench")) -> dict:
    """Deploy `profile` on a local Ray cluster, measure, tear it down."""
    from macaron_ray.serve.args import load_profile
    from macaron_ray.serve.local_cluster import LocalRayCluster, serve_config_with

    log_dir.mkdir(parents=True, exist_ok=True)
    args = load_profile(profile)
    with LocalRayCluster(log_path=log_dir / "bench-hops-ray.log") as cluster:
        cluster.serve_deploy(serve_config_with(profile, log_dir / "bench-hops.yaml", port=port))
        cluster.wait_running("macaron", args.deployment_names())
        metrics = [f"http://127.0.0.1:{p}/metrics" for p in cluster.metrics_ports]
        result = measure(f"http://127.0.0.1:{port}", metrics, out, think_time_s=think_time_s,
                         max_tokens=max_tokens, model=args.public_model)
    result["profile"] = profile.name
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_report(result: dict) -> str:
    lines = [f"per-hop table: {result['trace_user_turns']} user turns, temperature 0, one conversation at a time, "
             f"answers <= {result['max_tokens']} tokens" + (f" ({result['profile']})" if "profile" in result else "")]
    lines.append(f"  here:     {format_hop_table(result['no_think']['hop_table'])}")
    for name, t in result["report_table_1"].items():
        lines.append(f"  {name}: route {t['route_s']:.2f} s, summary {t['summary_s']:.2f} s, "
                     f"route + summary share {t['share']:.0%} (the report's Table 1)")
    def pct(v: float | None) -> str:
        return f"{v:.1%}" if v is not None else "-"

    for name, label in (("no_think", "no think time"), ("think", f"think time {result['think_time_s']:g} s")):
        o = result[name]["routing_overhead_share"]
        wait = result[name]["hops_s"]["wait"].get("mean")
        lines.append(f"  routing overhead on the critical path, {label}: aggregate {pct(o.get('aggregate'))}, "
                     f"p50 {pct(o.get('p50'))}, p95 {pct(o.get('p95'))}; summary wait mean "
                     + (f"{wait:.3f} s" if wait is not None else "-"))
    lines.append(f"  target <= {TARGET_OVERHEAD_WITH_THINK:.0%} with think time: met {result['meets_target']}")
    return "\n".join(lines)
