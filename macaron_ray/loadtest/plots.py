"""PNG plots of a load-test report (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from macaron_ray.loadtest.report import RequestRecord, hop_values, overhead_share

CDF_HOPS = ("route", "wait", "ttft", "answer", "total", "client_total")


def write_plots(report: dict, records: list[RequestRecord], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    done = [r for r in records if r.ok]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for hop in CDF_HOPS:
        values = sorted(hop_values(done, hop))
        if values:
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=hop)
    ax.set(xlabel="seconds", ylabel="fraction of requests", title="Latency CDF per hop", xscale="symlog")
    ax.legend()
    written.append(_save(fig, out_dir / "latency_cdf.png", plt))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    shares = [s for s in (overhead_share(r) for r in done if r.kind == "user") if s is not None]
    ax.hist([100 * s for s in shares], bins=20)
    ax.set(xlabel="route + summary wait, % of the turn the client saw", ylabel="user turns",
           title="Routing overhead per turn")
    written.append(_save(fig, out_dir / "routing_overhead.png", plt))

    levels = report["levels"]
    if levels:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xs = [lv["concurrency"] for lv in levels]
        ax.plot(xs, [lv["throughput_turns_per_s"] for lv in levels], "o-", label="turns/s")
        ax.set(xlabel="concurrent conversations", ylabel="user turns per second", title="Throughput and p95 latency")
        right = ax.twinx()
        right.plot(xs, [lv["hops_s"]["client_total"].get("p95") for lv in levels], "s--", color="tab:red",
                   label="p95 turn latency (s)")
        right.set_ylabel("p95 turn latency, seconds")
        written.append(_save(fig, out_dir / "throughput_latency.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
