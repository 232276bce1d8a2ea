"""`macaron bench ownview`: own-view against the naive baseline, in one run on one engine.

The suite's traces (`loadtest/data/traces.yaml`: 48 turns over all four
specialists, tool turns answered) are replayed twice through the real
TurnRunner: once with own-view, once with the naive view (every specialist
prompted with the whole history, other specialists' answers verbatim). Each
replay opens its conversations with an instruction of its own, so the two never
share a cached prefix. Reported per view: prompt tokens the engine had to
compute per answer hop (prompt minus prefix-cached), answer TTFT, and on
re-entry turns the share of the specialist's previous own-view prompt served
from the cache (target >= 90 %); then naive / own ratios.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from macaron_ray.bench.stats import percentile
from macaron_ray.core.conversation import FunctionCall, Message, ToolCall
from macaron_ray.core.registry import SpecialistRegistry
from macaron_ray.core.turn_runner import Sampling, TurnRequest, TurnRunner
from macaron_ray.engine.openai_http import OpenAIHTTPEngine
from macaron_ray.loadtest.traces import Traces, load_traces
from macaron_ray.store.base import tenant_id
from macaron_ray.store.sqlite import SQLiteStore

TARGET_REENTRY_CACHED_SHARE = 0.90


async def _turn(runner: TurnRunner, tenant: str, messages: list[Message], tools, answer_tokens: int):
    text, final = [], None
    async for ev in runner.run(TurnRequest(tenant=tenant, messages=tuple(messages), tools=tools,
                                           sampling=Sampling(max_tokens=answer_tokens, temperature=0.0))):
        if ev.final:
            final = ev
        else:
            text.append(ev.text)
    return "".join(text), final


async def replay(runner: TurnRunner, traces: Traces, view: str, answer_tokens: int) -> list[dict]:
    rows: list[dict] = []
    for conv in traces.conversations:
        tenant = tenant_id(f"ownview-{view}-{conv.name}")
        messages = [Message(role="system", content=f"Benchmark replay ({view} view): {conv.name}.")]
        last_prompt: dict[str, int] = {}
        previous = None
        for n, turn in enumerate(conv.turns):
            messages.append(Message(role="user", content=turn.user))
            tools = list(traces.tools) if turn.tools else None
            text, final = await _turn(runner, tenant, messages, tools, answer_tokens)
            await runner.wait_summary(tenant, final.turn_key)
            label, usage = final.label, final.usage
            reentry = label in last_prompt and previous != label
            rows.append({
                "conversation": conv.name, "turn": n, "label": label, "expected": turn.expect, "reentry": reentry,
                "prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.cached_tokens,
                "computed_tokens": usage.prompt_tokens - usage.cached_tokens,
                "reentry_cached_share": (min(1.0, usage.cached_tokens / last_prompt[label]) if reentry else None),
                "answer_ttft_s": final.timing.answer_ttft_s,
            })
            last_prompt[label], previous = usage.prompt_tokens, label
            if final.tool_calls and turn.tool_result is not None:
                calls = tuple(ToolCall(id=c.id, function=FunctionCall(name=c.function.name,
                                                                      arguments=c.function.arguments))
                              for c in final.tool_calls)
                messages += [Message(role="assistant", tool_calls=calls),
                             *(Message(role="tool", tool_call_id=c.id, content=turn.tool_result) for c in calls)]
                text, final = await _turn(runner, tenant, messages, tools, answer_tokens)
                last_prompt[label] = final.usage.prompt_tokens
            messages.append(Message(role="assistant", content=text or "(done)"))
    return rows


def _summary(rows: list[dict]) -> dict:
    shares = [r["reentry_cached_share"] for r in rows if r["reentry_cached_share"] is not None]
    ttft = [r["answer_ttft_s"] for r in rows]
    return {
        "turns": len(rows), "reentries": len(shares),
        "computed_tokens_mean": sum(r["computed_tokens"] for r in rows) / len(rows),
        "prompt_tokens_mean": sum(r["prompt_tokens"] for r in rows) / len(rows),
        "prompt_cached_share": sum(r["cached_tokens"] for r in rows) / max(1, sum(r["prompt_tokens"] for r in rows)),
        "answer_ttft_s": {"mean": sum(ttft) / len(ttft), "p50": percentile(ttft, 50), "p95": percentile(ttft, 95)},
        "reentry_cached_share": {"min": min(shares) if shares else None,
                                 "p50": percentile(shares, 50) if shares else None},
    }


async def _run(base_url: str, answer_tokens: int) -> dict:
    traces = load_traces()
    engine = OpenAIHTTPEngine(base_url)
    result: dict = {"views": {}, "target_reentry_cached_share": TARGET_REENTRY_CACHED_SHARE}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for view in ("own", "naive"):
                store = SQLiteStore(Path(tmp) / f"{view}.db")
                runner = TurnRunner(SpecialistRegistry.from_manifest(), engine, store, view=view)
                rows = await replay(runner, traces, view, answer_tokens)
                await runner.drain()
                await store.close()
                result["views"][view] = {**_summary(rows), "rows": rows}
    finally:
        await engine.aclose()
    own, naive = result["views"]["own"], result["views"]["naive"]
    result["naive_over_own"] = {
        "computed_tokens": naive["computed_tokens_mean"] / own["computed_tokens_mean"],
        "prompt_tokens": naive["prompt_tokens_mean"] / own["prompt_tokens_mean"],
        "answer_ttft_mean": naive["answer_ttft_s"]["mean"] / own["answer_ttft_s"]["mean"],
    }
    share = own["reentry_cached_share"]["min"]
    result["meets_target"] = share is not None and share >= TARGET_REENTRY_CACHED_SHARE
    return result


def run(base_url: str, out: Path, answer_tokens: int = 48) -> dict:
    result = asyncio.run(_run(base_url, answer_tokens))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_report(result: dict) -> str:
    lines = ["own-view vs naive: the suite's traces replayed through the TurnRunner, one engine, same run",
             f"  {'view':<6} {'turns':>5} {'prompt':>7} {'computed':>8} {'cached':>7} {'TTFT mean':>9} "
             f"{'TTFT p95':>8} {'re-entry cached (min / p50)':>28}"]
    for view, v in result["views"].items():
        s = v["reentry_cached_share"]
        reentry = f"{s['min']:.1%} / {s['p50']:.1%}" if s["min"] is not None else "-"
        lines.append(f"  {view:<6} {v['turns']:>5} {v['prompt_tokens_mean']:>7.0f} {v['computed_tokens_mean']:>8.0f} "
                     f"{v['prompt_cached_share']:>7.1%} {v['answer_ttft_s']['mean']:>8.3f}s "
                     f"{v['answer_ttft_s']['p95']:>7.3f}s {reentry:>28}")
    r = result["naive_over_own"]
    lines.append(f"  naive / own: computed prompt tokens {r['computed_tokens']:.2f}x, prompt tokens "
                 f"{r['prompt_tokens']:.2f}x, answer TTFT {r['answer_ttft_mean']:.2f}x; "
                 f"re-entry target >= {result['target_reentry_cached_share']:.0%}: met {result['meets_target']}")
    return "\n".join(lines)
