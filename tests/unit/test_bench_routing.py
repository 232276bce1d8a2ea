"""`macaron bench routing`: which held-out requests it sends and what its JSON records."""

from __future__ import annotations

import json

from macaron_ray.adapters.routing_data import generate
from macaron_ray.bench import routing
from macaron_ray.cli import build_parser


def test_the_cli_defaults_to_the_benchmark_draw():
    args = build_parser().parse_args(["bench", "routing"])
    assert (args.per_label, args.seed) == (routing.HELDOUT_PER_LABEL, 0)


def test_a_seed_draws_other_heldout_requests_and_is_recorded(monkeypatch, tmp_path):
    sent = []

    def evaluate(base_url, adapter_id, examples):
        sent.append(examples)
        return {"samples": len(examples)}

    monkeypatch.setattr(routing, "evaluate", evaluate)
    monkeypatch.setattr(routing, "format_report", lambda result: "report")
    out = tmp_path / "routing.json"
    for seed in ("1", "0"):
        args = build_parser().parse_args(["bench", "routing", "--per-label", "5", "--seed", seed,
                                          "--base-url", "http://127.0.0.1:1", "--out", str(out)])
        assert args.func(args) == 0
    assert sent == [generate("heldout", 5, 1), generate("heldout", 5, 0)]
    assert sent[0] != sent[1]
    assert json.loads(out.read_text()) == {"samples": 20, "seed": 0}
