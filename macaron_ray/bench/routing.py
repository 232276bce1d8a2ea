"""`macaron bench routing`: L0 as the router on a real vLLM CPU engine, over the held-out split.

Each held-out request is sent alone (no batching) to L0 as the turn runner
sends it (`route_hop.route_request`: the labels' shared start prefilled, a
structured-output choice over their endings, temperature 0), streamed.
Route-hop latency is the client-side wall time of that request, after a warm-up
that fills the routing prompt's prefix cache.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import httpx

from macaron_ray.adapters.manifest import BUILT_DIR, Manifest
from macaron_ray.adapters.routing_data import HELDOUT_PER_LABEL, RouteExample, generate
from macaron_ray.bench.stats import percentile
from macaron_ray.core.route_hop import parse_label, route_request
from macaron_ray.engine.openai_http import request_body
from macaron_ray.specialists.labels import LABELS

TARGETS = {"accuracy": 0.97, "per_class_accuracy": 0.95, "compliance": 1.0, "p50_s": 0.15}


def route_once(client: httpx.Client, base_url: str, adapter_id: str, text: str) -> tuple[str, float]:
    body = request_body(route_request(adapter_id, text))
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


def evaluate(base_url: str, adapter_id: str, examples: list[RouteExample], warmup: int = 4) -> dict:
    confusion = {g: Counter() for g in LABELS}
    latencies, compliant, errors = [], 0, []
    with httpx.Client(timeout=60.0) as client:
        for ex in examples[:warmup]:
            route_once(client, base_url, adapter_id, ex.text)
        for ex in examples:
            output, elapsed = route_once(client, base_url, adapter_id, ex.text)
            latencies.append(elapsed)
            label = parse_label(output)
            compliant += label is not None
            confusion[ex.label][label or "invalid"] += 1
            if label != ex.label:
                errors.append({"text": ex.text, "gold": ex.label, "output": output, "template_id": ex.template_id})
    n = len(examples)
    correct = sum(confusion[g][g] for g in LABELS)
    per_class = {g: confusion[g][g] / max(1, sum(confusion[g].values())) for g in LABELS}
    result = {
        "samples": n,
        "accuracy": correct / n,
        "per_class_accuracy": per_class,
        "compliance": compliant / n,
        "confusion": {g: {p: confusion[g][p] for p in [*LABELS, "invalid"]} for g in LABELS},
        "latency_s": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
                      "mean": sum(latencies) / n},
    }
    result["errors"] = errors
    result["targets"] = TARGETS
    result["meets_targets"] = (result["accuracy"] >= TARGETS["accuracy"]
                               and min(per_class.values()) >= TARGETS["per_class_accuracy"]
                               and result["compliance"] >= TARGETS["compliance"]
                               and result["latency_s"]["p50"] <= TARGETS["p50_s"])
    return result


def format_report(result: dict) -> str:
    lines = [f"routing on {result['samples']} held-out samples (draw seed {result['seed']})",
             f"  accuracy     {result['accuracy']:.2%}",
             "  per class    " + "  ".join(f"{g} {a:.1%}" for g, a in result["per_class_accuracy"].items()),
             f"  compliance   {result['compliance']:.2%} canonical labels",
             f"  route hop    p50 {result['latency_s']['p50'] * 1000:.0f} ms, "
             f"p99 {result['latency_s']['p99'] * 1000:.0f} ms",
             "  confusion (gold -> predicted):",
             "        " + " ".join(f"{p:>7}" for p in [*LABELS, "invalid"])]
    for g, row in result["confusion"].items():
        lines.append(f"    {g}  " + " ".join(f"{row[p]:>7}" for p in [*LABELS, "invalid"]))
    lines.append(f"  targets met: {result['meets_targets']}")
    return "\n".join(lines)


def run(base_url: str, out: Path, per_label: int = HELDOUT_PER_LABEL, seed: int = 0) -> dict:
    adapter_id = Manifest.load(BUILT_DIR).adapter("L0").adapter_id
    result = {**evaluate(base_url, adapter_id, generate("heldout", per_label, seed)), "seed": seed}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result
