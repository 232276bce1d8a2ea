"""`macaron bench routing`: L0 as the router on a real vLLM CPU engine, over four sets reported apart.

    heldout    the generator's held-out split (frames and wordings no training example uses)
    authored   the authored requests of held-out concepts (routing_natural.tsv)
    field      the field set: written before any training decision, never trained on
    field2     the second field set (2026-12-07), written once the first had become a development set
    follow-up  held-out previous turns with a follow-up that stays, or a real switch: routed as
               the turn runner routes them, with the previous turn before the new message
               (`route_hop.RouteContext`); `--no-context-block` routes the new message alone

Each request is sent alone (no batching) to L0 as the turn runner sends it
(`route_hop.route_request`: the context block if any, the labels' shared start
prefilled, a structured-output choice over their endings, temperature 0),
streamed. Route-hop latency is the client-side wall time of that request, after
a warm-up that fills the routing prompt's prefix cache.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import httpx

from macaron_ray.adapters.manifest import BUILT_DIR, Manifest
from macaron_ray.adapters.routing_data import HELDOUT_PER_LABEL
from macaron_ray.bench.stats import percentile
from macaron_ray.core.route_hop import RouteContext, parse_label, route_request
from macaron_ray.engine.openai_http import request_body
from macaron_ray.specialists.labels import LABELS

TARGETS = {
    "heldout": {"accuracy": 0.97, "per_class_accuracy": 0.95},
    "authored": {"accuracy": 0.95},
    "field": {"accuracy": 0.95},
    "field2": {"accuracy": 0.95},
    "follow-up": {"accuracy": 0.95},
    "all": {"compliance": 1.0, "p50_s": 0.15},
}


def route_once(client: httpx.Client, base_url: str, adapter_id: str, text: str,
               context: RouteContext | None = None) -> tuple[str, float]:
    body = request_body(route_request(adapter_id, text, context=context))
    output = []
    started = time.perf_counter()
    with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(f"route request failed mid-stream: {chunk['error']}")
                output += [c["delta"].get("content") or "" for c in chunk.get("choices") or ()]
    return "".join(output), time.perf_counter() - started


def evaluate(base_url: str, adapter_id: str, examples: list, warmup: int = 4) -> dict:
    """Route every example (anything with `text`, `label` and optionally `context`)."""
    confusion = {g: Counter() for g in LABELS}
    latencies, compliant, errors = [], 0, []
    with httpx.Client(timeout=60.0) as client:
        for ex in examples[:warmup]:
            route_once(client, base_url, adapter_id, ex.text, getattr(ex, "context", None))
        for ex in examples:
            context = getattr(ex, "context", None)
            output, elapsed = route_once(client, base_url, adapter_id, ex.text, context)
            latencies.append(elapsed)
            label = parse_label(output)
            compliant += label is not None
            confusion[ex.label][label or "invalid"] += 1
            if label != ex.label:
                error = {"text": ex.text, "gold": ex.label, "output": output}
                if context is not None:
                    error["context"] = f"{context.label}: {context.text}"
                errors.append(error)
    n = len(examples)
    correct = sum(confusion[g][g] for g in LABELS)
    per_class = {g: confusion[g][g] / max(1, sum(confusion[g].values())) for g in LABELS}
    return {
        "samples": n,
        "accuracy": correct / n,
        "per_class_accuracy": per_class,
        "compliance": compliant / n,
        "confusion": {g: {p: confusion[g][p] for p in [*LABELS, "invalid"]} for g in LABELS},
        "latency_s": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
                      "mean": sum(latencies) / n},
        "errors": errors,
    }


def meets(name: str, result: dict) -> bool:
    target = {**TARGETS.get(name, {}), **TARGETS["all"]}
    return (result["accuracy"] >= target.get("accuracy", 0)
            and min(result["per_class_accuracy"].values()) >= target.get("per_class_accuracy", 0)
            and result["compliance"] >= target["compliance"] and result["latency_s"]["p50"] <= target["p50_s"])


def format_report(result: dict) -> str:
    lines = [f"routing (draw seed {result['seed']}, context block {'on' if result['context_block'] else 'off'}); targets: held-out >= 97 % and >= 95 % per class, "
             "authored / field / field2 / follow-up >= 95 %, 100 % canonical, route p50 <= 0.15 s",
             f"  {'set':<10} {'n':>4} {'accuracy':>9}  {'L0':>6} {'L1':>6} {'L2':>6} {'L3':>6}  "
             f"{'canon.':>7}  {'p50':>6} {'p99':>6}  met"]
    for name, r in result["sets"].items():
        per = r["per_class_accuracy"]
        lines.append(f"  {name:<10} {r['samples']:>4} {r['accuracy']:>9.2%}  "
                     + " ".join(f"{per[g]:>6.1%}" for g in LABELS)
                     + f"  {r['compliance']:>7.1%}  {r['latency_s']['p50'] * 1000:>4.0f}ms "
                     f"{r['latency_s']['p99'] * 1000:>4.0f}ms  {r['meets_targets']}")
    return "\n".join(lines)


def run(base_url: str, out: Path, per_label: int = HELDOUT_PER_LABEL, seed: int = 0,
        context_block: bool = True, built_dir: Path = BUILT_DIR) -> dict:
    from dataclasses import replace

    from macaron_ray.adapters.routing_sets import heldout_sets

    adapter_id = Manifest.load(built_dir).adapter("L0").adapter_id
    sets = {}
    for name, requests in heldout_sets(per_label, seed).items():
        if not context_block:
            requests = [replace(r, context=None) for r in requests]
        sets[name] = evaluate(base_url, adapter_id, requests)
        sets[name]["meets_targets"] = meets(name, sets[name])
    result = {"sets": sets, "seed": seed, "context_block": context_block, "targets": TARGETS,
              "meets_targets": all(r["meets_targets"] for r in sets.values())}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result
