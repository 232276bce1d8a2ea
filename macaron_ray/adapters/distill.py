"""Self-distillation of L0's chat answers: the base model's own answers, degenerate ones dropped.

L0 learns routing and summaries; its chat answers must stay the base's. So its
chat data is the base answering English chat requests of the training split
(generator and authored), at temperature 0, under the same chat template the
engine serves, kept only when the answer ended by itself (not cut by the
budget), has no repetition loop, does not echo the request, does not open with
an apology (the base's "I'm sorry for any confusion" answers nothing), is more
than a couple of words and carries no code block (chat is not L2's job). Other
languages are not distilled: the base answers them poorly (echoes, wrong
language), so the authored answers carry them. `macaron adapters distill` writes them to
`data/l0_chat_distilled.jsonl`, committed: training never needs an engine, and
the file is the exact data the adapter was trained on (its hash is in the
manifest). No request of the quality or routing benchmarks is distilled.
"""

from __future__ import annotations

import json
from pathlib import Path


from macaron_ray.adapters.routing_data import generate
from macaron_ray.adapters.routing_sets import DATA_DIR, authored

DISTILLED = DATA_DIR / "l0_chat_distilled.jsonl"
MAX_TOKENS = 256
GENERATOR_REQUESTS = 1200
"""Requests per label drawn from the generator's training split (about one in eight is English chat)."""
LANGUAGE = "en"


def prompts(seed: int = 0) -> list[str]:
    """The chat requests to distill: authored (training concepts) first, then the generator's."""
    from macaron_ray.bench.quality import held_out_texts

    seen = held_out_texts()
    out: list[str] = []
    for text in [r.text for r in authored("train") if r.label == "L0" and r.lang == LANGUAGE] + [
            e.text for e in generate("train", GENERATOR_REQUESTS, seed) if e.label == "L0" and e.lang == LANGUAGE]:
        key = " ".join(text.casefold().split())
        if key not in seen:
            seen.add(key)
            out.append(text)
    return out


def keep(ask: str, answer: str, finish_reason: str | None) -> bool:
    from macaron_ray.core.text import repetition_loop

    folded = " ".join(answer.casefold().split())
    return (finish_reason == "stop" and len(answer.split()) >= 3 and "```" not in answer
            and not repetition_loop(answer) and " ".join(ask.casefold().split()) not in folded
            and not folded.startswith(("i'm sorry", "i am sorry", "i apologize")))


def run(base_url: str, out: Path = DISTILLED, seed: int = 0) -> dict:
    from macaron_ray.bench.quality import BASE, Runner

    asks = prompts(seed)
    runner = Runner(base_url, {"L0": BASE})
    try:
        replies = runner.many([("L0", [{"role": "user", "content": a}], MAX_TOKENS, None) for a in asks])
    finally:
        runner.close()
    kept = [(a, r.text.strip()) for a, r in zip(asks, replies) if keep(a, r.text, r.finish_reason)]
    out.write_text("".join(json.dumps({"ask": a, "answer": t}, ensure_ascii=False) + "\n" for a, t in kept),
                   encoding="utf-8")
    return {"requests": len(asks), "kept": len(kept), "out": str(out)}


def load_distilled(path: Path = DISTILLED) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(r["ask"], r["answer"]) for r in rows]
