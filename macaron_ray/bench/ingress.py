"""`macaron bench ingress`: what the MoL ingress itself costs per turn, against Ray Serve LLM's stock
`OpenAiIngress`, both in front of the same zero-latency engine deployment, in the same run.

    MoL:    Serve proxy -> MoLIngress -> ZeroLatencyLLM (route hop, answer hop; summary after)
    stock:  Serve proxy -> OpenAiIngress -> ZeroLatencyLLM (one call)

The engine answers at once: a route request with one of its choices, anything else with a short
text, as the SSE chunks a Ray Serve LLM server yields. Each level keeps N conversations going, turn
after turn (a conversation starts over after `TURNS_PER_CONVERSATION` turns), for a bounded time
and count. Reported per level:

- the MoL ingress's self-time per turn: its `Server-Timing` total minus its route, summary-wait and
  answer hops (the time spent inside engine calls); that is the ingress's own code, store included;
- the client-observed latency through each ingress, and their ratio (MoL over stock): the stock
  ingress has no timing of its own, and with an engine that takes no time its latency is its
  overhead (proxy, ingress, one handle call);
- the CPU time the ingress replica's process and Serve's HTTP proxy spent per turn (psutil): on
  this two-core machine the client, the proxy, the ingress and the engines share the cores, so
  latency at high concurrency is mostly queueing for a core, and CPU per turn is what each ingress
  costs whatever the machine.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import psutil

from macaron_ray.bench.stats import percentile
from macaron_ray.loadtest.timing import parse_server_timing, parse_sse_timing

LEVELS = (1, 8, 32, 64)
TURNS_PER_CONVERSATION = 8
TARGETS = {"self_p50_s_at_32": 0.003, "self_p99_s_at_32": 0.015, "client_p50_ratio_over_stock": 1.5}
MODEL = "Macaron-V1-Venti"
ENGINE = "ZeroLatency"


class ZeroLatencyLLM:
    """A Serve deployment with the interface both ingresses call (`chat` streaming SSE strings)."""

    def __init__(self):
        self.calls = 0

    async def chat(self, request, raw_request_info=None):
        self.calls += 1
        choice = (getattr(request, "structured_outputs", None) or {})
        choice = choice.get("choice") if isinstance(choice, dict) else getattr(choice, "choice", None)
        text = choice[self.calls % len(choice)] if choice else "The assistant answered briefly."
        created = int(time.time())

        def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> str:
            body = {"id": f"zl-{self.calls}", "object": "chat.completion.chunk", "created": created,
                    "model": request.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if usage is not None:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n"

        yield chunk({"role": "assistant", "content": text})
        yield chunk({}, "stop", {"prompt_tokens": 8, "completion_tokens": 4, "total_tokens": 12})
        yield "data: [DONE]\n\n"

    async def check_health(self):
        return None


def _engine(name: str):
    from ray import serve

    return serve.deployment(ZeroLatencyLLM, name=name, num_replicas=1, max_ongoing_requests=1024,
                            ray_actor_options={"num_cpus": 0})


def build_mol(args: dict):
    """import_path target: the MoL ingress of `args["profile"]` (AppArgs) over two zero-latency engines."""
    from macaron_ray.serve.app import ingress_deployment
    from macaron_ray.serve.args import AppArgs

    app_args = AppArgs.model_validate(args["profile"])
    # Both ingresses queue what they cannot take yet (the stock one has no gate): no back-pressure cap.
    app_args.ingress.limits.turns_in_flight = None
    return ingress_deployment(app_args).bind(app_args.model_dump(mode="json"), _engine(f"{ENGINE}Router").bind(),
                                             _engine(f"{ENGINE}Answer").bind())


def build_stock(args: dict):
    """import_path target: Ray Serve LLM's OpenAiIngress over one zero-latency engine."""
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import ModelCard
    from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, make_fastapi_ingress

    card = ModelCard(id=MODEL, object="model", owned_by="bench", permission=[], metadata={})
    ingress = serve.deployment(make_fastapi_ingress(OpenAiIngress), name="OpenAiIngress", num_replicas=1,
                               max_ongoing_requests=args.get("max_ongoing_requests", 64),
                               ray_actor_options={"num_cpus": args.get("num_cpus", 0.5)})
    return ingress.bind(llm_deployments={MODEL: _engine(ENGINE).bind()}, model_cards={MODEL: card})


async def _conversation(client: httpx.AsyncClient, url: str, i: int, deadline: float, budget: list[int],
                        records: list[dict]) -> None:
    messages: list[dict] = []
    turn = 0
    while time.monotonic() < deadline and budget[0] > 0:
        budget[0] -= 1
        if turn == TURNS_PER_CONVERSATION:
            messages, turn = [], 0
        messages.append({"role": "user", "content": f"conversation {i}, turn {turn}: tell me something"})
        started = time.perf_counter()
        timing: dict[str, float] = {}
        text: list[str] = []
        async with client.stream("POST", f"{url}/v1/chat/completions", json={
                "model": MODEL, "messages": messages, "stream": True, "max_tokens": 16}) as resp:
            ok = resp.status_code == 200
            timing.update(parse_server_timing(resp.headers.get("server-timing")))
            async for line in resp.aiter_lines():
                if (st := parse_sse_timing(line)) is not None:
                    timing.update(st)
                elif line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"]
                    text.append((delta[0]["delta"].get("content") or "") if delta else "")
        records.append({"ok": ok, "client_s": time.perf_counter() - started, "server": timing})
        messages.append({"role": "assistant", "content": "".join(text)})
        turn += 1


async def drive(url: str, conversations: int, duration_s: float, max_requests: int) -> list[dict]:
    records: list[dict] = []
    limits = httpx.Limits(max_connections=conversations + 4, max_keepalive_connections=conversations + 4)
    async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
        deadline = time.monotonic() + duration_s
        budget = [max_requests]
        await asyncio.gather(*(_conversation(client, url, i, deadline, budget, records)
                               for i in range(conversations)))
    return records


def serve_processes(ingress: str) -> dict[str, psutil.Process]:
    """The ingress replica's process and the HTTP proxy's, found by Ray's process titles."""
    found: dict[str, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or ())
        if f"ServeReplica:macaron:{ingress}" in line:
            found["ingress"] = proc
        elif "ray::ProxyActor" in line:
            found["proxy"] = proc
    return found


def cpu_seconds(procs: dict[str, psutil.Process]) -> dict[str, float]:
    out = {}
    for name, proc in procs.items():
        times = proc.cpu_times()
        out[name] = times.user + times.system
    return out


def self_time_s(server: dict[str, float]) -> float | None:
    """The ingress's own time in a turn: total minus the hops spent in engine calls."""
    if "total" not in server or "answer" not in server:
        return None
    return server["total"] - server.get("route", 0.0) - server.get("wait", 0.0) - server["answer"]


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "p99": percentile(values, 99), "mean": sum(values) / len(values)}


def level_figures(records: list[dict], wall_s: float, cpu_s: dict[str, float] | None = None) -> dict:
    """cpu_s: CPU seconds each process spent during the level (see `serve_processes`)."""
    ok = [r for r in records if r["ok"]]
    selfs = [s for s in (self_time_s(r["server"]) for r in ok) if s is not None]
    return {"requests": len(records), "ok": len(ok), "turns_per_s": len(ok) / wall_s if wall_s else 0.0,
            "client_s": _stats([r["client_s"] for r in ok]), "self_s": _stats(selfs),
            "cpu_ms_per_turn": {name: 1000 * s / len(ok) for name, s in (cpu_s or {}).items()} if ok else {}}


def run(profile: Path, out: Path, *, levels: tuple[int, ...] = LEVELS, duration_s: float = 20.0,
        max_requests: int = 2000, port: int = 8000, log_dir: Path = Path(".bench")) -> dict:
    import yaml

    from macaron_ray.serve.args import load_profile
    from macaron_ray.serve.local_cluster import LocalRayCluster

    log_dir.mkdir(parents=True, exist_ok=True)
    app_args = load_profile(profile)
    store = {"kind": "sqlite", "path": str((log_dir / "bench-ingress.db").resolve())}
    mol_args = app_args.model_copy(update={"store": type(app_args.store).model_validate(store)})
    apps = {
        "mol": {"import_path": "macaron_ray.bench.ingress:build_mol",
                "args": {"profile": mol_args.model_dump(mode="json")}},
        "stock": {"import_path": "macaron_ray.bench.ingress:build_stock",
                  "args": {"num_cpus": app_args.ingress.num_cpus,
                           "max_ongoing_requests": app_args.ingress.max_ongoing_requests}},
    }
    result: dict = {"levels": list(levels), "duration_s": duration_s, "max_requests": max_requests,
                    "targets": TARGETS, "profile": profile.name}
    url = f"http://127.0.0.1:{port}"
    with LocalRayCluster(log_path=log_dir / "bench-ingress-ray.log") as cluster:
        for name, app in apps.items():
            config = log_dir / f"bench-ingress-{name}.yaml"
            config.write_text(yaml.safe_dump({
                "proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
                "applications": [{"name": "macaron", "route_prefix": "/", **app}]}))
            cluster.serve_deploy(config)
            cluster.wait_running("macaron")
            asyncio.run(drive(url, 1, 3.0, 20))  # warm: handles, connections, the store
            procs = serve_processes("MoLIngress" if name == "mol" else "OpenAiIngress")
            for level in levels:
                started, cpu = time.monotonic(), cpu_seconds(procs)
                records = asyncio.run(drive(url, level, duration_s, max_requests))
                used = {k: v - cpu[k] for k, v in cpu_seconds(procs).items()}
                result.setdefault(name, {})[str(level)] = level_figures(records, time.monotonic() - started, used)
            cluster.serve_shutdown()
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")  # what was measured, if the rest fails
    result["ratio_client_p50"] = {str(lv): result["mol"][str(lv)]["client_s"]["p50"]
                                  / result["stock"][str(lv)]["client_s"]["p50"] for lv in levels}
    result["ratio_ingress_cpu_per_turn"] = {
        str(lv): result["mol"][str(lv)]["cpu_ms_per_turn"].get("ingress", 0.0)
        / max(1e-9, result["stock"][str(lv)]["cpu_ms_per_turn"].get("ingress", 0.0)) for lv in levels}
    at32 = result["mol"].get("32", {}).get("self_s", {})
    result["meets_targets"] = bool(
        at32.get("n") and at32["p50"] <= TARGETS["self_p50_s_at_32"] and at32["p99"] <= TARGETS["self_p99_s_at_32"]
        and result["ratio_client_p50"].get("32", 99) <= TARGETS["client_p50_ratio_over_stock"])
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_report(result: dict) -> str:
    lines = [f"ingress overhead, zero-latency engine, {result['duration_s']:g} s per level ({result['profile']})",
             f"  {'conc.':>5} {'MoL self p50':>12} {'p99':>8} {'MoL client p50':>14} {'p99':>8} "
             f"{'stock client p50':>16} {'p99':>8} {'ratio p50':>9} {'MoL t/s':>8} {'stock t/s':>9} "
             f"{'ingress CPU/turn MoL':>20} {'stock':>7} {'proxy MoL':>9} {'stock':>7}"]
    ms = lambda v: f"{v * 1000:.1f}ms" if v is not None else "-"  # noqa: E731
    cpu = lambda row, proc: (f"{row['cpu_ms_per_turn'][proc]:.1f}ms"  # noqa: E731
                             if proc in row.get("cpu_ms_per_turn", {}) else "-")
    for lv in result["levels"]:
        mol, stock = result["mol"][str(lv)], result["stock"][str(lv)]
        lines.append(f"  {lv:>5} {ms(mol['self_s'].get('p50')):>12} {ms(mol['self_s'].get('p99')):>8} "
                     f"{ms(mol['client_s'].get('p50')):>14} {ms(mol['client_s'].get('p99')):>8} "
                     f"{ms(stock['client_s'].get('p50')):>16} {ms(stock['client_s'].get('p99')):>8} "
                     f"{result['ratio_client_p50'][str(lv)]:>9.2f} {mol['turns_per_s']:>8.1f} "
                     f"{stock['turns_per_s']:>9.1f} {cpu(mol, 'ingress'):>20} {cpu(stock, 'ingress'):>7} "
                     f"{cpu(mol, 'proxy'):>9} {cpu(stock, 'proxy'):>7}")
    lines.append(f"  targets: MoL self p50 <= 3 ms and p99 <= 15 ms at 32, client p50 <= 1.5x stock: "
                 f"met {result['meets_targets']}")
    return "\n".join(lines)
