"""`macaron bench multihop`: the report's multi-hop switching diagnostic on the real local model.

Three conversations of eight turns alternate between the personal agent (L1)
and coding (L2). Each turn goes through the real TurnRunner (route, answer on
the own-view, summary) against a vLLM CPU engine with base + four adapters.
Reported: turns routed right, switches, re-entries, and on every re-entry the
share of that specialist's previous own-view prompt served from the engine's
prefix cache (`cached_tokens / previous prompt tokens`), plus the cached share
of the whole prompt.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from macaron_ray.bench.stats import percentile
from macaron_ray.core.conversation import Message
from macaron_ray.core.registry import SpecialistRegistry
from macaron_ray.core.turn_runner import Sampling, TurnRequest, TurnRunner
from macaron_ray.engine.local_server import LocalEngineSpec
from macaron_ray.engine.openai_http import OpenAIHTTPEngine
from macaron_ray.store.base import tenant_id
from macaron_ray.store.sqlite import SQLiteStore

TRACES: list[list[str]] = [
    ["Book a table for two at Sakura tonight at 8pm.",
     "Write a Python function that checks if a string is a palindrome.",
     "Remind me to call the dentist tomorrow morning.",
     "Why does my JavaScript code throw 'undefined is not a function'?",
     "Send a message to Lucia saying the meeting moved to Friday.",
     "Write a SQL query that counts orders per customer.",
     "Schedule a haircut appointment for Saturday at 10am.",
     "Fix this Python bug: for i in range(len(xs)): print(xs[i+1])"],
    ["Order oat milk and bananas for delivery tomorrow.",
     "How do I undo the last commit with git?",
     "Book me a taxi to the airport at 6am on Monday.",
     "Write a bash script that deletes log files older than 7 days.",
     "Set a reminder to pay the electricity bill on Friday.",
     "Write a Rust function that sums a vector of integers.",
     "Text Omar that I'll be ten minutes late.",
     "Explain this error in my Go code: index out of range."],
    ["Reserve a hotel room in Lisbon for next weekend.",
     "Write a JavaScript function that debounces another function.",
     "Cancel my dentist appointment on Thursday.",
     "Write a regex that matches US zip codes.",
     "Email my landlord that the heating is broken.",
     "Write unit tests in Python for a function that adds two numbers.",
     "Book a flight to Tokyo for next Tuesday.",
     "Why does my Java program throw a NullPointerException?"],
]
EXPECTED = ["L1", "L2"] * 4
TARGET_REENTRY_CACHED_SHARE = 0.90
BLOCK_SIZE = LocalEngineSpec.block_size
"""The engine's KV block size: its prefix cache holds whole blocks only, so the part of a previous
prompt it can serve is its whole blocks (a short prompt whose answer did not fill its last block
loses up to a block: 96 of 112 tokens is 85.7 %, and all that can be cached)."""


async def run_trace(runner: TurnRunner, conv: int, texts: list[str], answer_tokens: int) -> list[dict]:
    tenant = tenant_id(f"multihop-{conv}")
    messages: list[Message] = []
    rows: list[dict] = []
    last_prompt_tokens: dict[str, int] = {}
    prev_label = None
    for i, text in enumerate(texts):
        messages.append(Message(role="user", content=text))
        answer, final = [], None
        async for ev in runner.run(TurnRequest(tenant=tenant, messages=tuple(messages),
                                               sampling=Sampling(max_tokens=answer_tokens, temperature=0.0))):
            if ev.final:
                final = ev
            else:
                answer.append(ev.text)
        messages.append(Message(role="assistant", content="".join(answer)))
        meta = await runner.wait_summary(tenant, final.turn_key)
        label = final.label
        reentry = label in last_prompt_tokens and prev_label != label
        prev = last_prompt_tokens.get(label)
        usage = final.usage
        rows.append({
            "conversation": conv, "turn": i + 1, "expected": EXPECTED[i], "routed": label,
            "switch": prev_label is not None and prev_label != label, "reentry": reentry,
            "prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.cached_tokens,
            "previous_own_prompt_tokens": prev if reentry else None,
            "reentry_cached_share": (min(1.0, usage.cached_tokens / prev) if reentry and prev else None),
            "reentry_whole_blocks_reused": (usage.cached_tokens >= prev // BLOCK_SIZE * BLOCK_SIZE
                                            if reentry and prev else None),
            "prompt_cached_share": usage.cached_tokens / usage.prompt_tokens if usage.prompt_tokens else 0.0,
            "route_s": final.timing.route_s, "answer_ttft_s": final.timing.answer_ttft_s,
            "answer_s": final.timing.answer_s, "summary_s": meta.summary_s if meta else None,
        })
        last_prompt_tokens[label] = usage.prompt_tokens
        prev_label = label
    return rows


async def _run(base_url: str, answer_tokens: int) -> dict:
    engine = OpenAIHTTPEngine(base_url)
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "multihop.db")
        runner = TurnRunner(SpecialistRegistry.from_manifest(), engine, store)
        rows = []
        for conv, texts in enumerate(TRACES):
            rows += await run_trace(runner, conv, texts, answer_tokens)
        await runner.drain()
        await store.close()
    await engine.aclose()
    return summarize(rows)


def summarize(rows: list[dict]) -> dict:
    expected_switches = sum(1 for r in rows if r["turn"] > 1 and EXPECTED[r["turn"] - 1] != EXPECTED[r["turn"] - 2])
    expected_reentries = sum(1 for r in rows if r["turn"] > 2)
    routed_right = sum(r["routed"] == r["expected"] for r in rows)
    right_switches = sum(1 for r in rows if r["switch"] and r["routed"] == r["expected"])
    right_reentries = [r for r in rows if r["reentry"] and r["routed"] == r["expected"]]
    shares = [r["reentry_cached_share"] for r in right_reentries]
    hop = {k: sum(r[k] for r in rows if r[k] is not None) / max(1, sum(r[k] is not None for r in rows))
           for k in ("route_s", "answer_ttft_s", "answer_s", "summary_s")}
    return {
        "turns": len(rows), "routed_right": routed_right,
        "switches": {"right": right_switches, "expected": expected_switches},
        "reentries": {"right": len(right_reentries), "expected": expected_reentries},
        "reentry_cached_share": {"min": min(shares) if shares else None,
                                 "p50": percentile(shares, 50) if shares else None,
                                 "all_at_least_target": bool(shares) and min(shares) >= TARGET_REENTRY_CACHED_SHARE},
        "reentry_whole_blocks_reused": all(r["reentry_whole_blocks_reused"] for r in right_reentries),
        "prompt_cached_share_mean": sum(r["prompt_cached_share"] for r in rows) / len(rows),
        "mean_hop_s": hop,
        "target_reentry_cached_share": TARGET_REENTRY_CACHED_SHARE,
        "rows": rows,
    }


def format_report(result: dict) -> str:
    s = result["reentry_cached_share"]
    lines = [f"multi-hop: {len(TRACES)} conversations x 8 turns (L1/L2 alternating)",
             f"  turns routed right  {result['routed_right']}/{result['turns']}",
             f"  switches            {result['switches']['right']}/{result['switches']['expected']}",
             f"  re-entries          {result['reentries']['right']}/{result['reentries']['expected']}",
             "  re-entry cached share of previous own-view prompt: min "
             + (f"{s['min']:.1%}, p50 {s['p50']:.1%}" if s["min"] is not None else "n/a")
             + f" (target >= {result['target_reentry_cached_share']:.0%}); every whole block of it reused: "
             + str(result["reentry_whole_blocks_reused"]),
             f"  cached share of the whole prompt (mean) {result['prompt_cached_share_mean']:.1%}",
             "  mean hop seconds    " + ", ".join(f"{k} {v:.3f}" for k, v in result["mean_hop_s"].items())]
    return "\n".join(lines)


def run(base_url: str, out: Path, answer_tokens: int = 48) -> dict:
    result = asyncio.run(_run(base_url, answer_tokens))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result
