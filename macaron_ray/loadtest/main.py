"""`macaron loadtest`: one run per concurrency level, a JSON report, PNG plots."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from macaron_ray.loadtest.client import LoadConfig, run_level
from macaron_ray.loadtest.hops import REPORT_TABLE_1, HopScraper, hop_table
from macaron_ray.loadtest.leaks import LeakScan
from macaron_ray.loadtest.report import records_json, summarize, user_hop_mean
from macaron_ray.loadtest.traces import Traces, load_traces


def run(cfg: LoadConfig, levels: tuple[int, ...], out: Path, plots_dir: Path | None = None,
        traces: Traces | None = None, progress: bool = True, metrics_urls: list[str] | None = None) -> dict:
    """Each level plays `cfg.conversations` conversations within `cfg`'s budget, one level after another.
    `metrics_urls`: the deployment's Prometheus endpoints, for the summary hop (see `hops`)."""
    traces = traces or load_traces()
    report: dict = {"config": {k: v for k, v in vars(cfg).items() if k not in ("api_key", "private")}, "levels": []}
    leaks = LeakScan(cfg.private)
    scraper = HopScraper(metrics_urls) if metrics_urls else None
    all_records = []
    for level in levels:
        before = scraper.read() if scraper else None
        bar = _progress(cfg.max_requests, f"{cfg.surface} x{level}") if progress else None
        try:
            records, wall_s = asyncio.run(run_level(cfg, traces, level, bar, leaks))
        finally:
            if bar is not None:
                bar.close()
        summary = scraper.after(before)["summary"] if scraper else None
        report["levels"].append({
            "concurrency": level, **summarize(records, wall_s),
            "hop_table": hop_table(user_hop_mean(records, "route"), user_hop_mean(records, "answer"),
                                   summary.mean if summary else None),
            "summary_hops": int(summary.count) if summary else None})
        all_records += records
    report["records"] = records_json(all_records)
    report["leaks"] = sorted(leaks.found)  # private names or stack-trace marks received: must be []
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    if plots_dir is not None:
        from macaron_ray.loadtest.plots import write_plots

        report["plots"] = [str(p) for p in write_plots(report, all_records, plots_dir)]
    return report


def _progress(total: int, label: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="req", leave=False)


def format_report(report: dict) -> str:
    lines = [f"loadtest {report['config']['surface']} -> {report['config']['url']}",
             f"  {'conc.':>5} {'sent':>5} {'ok':>5} {'err':>4} {'disc.':>5} {'turns/s':>8} "
             f"{'route p50':>9} {'answer p50':>10} {'turn p50':>8} {'turn p95':>8} {'overhead':>8}"]
    for lv in report["levels"]:
        h, req = lv["hops_s"], lv["requests"]

        def p(hop: str, q: str) -> str:
            v = h[hop].get(q)
            return f"{v:.3f}" if v is not None else "-"

        share = lv["routing_overhead_share"].get("aggregate")
        lines.append(f"  {lv['concurrency']:>5} {req['sent']:>5} {req['ok']:>5} {sum(req['errors'].values()):>4} "
                     f"{req['disconnected']:>5} {lv['throughput_turns_per_s']:>8.2f} {p('route', 'p50'):>9} "
                     f"{p('answer', 'p50'):>10} {p('client_total', 'p50'):>8} {p('client_total', 'p95'):>8} "
                     f"{(f'{share:.1%}' if share is not None else '-'):>8}")
    for lv in report["levels"]:
        lines.append(f"  x{lv['concurrency']} {format_hop_table(lv['hop_table'])}")
    lines.append(f"  leaks (private names or stack traces received): {len(report.get('leaks', []))}")
    lines.append("  report Table 1: " + "; ".join(
        f"{name} route {t['route_s']:.2f} s, summary {t['summary_s']:.2f} s, share {t['share']:.0%}"
        for name, t in REPORT_TABLE_1.items()))
    return "\n".join(lines)


def format_hop_table(t: dict) -> str:
    def s(v: float | None) -> str:
        return f"{v:.3f} s" if v is not None else "-"

    share = f"{t['share']:.1%}" if t["share"] is not None else "- (summary needs --metrics-url)"
    return (f"mean hops per user turn: route {s(t['route_s'])}, answer {s(t['answer_s'])}, "
            f"summary {s(t['summary_s'])}; route + summary share {share}")
