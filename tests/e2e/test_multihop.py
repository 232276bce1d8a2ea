"""The multi-hop switching diagnostic on the real model, through the real TurnRunner."""

from __future__ import annotations

from macaron_ray.bench import multihop


def test_multihop_switching_and_prefix_reuse(engine, tmp_path):
    result = multihop.run(engine.spec.base_url, tmp_path / "multihop.json", answer_tokens=32)
    assert result["routed_right"] == result["turns"] == 24
    assert result["switches"] == {"right": 21, "expected": 21}
    assert result["reentries"] == {"right": 18, "expected": 18}
    assert engine.spec.block_size == multihop.BLOCK_SIZE
    for row in result["rows"]:
        if row["reentry"]:
            # Own-view is append-only: every whole KV block of the specialist's previous prompt is
            # served from the prefix cache (only whole blocks are cached; the share is reported).
            block = engine.spec.block_size
            assert row["cached_tokens"] >= row["previous_own_prompt_tokens"] // block * block, row
            assert row["reentry_whole_blocks_reused"], row
    assert all(r["summary_s"] is not None for r in result["rows"])
