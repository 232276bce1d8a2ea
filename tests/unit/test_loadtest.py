"""`macaron loadtest`: traces, the Server-Timing parser, the loopback guard, the report's math, and
short bounded runs through the official SDKs against the API on the fake engine (all three surfaces)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from macaron_ray.cli import build_parser
from macaron_ray.loadtest.client import (
    REQUEST_ID_HEADER, LoadConfig, NotLoopback, require_loopback, run_level, timing_transport,
)
from macaron_ray.loadtest.report import RequestRecord, overhead_share, summarize
from macaron_ray.loadtest.timing import parse_server_timing, parse_sse_timing
from macaron_ray.loadtest.traces import Traces, TraceTurn, load_traces
from macaron_ray.specialists.labels import LABELS
from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.unit.api_server import PUBLIC_MODEL, start_api


def test_the_suite_traces_mix_every_specialist_with_tool_turns():
    traces = load_traces()
    assert len(traces.conversations) == 6 and traces.requests == 48
    assert {t.expect for c in traces.conversations for t in c.turns} == set(LABELS)
    tool_turns = [t for c in traces.conversations for t in c.turns if t.tools]
    assert tool_turns and all(t.tool_result for t in tool_turns)
    names = {t["function"]["name"] for t in traces.tools}
    assert {"book_table", "set_reminder", "send_message"} <= names


def test_a_malformed_trace_is_refused():
    with pytest.raises(ValueError, match="expect"):
        TraceTurn(user="hi", expect="L9")
    with pytest.raises(ValueError, match="tools"):
        TraceTurn(user="hi", expect="L1", tool_result="{}")
    with pytest.raises(ValueError):
        Traces.model_validate({"tools": [], "conversations": [{"name": "x", "turns": [{"user": "hi"}]}]})


def test_server_timing_is_parsed_in_seconds():
    assert parse_server_timing("route;dur=12.5, wait;dur=0.0") == {"route": 0.0125, "wait": 0.0}
    assert parse_server_timing("total;desc=\"x\";dur=1000") == {"total": 1.0}
    assert parse_server_timing("cache, route;dur=abc, ttft;dur=2, ttft;dur=9") == {"ttft": 0.002}
    assert parse_server_timing(None) == {} and parse_server_timing("") == {}
    assert parse_sse_timing(": server-timing route;dur=3.0, total;dur=40") == {"route": 0.003, "total": 0.04}
    assert parse_sse_timing("data: {}") is None


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:8000/v1",
                                 "http://127.9.9.9"])
def test_loopback_targets_pass(url):
    require_loopback(url)


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "https://api.example.org", "http://0.0.0.0:8000"])
def test_remote_targets_need_to_be_allowed(url):
    with pytest.raises(NotLoopback, match="--allow-remote"):
        require_loopback(url)
    require_loopback(url, allow_remote=True)


def test_the_cli_refuses_a_remote_target_before_sending(capsys):
    args = build_parser().parse_args(["loadtest", "--url", "http://192.0.2.1:8000", "--quiet", "--no-plots"])
    assert args.func(args) == 2
    assert "--allow-remote" in capsys.readouterr().err


def _record(route, wait, answer, total, client_total, kind="user", ok=True, **kw) -> RequestRecord:
    server = {"wait": wait, "answer": answer, "total": total}
    if route is not None:
        server["route"] = route
    return RequestRecord(conversation="c", turn=0, kind=kind, surface="chat", concurrency=1, started_s=0.0,
                         ok=ok, client_total_s=client_total, client_ttft_s=client_total / 2, server=server, **kw)


def test_report_math_on_synthetic_timings():
    records = [
        _record(0.1, 0.0, 0.8, 0.95, 1.0),
        _record(0.2, 0.3, 1.4, 2.0, 2.0),
        _record(None, 0.0, 0.5, 0.5, 0.6, kind="tool_result"),  # no route hop: not in the overhead
        RequestRecord(conversation="c", turn=1, kind="user", surface="chat", concurrency=1, started_s=0.0,
                      status=503, error="ServiceUnavailable: busy"),
        RequestRecord(conversation="c", turn=2, kind="user", surface="chat", concurrency=1, started_s=0.0,
                      disconnected=True),
    ]
    assert overhead_share(records[0]) == pytest.approx(0.1)
    assert overhead_share(records[1]) == pytest.approx(0.25)
    assert overhead_share(records[2]) is None
    s = summarize(records, wall_s=4.0)
    assert s["requests"] == {"sent": 5, "ok": 3, "user_turns_ok": 2, "tool_results_ok": 1, "tool_calls": 0,
                             "disconnected": 1, "errors": {"503": 1}}
    assert s["throughput_turns_per_s"] == pytest.approx(0.5)
    share = s["routing_overhead_share"]
    assert share["n"] == 2 and share["mean"] == pytest.approx(0.175)
    assert share["aggregate"] == pytest.approx((0.1 + 0.5) / 3.0)
    assert s["hops_s"]["route"]["n"] == 2 and s["hops_s"]["route"]["p50"] == pytest.approx(0.1)
    assert s["hops_s"]["answer"]["max"] == pytest.approx(1.4)
    # total - (route + wait + answer): 0.05, 0.1, 0.0
    assert s["unattributed_s"]["max"] == pytest.approx(0.1) and s["unattributed_s"]["n"] == 3


def test_hop_histograms_are_summed_over_label_sets_and_differenced():
    from macaron_ray.loadtest.hops import Totals, hop_table, histogram_totals
    from macaron_ray.observability.metrics import ROUTE_HOP, SUMMARY_HOP, MoLMetrics, PrometheusExporter
    from prometheus_client import generate_latest

    exporter = PrometheusExporter()
    metrics = MoLMetrics(exporter)
    metrics.summary_hop.observe(1.0, specialist="L1", surface="chat")
    before = histogram_totals(generate_latest(exporter.registry).decode(), SUMMARY_HOP)
    metrics.summary_hop.observe(2.0, specialist="L2", surface="chat")
    metrics.summary_hop.observe(4.0, specialist="L2", surface="messages")
    metrics.route_hop.observe(0.5, specialist="L2", surface="chat")
    text = generate_latest(exporter.registry).decode()
    assert before == Totals(1.0, 1.0)
    assert histogram_totals(text, SUMMARY_HOP) - before == Totals(6.0, 2.0)
    assert (histogram_totals(text, SUMMARY_HOP) - before).mean == 3.0
    assert histogram_totals(text, ROUTE_HOP) == Totals(0.5, 1.0) and Totals().mean is None
    assert hop_table(0.5, 2.5, 2.0) == {"route_s": 0.5, "answer_s": 2.5, "summary_s": 2.0, "share": 0.5}
    assert hop_table(0.5, 2.5, None)["share"] is None


def test_the_timing_transport_reads_header_and_stream_comment_without_changing_the_body():
    body = b"data: {\"a\": 1}\n\n: server-timing ttft;dur=5.0, total;dur=20.0\n\ndata: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"server-timing": "route;dur=1.5, wait;dur=0"}, content=body)

    transport = timing_transport(httpx)
    transport.inner = httpx.MockTransport(handler)

    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            async with client.stream("POST", "http://127.0.0.1/x", headers={REQUEST_ID_HEADER: "t1"}) as resp:
                return b"".join([chunk async for chunk in resp.aiter_raw()])

    assert asyncio.run(go()) == body
    assert transport.seen["t1"] == {"route": 0.0015, "wait": 0.0, "ttft": 0.005, "total": 0.02}


def test_the_leak_scan_finds_a_private_name_split_between_two_chunks_of_a_stream():
    from macaron_ray.loadtest.leaks import LeakScan

    scan = LeakScan(("mol-l2-coding",))
    stream = scan.stream()
    for piece in ('data: {"text": "from mol-l2', '-cod', 'ing"}\n'):
        stream.feed(piece)
    assert scan.found == {"mol-l2-coding"}
    raw = "données: mol-l2-coding".encode()
    split = raw.index("é".encode()) + 1  # inside the two bytes of "é"
    scan.found.clear()
    stream = scan.stream()
    stream.feed_bytes(raw[:split])
    stream.feed_bytes(raw[split:])
    assert scan.found == {"mol-l2-coding"} and stream.tail.endswith("mol-l2-coding"[-12:])
    scan.scan('x-error: File "/srv/app.py"')
    assert scan.found == {"mol-l2-coding", 'File "'}


@pytest.mark.parametrize("surface", ["chat", "responses", "messages"])
@pytest.mark.parametrize("leaky", [True, False])
def test_a_run_scans_every_response_for_private_names(tmp_path, surface, leaky):
    """The fake engine names the adapter it ran in its answers: its private id (a leak the scan must
    find), or the specialist's public label (nothing to find)."""
    from macaron_ray.loadtest.leaks import LeakScan
    from tests.unit.api_server import SECRET_ADAPTERS

    label = {v: k for k, v in SECRET_ADAPTERS.items()}
    engine = FakeEngine(tag=(lambda a: a) if leaky else (lambda a: label[a]))
    running = start_api(engine, WhitespaceTokenCounter(), tmp_path / "state.db")
    try:
        cfg = LoadConfig(url=running.base_url, surface=surface, model=PUBLIC_MODEL, conversations=2, max_requests=6,
                         duration_s=60, private=tuple(SECRET_ADAPTERS.values()))
        scan = LeakScan(cfg.private)
        records, _ = asyncio.run(run_level(cfg, TOOL_TRACES, concurrency=2, leaks=scan))
    finally:
        running.stop()
    assert records and all(r.ok for r in records)
    assert scan.found <= set(SECRET_ADAPTERS.values())
    assert bool(scan.found) == leaky


@pytest.fixture
def api(tmp_path):
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path / "state.db")
    yield running
    running.stop()


TOOL_TRACES = Traces.model_validate({
    "tools": [{"type": "function", "function": {"name": "book_table", "description": "Book.",
                                                "parameters": {"type": "object", "properties": {}}}}],
    "conversations": [
        {"name": "a", "turns": [{"user": "hello there", "expect": "L0"},
                                {"user": "please book tool:book_table", "expect": "L1", "tools": True,
                                 "tool_result": "{\"status\": \"ok\"}"},
                                {"user": "write python code", "expect": "L2"}]},
        {"name": "b", "turns": [{"user": "build a chart widget", "expect": "L3"},
                                {"user": "and a form card", "expect": "L3"}]},
    ]})


@pytest.mark.parametrize("surface", ["chat", "responses", "messages"])
def test_a_bounded_run_through_each_sdk_counts_what_it_sent_and_times_every_hop(api, surface):
    cfg = LoadConfig(url=api.base_url, surface=surface, model=PUBLIC_MODEL, conversations=3, max_requests=50,
                     duration_s=60)
    records, wall_s = asyncio.run(run_level(cfg, TOOL_TRACES, concurrency=2))
    # 3 conversations (a, b, a again): 8 user turns and 2 tool results.
    assert sorted((r.conversation, r.turn, r.kind) for r in records) == sorted(
        [(f"a#{i}", t, "user") for i in (0, 2) for t in range(3)] + [("b#1", t, "user") for t in range(2)]
        + [(f"a#{i}", 1, "tool_result") for i in (0, 2)])
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert [r.tool_call for r in records if r.kind == "user"].count(True) == 2
    for r in records:
        assert {"wait", "ttft", "answer", "total"} <= set(r.server), r
        assert ("route" in r.server) == (r.kind == "user")  # tool results skip the route hop
        hops = r.server.get("route", 0.0) + r.server["wait"] + r.server["answer"]
        assert hops <= r.server["total"] + 0.002 and r.server["total"] <= r.client_total_s + 0.002
    summary = summarize(records, wall_s)
    assert summary["requests"]["user_turns_ok"] == 8 and summary["requests"]["tool_results_ok"] == 2


def test_the_budget_stops_the_run_and_disconnects_are_rolled_back(api):
    cfg = LoadConfig(url=api.base_url, model=PUBLIC_MODEL, conversations=4, max_requests=3, duration_s=60)
    records, _ = asyncio.run(run_level(cfg, TOOL_TRACES, concurrency=1))
    assert len(records) == 3
    cfg = LoadConfig(url=api.base_url, model=PUBLIC_MODEL, conversations=1, max_requests=10, duration_s=60,
                     disconnect_rate=1.0)
    records, _ = asyncio.run(run_level(cfg, TOOL_TRACES, concurrency=1))
    assert [r.disconnected for r in records] == [True, True, True] and not any(r.ok for r in records)
    assert summarize(records, 1.0)["requests"]["errors"] == {}


def test_the_cli_writes_the_report_and_plots(api, tmp_path):
    out, plots = tmp_path / "lt.json", tmp_path / "plots"
    args = build_parser().parse_args(["loadtest", "--url", api.base_url, "--model", PUBLIC_MODEL, "--quiet",
                                      "--concurrency", "1", "2", "--conversations", "2", "--max-requests", "20",
                                      "--out", str(out), "--plots", str(plots),
                                      "--metrics-url", f"{api.base_url}/metrics"])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]
    assert all(lv["requests"]["errors"] == {} for lv in report["levels"])
    for lv in report["levels"]:
        # Each level's summaries are its own (scraped before and after), one per user turn.
        assert lv["summary_hops"] == lv["requests"]["user_turns_ok"] > 0
        table = lv["hop_table"]
        assert table["route_s"] > 0 and table["answer_s"] > 0 and table["summary_s"] > 0
        assert table["share"] == pytest.approx((table["route_s"] + table["summary_s"])
                                               / (table["route_s"] + table["answer_s"] + table["summary_s"]))
    assert "api_key" not in report["config"]
    assert sorted(p.name for p in plots.iterdir()) == ["latency_cdf.png", "routing_overhead.png",
                                                        "throughput_latency.png"]


def test_the_locustfile_replays_the_traces_with_a_row_per_hop(api, tmp_path):
    import csv
    import os
    import subprocess
    import sys
    from pathlib import Path

    import macaron_ray.loadtest as package

    locustfile = Path(package.__file__).parent / "locustfile.py"
    done = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(locustfile), "--host", api.base_url, "--headless", "-u", "2",
         "-r", "2", "-t", "6s", "--stop-timeout", "10", "--csv", str(tmp_path / "run"), "--only-summary"],
        capture_output=True, text=True, timeout=90, env={**os.environ, "MACARON_MODEL": PUBLIC_MODEL})
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "run_stats.csv", newline="") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    assert int(rows[("POST", "turn")]["Request Count"]) > 0
    assert int(rows[("POST", "turn")]["Failure Count"]) == 0
    for hop in ("route", "wait", "answer", "total"):
        assert int(rows[("hop", hop)]["Request Count"]) > 0, hop
