"""Memory of a running topology, and `macaron bench memory`: the local topology before and after
it was made lean, in one run.

Per-process RSS counts shared pages (torch, vLLM's libraries) once per process,
so a sum of RSS overstates what the machine holds; PSS splits each shared page
between the processes that map it, and its sum is what the topology costs.
Both are reported, and each process is charged to the Serve deployment it
serves (vLLM's engine-core and worker processes descend from their replica) or
to Ray itself.

`macaron bench memory` deploys two topologies in turn on one local Ray cluster:

- before: local-cpu as it ran until 2026-12-04, three engines (a router engine
  of its own beside prefill and decode) of three processes each (Ray Serve
  LLM's default "mp" executor: Serve replica, vLLM engine core, worker);
- after: the committed profile (the router's hops on the prefill engine, and
  vLLM's "uni" executor: the model in the engine-core process).

For each: PSS once it has answered (idle), then its peak and mean, sampled
every `sample_s`, while `conversations` concurrent multi-turn conversations of
the suite's traces load it through the API for up to `load_s`. Then
token-for-token equality: the same route requests and the same greedy answers
(every specialist, through the answer deployment: prefill, NIXL, decode) sent
to both through Serve handles, the path the ingress takes; route labels and
answer texts must be equal. The route hop's latency on an idle topology is
reported beside it, since the lean one runs it on the (eager) prefill engine.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
import time
from pathlib import Path

import psutil

TARGET_PSS_GIB = 6.0
BEFORE_UPDATES = {
    "router": {"cpu_cores": "0", "kv_cache_gib": 0.125, "node_type": "cpu"},
    "prefill": {"kv_cache_gib": 0.125, "engine_kwargs": {"enforce_eager": True}},
    "executor": None,
}
"""local-cpu until 2026-12-04: a router engine of its own (compiled graphs, 0.125 GiB of KV),
prefill with 0.125 GiB of KV and first-come scheduling, and Ray Serve LLM's default executor."""
RAY_GROUP = "ray"
"""Everything that serves no deployment: GCS, raylet, dashboard, Serve's controller and proxy,
Ray Serve LLM's telemetry actor, the driver."""


def session_processes(session_name: str) -> list[psutil.Process]:
    """The processes whose command line names the session, and all their descendants.

    Ray's own daemons (GCS, raylet, dashboard, monitors) carry the session dir in
    their arguments; workers, Serve replicas and vLLM's engine processes descend
    from them.
    """
    roots = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(session_name in arg for arg in proc.info["cmdline"] or ()):
            roots.append(proc)
    seen: dict[int, psutil.Process] = {}
    for root in roots:
        for proc in [root, *_children(root)]:
            seen.setdefault(proc.pid, proc)
    return list(seen.values())


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _title(proc: psutil.Process) -> str:
    """The process title Ray and vLLM set (`ray::ServeReplica:macaron:Decode:base`, `VLLM::Worker`)."""
    cmdline = proc.cmdline()
    return cmdline[0] if cmdline else proc.name()


def process_rows(session_dir: Path) -> list[dict]:
    """Every process of the session: pid, title, the group it is charged to, PSS, USS and RSS (bytes)."""
    procs = {p.pid: p for p in session_processes(Path(session_dir).resolve().name)}
    titles, rows = {}, []
    for pid, proc in procs.items():
        try:
            titles[pid] = _title(proc)
        except psutil.Error:
            continue
    for pid, proc in procs.items():
        try:
            info = proc.memory_full_info()
            group = _group(proc, titles)
        except psutil.Error:
            continue  # ended while we looked
        rows.append({"pid": pid, "title": titles.get(pid, ""), "group": group,
                     "pss_bytes": info.pss, "uss_bytes": info.uss, "rss_bytes": info.rss})
    rows.sort(key=lambda r: -r["pss_bytes"])
    return rows


def _group(proc: psutil.Process, titles: dict[int, str]) -> str:
    """The Serve deployment a process serves (itself a replica, or descended from one), else Ray."""
    prefix = "ray::ServeReplica:"
    while proc is not None:
        title = titles.get(proc.pid, "")
        if title.startswith(prefix):
            # app:Deployment, or app:Deployment.method while the replica runs a call
            return title[len(prefix):].split(":", 1)[-1].split(".", 1)[0]
        proc = proc.parent()
    return RAY_GROUP


def topology_memory(session_dir: Path) -> dict:
    """RSS and PSS sums (bytes) of the session's processes, by group, and the five largest by PSS."""
    rows = process_rows(session_dir)
    groups: dict[str, dict] = {}
    for row in rows:
        g = groups.setdefault(row["group"], {"processes": 0, "pss_bytes": 0})
        g["processes"] += 1
        g["pss_bytes"] += row["pss_bytes"]
    return {"processes": len(rows), "rss_bytes": sum(r["rss_bytes"] for r in rows),
            "pss_bytes": sum(r["pss_bytes"] for r in rows), "groups": groups,
            "largest_pss": [{"name": r["title"], "pss_bytes": r["pss_bytes"]} for r in rows[:5]]}


class PeakSampler:
    """PSS of the session every `interval_s` on a thread, until `stop()`: peak and mean."""

    def __init__(self, session_dir: Path, interval_s: float):
        self.session_dir, self.interval_s = session_dir, interval_s
        self.samples: list[int] = []
        self.peak: dict | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss-sampler", daemon=True)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            memory = topology_memory(self.session_dir)
            self.samples.append(memory["pss_bytes"])
            if self.peak is None or memory["pss_bytes"] > self.peak["pss_bytes"]:
                self.peak = memory
            self._stop.wait(self.interval_s)

    def summary(self) -> dict:
        return {"samples": len(self.samples), "peak": self.peak,
                "mean_pss_bytes": sum(self.samples) / len(self.samples) if self.samples else None}


def before_config(profile: Path, out: Path, *, port: int, store: Path) -> Path:
    """The profile as local-cpu ran until 2026-12-04 (`BEFORE_UPDATES`), on `port` with `store`."""
    import yaml

    from macaron_ray.serve.local_cluster import serve_config_with

    doc = yaml.safe_load(Path(profile).read_text())
    engine_kwargs = {k: v for k, v in doc["applications"][0]["args"]["engine_kwargs"].items()
                     if k != "distributed_executor_backend"}
    return serve_config_with(profile, out, port=port,
                             args_updates={"router": dict(BEFORE_UPDATES["router"]), "engine_kwargs": engine_kwargs,
                                           "store": {"kind": "sqlite", "path": str(store)}},
                             role_updates={"prefill": copy.deepcopy(BEFORE_UPDATES["prefill"])})


def prompts_from_traces(count: int) -> list[str]:
    """The first user message of each trace conversation, then the second ones, ...: `count` texts."""
    from macaron_ray.loadtest.traces import load_traces

    convs = load_traces().conversations
    texts = [c.turns[n].user for n in range(max(len(c.turns) for c in convs)) for c in convs if n < len(c.turns)]
    return texts[:count]


async def greedy_outputs(args, prompts: list[str], answer_tokens: int) -> dict:
    """Route label (and route hop seconds) of each prompt from the router's deployment, and the greedy
    answer of every specialist from the answer deployment, through Serve handles as the ingress calls them."""
    from ray import serve

    from macaron_ray.core import route_hop
    from macaron_ray.core.engine_client import EngineRequest
    from macaron_ray.serve.handle_engine import ServeHandleEngine

    def engine(role: str) -> ServeHandleEngine:
        return ServeHandleEngine(serve.get_deployment_handle(args.deployment_name(role), "macaron"))

    async def text_of(eng: ServeHandleEngine, request: EngineRequest) -> str:
        return "".join([d.text async for d in eng.stream(request)])

    router, answer = engine(args.router_role()), engine(args.answer_role())
    registry = args.registry()
    l0 = registry.adapter("L0")
    routes, route_s, answers = [], [], {}
    for text in prompts:
        started = time.perf_counter()
        output = await text_of(router, route_hop.route_request(l0, text))
        route_s.append(time.perf_counter() - started)
        routes.append(route_hop.parse_label(output))
    for spec in registry.specialists:
        answers[spec.label] = [await text_of(answer, EngineRequest(
            adapter=spec.adapter_id, messages=[{"role": "user", "content": text}], max_tokens=answer_tokens))
            for text in prompts]
    return {"routes": routes, "route_s": route_s, "answers": answers}


def measure(cluster, config: Path, *, url: str, conversations: int, load_s: float, max_tokens: int,
            prompts: list[str], answer_tokens: int, sample_s: float, log_dir: Path, name: str) -> dict:
    """Deploy one topology, measure it, delete it (its engines give the cores back)."""
    from ray import serve

    from macaron_ray.bench.stats import percentile
    from macaron_ray.loadtest import main as loadtest
    from macaron_ray.loadtest.client import LoadConfig
    from macaron_ray.serve.args import load_profile

    args = load_profile(config)
    started = time.monotonic()
    cluster.serve_deploy(config)
    cluster.wait_running("macaron", args.deployment_names())
    result: dict = {"deployments": sorted(args.deployment_names()), "deploy_s": time.monotonic() - started}
    outputs = asyncio.run(greedy_outputs(args, prompts, answer_tokens))
    result["outputs"] = outputs
    result["route_hop_p50_s"] = percentile(outputs["route_s"], 50)
    time.sleep(2 * sample_s)
    result["idle"] = topology_memory(cluster.session_dir)
    cfg = LoadConfig(url=url, model=args.public_model, conversations=conversations, max_requests=50 * conversations,
                     duration_s=load_s, max_tokens=max_tokens)
    with PeakSampler(cluster.session_dir, sample_s) as sampler:
        report = loadtest.run(cfg, (conversations,), log_dir / f"bench-memory-{name}-loadtest.json", progress=False)
    level = report["levels"][0]
    result["load"] = {"conversations": conversations, "load_s": load_s, "requests": level["requests"],
                      "wall_s": level["wall_s"],
                      "hops_s": level["hops_s"], **sampler.summary()}
    result["processes"] = process_rows(cluster.session_dir)
    serve.delete("macaron")
    return result


def run(profile: Path, out: Path, *, conversations: int = 8, load_s: float = 90.0, max_tokens: int = 32,
        prompt_count: int = 12, answer_tokens: int = 24, sample_s: float = 3.0,
        log_dir: Path = Path(".bench")) -> dict:
    import ray

    from macaron_ray.engine.local_server import free_port
    from macaron_ray.serve.local_cluster import RAY_ENV, LocalRayCluster, serve_config_with

    os.environ.update(RAY_ENV)
    log_dir.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    stores = {name: log_dir / f"bench-memory-{name}.db" for name in ("before", "after")}
    for store in stores.values():
        store.unlink(missing_ok=True)
    configs = {
        "before": before_config(profile, log_dir / "bench-memory-before.yaml", port=port, store=stores["before"]),
        "after": serve_config_with(profile, log_dir / "bench-memory-after.yaml", port=port,
                                   args_updates={"store": {"kind": "sqlite", "path": str(stores["after"])}}),
    }
    prompts = prompts_from_traces(prompt_count)
    result: dict = {"profile": Path(profile).name, "target_pss_gib": TARGET_PSS_GIB, "before_updates": BEFORE_UPDATES,
                    "prompts": len(prompts), "answer_tokens": answer_tokens, "max_tokens": max_tokens}
    with LocalRayCluster(log_path=log_dir / "bench-memory-ray.log") as cluster:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        try:
            for name, config in configs.items():
                result[name] = measure(cluster, config, url=f"http://127.0.0.1:{port}", conversations=conversations,
                                       load_s=load_s, max_tokens=max_tokens, prompts=prompts,
                                       answer_tokens=answer_tokens, sample_s=sample_s, log_dir=log_dir, name=name)
                out.write_text(json.dumps(result, indent=2) + "\n")  # what was measured, if the rest fails
        finally:
            ray.shutdown()
    result.update(compare(result["before"], result["after"]))
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def compare(before: dict, after: dict) -> dict:
    """Equality of the two topologies' outputs, and the memory figures side by side."""
    b, a = before["outputs"], after["outputs"]
    same_routes = sum(x == y for x, y in zip(b["routes"], a["routes"]))
    pairs = [(x, y) for label in b["answers"] for x, y in zip(b["answers"][label], a["answers"][label])]
    same_answers = sum(x == y for x, y in pairs)
    peak = after["load"]["peak"]["pss_bytes"]
    return {
        "equal_routes": same_routes, "routes": len(b["routes"]),
        "equal_answers": same_answers, "answers": len(pairs),
        "token_for_token_equal": same_routes == len(b["routes"]) and same_answers == len(pairs),
        "pss_idle_ratio_after_over_before": after["idle"]["pss_bytes"] / before["idle"]["pss_bytes"],
        "pss_peak_ratio_after_over_before": peak / before["load"]["peak"]["pss_bytes"],
        "meets_target": peak <= TARGET_PSS_GIB * 2**30,
    }


def _gib(n: float | None) -> str:
    return f"{n / 2**30:5.2f}" if n is not None else "    -"


def format_report(result: dict) -> str:
    lines = [f"topology memory, PSS in GiB ({result['profile']}): before = three engines x three processes "
             f"(until 2026-12-04), after = the committed profile; same run"]
    for name in ("before", "after"):
        r = result[name]
        load = r["load"]
        groups = ", ".join(f"{g} {_gib(v['pss_bytes']).strip()} ({v['processes']})"
                           for g, v in sorted(r["idle"]["groups"].items(), key=lambda kv: -kv[1]["pss_bytes"]))
        lines.append(f"  {name:<6} idle {_gib(r['idle']['pss_bytes'])} over {r['idle']['processes']} processes; "
                     f"under load ({load['conversations']} conversations, {load['requests']['ok']} requests answered "
                     f"in {load['wall_s']:.0f} s) peak {_gib(load['peak']['pss_bytes'])}, mean "
                     f"{_gib(load['mean_pss_bytes'])} ({load['samples']} samples); "
                     f"route hop p50 idle {r['route_hop_p50_s'] * 1000:.0f} ms")
        lines.append(f"         idle by deployment (processes): {groups}")
    lines.append(f"  after / before: idle {result['pss_idle_ratio_after_over_before']:.2f}, "
                 f"peak {result['pss_peak_ratio_after_over_before']:.2f}; target peak <= {result['target_pss_gib']:g} GiB: "
                 f"{'met' if result['meets_target'] else 'NOT met'}")
    lines.append(f"  token for token: routes {result['equal_routes']}/{result['routes']} equal, greedy answers "
                 f"{result['equal_answers']}/{result['answers']} equal")
    return "\n".join(lines)
