"""The multi-hop switching diagnostic on the real model, through the real TurnRunner."""

from __future__ import annotations

from macaron_ray.bench import multihop


def test_multihop_switching_and_prefix_reuse(engine, tmp_path):
    result = multihop.run(engine.spec.base_url, tmp_path / "multihop.json", answer_tokens=32)
    assert result["routed_right"] == result["turns"] == 24
    assert result["switches"] == {"right": 21, "expected": 21}
    assert result["reentries"] == {"right": 18, "expected": 18}
    for row in result["rows"]:
        if row["reentry"]:
            assert row["reentry_cached_share"] >= 0.90, row
    assert all(r["summary_s"] is not None for r in result["rows"])
