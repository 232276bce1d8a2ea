"""`macaron bench routing`: which requests it sends for each set and what its JSON records."""

from __future__ import annotations

import json

from macaron_ray.adapters.routing_data import generate
from macaron_ray.adapters.routing_sets import authored, field_set, followups
from macaron_ray.bench import routing
from macaron_ray.cli import build_parser


def test_the_cli_defaults_to_the_benchmark_draw():
    args = build_parser().parse_args(["bench", "routing"])
    assert (args.per_label, args.seed) == (routing.HELDOUT_PER_LABEL, 0)


def test_each_set_is_sent_and_reported_apart_and_a_seed_draws_other_heldout_requests(monkeypatch, tmp_path):
    sent: dict[str, list] = {}

    def evaluate(base_url, adapter_id, examples):
        sent.setdefault(examples[0].source, []).append(examples)
        n = len(examples)
        return {"samples": n, "accuracy": 1.0, "per_class_accuracy": {"L0": 1.0}, "compliance": 1.0,
                "latency_s": {"p50": 0.1, "p99": 0.2}}

    monkeypatch.setattr(routing, "evaluate", evaluate)
    monkeypatch.setattr(routing, "format_report", lambda result: "report")
    out = tmp_path / "routing.json"
    for seed in ("1", "0"):
        args = build_parser().parse_args(["bench", "routing", "--per-label", "5", "--seed", seed,
                                          "--base-url", "http://127.0.0.1:1", "--out", str(out)])
        assert args.func(args) == 0
    assert [[r.text for r in s] for s in sent["generator"]] == [
        [e.text for e in generate("heldout", 5, 1)], [e.text for e in generate("heldout", 5, 0)]]
    assert sent["authored"][0] == authored("heldout") and sent["field"][0] == field_set()
    # The turn runner shows L0 the previous turn: so does the benchmark unless asked otherwise.
    assert sent["follow-up"][1] == followups("heldout", 0) and all(r.context for r in sent["follow-up"][1])
    report = json.loads(out.read_text())
    assert report["seed"] == 0 and set(report["sets"]) == {"heldout", "authored", "field", "field2", "follow-up"}
    assert report["context_block"] is True
    args = build_parser().parse_args(["bench", "routing", "--per-label", "5", "--no-context-block",
                                      "--base-url", "http://127.0.0.1:1", "--out", str(out)])
    assert args.func(args) == 0
    assert [r.text for r in sent["follow-up"][2]] == [r.text for r in followups("heldout", 0)]
    assert all(r.context is None for r in sent["follow-up"][2])
    assert report["sets"]["field"]["samples"] == len(field_set())


def test_a_set_misses_its_target_on_accuracy_class_compliance_or_latency():
    good = {"accuracy": 0.98, "per_class_accuracy": {"L0": 0.96, "L1": 0.99}, "compliance": 1.0,
            "latency_s": {"p50": 0.1}}
    assert routing.meets("heldout", good)
    assert not routing.meets("heldout", {**good, "per_class_accuracy": {"L0": 0.9, "L1": 1.0}})
    assert not routing.meets("field", {**good, "accuracy": 0.94})
    assert not routing.meets("follow-up", {**good, "compliance": 0.99})
    assert not routing.meets("authored", {**good, "latency_s": {"p50": 0.2}})
