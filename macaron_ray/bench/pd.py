"""`macaron bench pd`: decode pace of running conversations while long prompts keep arriving,
prefill/decode disaggregated (local-cpu) against aggregated (local-cpu-aggregated), in one run.

Both profiles are deployed in turn on one local Ray cluster and driven through
the answer deployment's Serve handle (the path the ingress takes for answer
hops), so the figures are the engines' and Serve's, not the route hop's:

- `conversations` closed loops each stream a short-prompt answer of exactly
  `answer_tokens` tokens (`ignore_eos`; PD's prefill request caps `max_tokens`
  at 1, so `min_tokens` cannot be used), one after another,
  under the specialists' adapters;
- one closed loop sends long prompts (>= `long_prompt_tokens`, a fresh text each
  time so the prefix cache cannot absorb them) with a short answer.

Per request: TTFT (first streamed token) and TPOT = (last - first token time) /
(completion tokens - 1), vLLM's benchmark definition; per streamed chunk: the
gap since the previous one (a prefill that stalls decode shows there whole,
where TPOT spreads it over the answer; Ray Serve LLM batches stream chunks
every 50 ms, so gaps start there). The figure of merit is the running
conversations' TPOT p99, PD over aggregated (target <= 0.5); the gap p99 ratio
is reported beside it. Both topologies get both cores for answers: PD's
prefill (core 0) and decode (core 1), the aggregated answer engine cores 0-1
(the router, idle here, keeps core 0 in both). The PD topology's memory (PSS
and RSS of every process of the Ray session) is measured once it has served
the load.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path

from macaron_ray.bench.memory import topology_memory
from macaron_ray.bench.stats import percentile
from macaron_ray.serve.args import AppArgs, load_profile
from macaron_ray.serve.local_cluster import RAY_ENV, LocalRayCluster, serve_config_with

TARGET_TPOT_P99_RATIO = 0.5
_WORDS = ("river stone market lantern orchard harbor violet engine meadow copper signal garden winter "
          "thunder ribbon candle marble forest pepper silver window ladder comet velvet anchor island "
          "falcon pillow quartz saddle timber walnut basket cobalt dragon ember fossil glacier hazel").split()


def long_prompt(rng: random.Random, words: int) -> str:
    """A fresh document of `words` words: never a prefix-cache hit for another one."""
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return f"Read this log and say which word comes first.\n\n{body}"


async def _one(handle, request_cls, adapter: str, text: str, max_tokens: int, *, exact: bool) -> dict:
    from macaron_ray.serve.handle_engine import sse_payloads

    body = request_cls(model=adapter, messages=[{"role": "user", "content": text}], stream=True,
                       stream_options={"include_usage": True}, temperature=0.0, max_tokens=max_tokens,
                       ignore_eos=exact)
    started = time.perf_counter()
    arrivals = []
    usage = {}
    async for item in handle.chat.remote(body):
        now = time.perf_counter()
        for data in sse_payloads(item):
            if data == "[DONE]":
                continue
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                if not arrivals or arrivals[-1] != now:
                    arrivals.append(now)
    tokens = usage.get("completion_tokens", 0)
    first, last = (arrivals[0], arrivals[-1]) if arrivals else (None, None)
    return {"ttft_s": (first or time.perf_counter()) - started,
            "tpot_s": (last - first) / (tokens - 1) if first and tokens > 1 else None,
            "gaps_s": [b - a for a, b in zip(arrivals, arrivals[1:])],
            "prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": tokens}


async def drive(handle, adapters: list[str], *, conversations: int, answer_tokens: int, long_prompt_words: int,
                duration_s: float, seed: int = 0) -> dict:
    """Run the two loops for `duration_s` against one answer deployment; summarize."""
    from ray.serve.llm.openai_api_models import ChatCompletionRequest

    rng = random.Random(seed)
    # Warm-up: every adapter once, and one long prompt (the first NIXL transfer pays the handshake).
    for adapter in adapters:
        await _one(handle, ChatCompletionRequest, adapter, "Say hello.", 4, exact=False)
    await _one(handle, ChatCompletionRequest, adapters[0], long_prompt(rng, long_prompt_words), 2, exact=False)

    deadline = time.monotonic() + duration_s
    running, longs = [], []

    async def conversation(i: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            n += 1
            running.append(await _one(handle, ChatCompletionRequest, adapters[i % len(adapters)],
                                      f"Conversation {i}, turn {n}: tell me about rivers.", answer_tokens,
                                      exact=True))

    async def long_prompts() -> None:
        while time.monotonic() < deadline:
            longs.append(await _one(handle, ChatCompletionRequest, adapters[0],
                                    long_prompt(rng, long_prompt_words), 4, exact=False))

    await asyncio.gather(long_prompts(), *(conversation(i) for i in range(conversations)))
    tpot = [r["tpot_s"] for r in running if r["tpot_s"] is not None]
    gaps = [g for r in running for g in r["gaps_s"]]
    return {
        "running": {"requests": len(running), "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
                    "stream_gaps": len(gaps), "gap_p50_s": percentile(gaps, 50), "gap_p99_s": percentile(gaps, 99),
                    "ttft_p50_s": percentile([r["ttft_s"] for r in running], 50),
                    "ttft_p99_s": percentile([r["ttft_s"] for r in running], 99)},
        "long_prompts": {"requests": len(longs), "prompt_tokens_min": min(r["prompt_tokens"] for r in longs),
                         "ttft_p50_s": percentile([r["ttft_s"] for r in longs], 50),
                         "ttft_p99_s": percentile([r["ttft_s"] for r in longs], 99)},
    }


def run(pd_profile: Path, aggregated_profile: Path, out: Path, *, conversations: int = 3, answer_tokens: int = 32,
        long_prompt_words: int = 1500, duration_s: float = 90.0, aggregated_cores: str = "0-1",
        log_dir: Path = Path(".bench")) -> dict:
    import ray
    from ray import serve

    os.environ.update(RAY_ENV)
    log_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"conversations": conversations, "answer_tokens": answer_tokens, "duration_s": duration_s,
                    "aggregated_answer_cores": aggregated_cores}
    out.parent.mkdir(parents=True, exist_ok=True)
    with LocalRayCluster(log_path=log_dir / "bench-pd-ray.log") as cluster:
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        try:
            for name, path in (("pd", pd_profile), ("aggregated", aggregated_profile)):
                config = serve_config_with(path, log_dir / f"bench-pd-{name}.yaml",
                                           role_updates={"answer": {"cpu_cores": aggregated_cores}})
                args: AppArgs = load_profile(config)
                cluster.serve_deploy(config)
                cluster.wait_running("macaron", args.deployment_names())
                handle = serve.get_deployment_handle(args.deployment_name(args.answer_role()), "macaron")
                handle = handle.options(stream=True)
                adapters = [a.adapter_id for a in args.adapter_list()]
                result[name] = asyncio.run(drive(handle, adapters, conversations=conversations,
                                                 answer_tokens=answer_tokens, long_prompt_words=long_prompt_words,
                                                 duration_s=duration_s))
                if name == "pd":
                    result["pd_memory"] = topology_memory(cluster.session_dir)
                out.write_text(json.dumps(result, indent=2) + "\n")  # what was measured, if the rest fails
                serve.delete("macaron")  # engines and all: the next topology gets the cores
        finally:
            ray.shutdown()
    ratio = result["pd"]["running"]["tpot_p99_s"] / result["aggregated"]["running"]["tpot_p99_s"]
    result["tpot_p99_ratio_pd_over_aggregated"] = ratio
    result["gap_p99_ratio_pd_over_aggregated"] = (result["pd"]["running"]["gap_p99_s"]
                                                  / result["aggregated"]["running"]["gap_p99_s"])
    result["target_ratio"] = TARGET_TPOT_P99_RATIO
    result["meets_target"] = ratio <= TARGET_TPOT_P99_RATIO
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def format_report(result: dict) -> str:
    lines = [f"decode pace under long prompts: {result['conversations']} running conversations x "
             f"{result['answer_tokens']} tokens, {result['duration_s']:.0f} s per topology"]
    for name in ("pd", "aggregated"):
        r, lp = result[name]["running"], result[name]["long_prompts"]
        lines.append(f"  {name:<10} TPOT p50 {r['tpot_p50_s'] * 1000:6.1f} ms  p99 {r['tpot_p99_s'] * 1000:6.1f} ms"
                     f"  stream gap p99 {r['gap_p99_s'] * 1000:6.1f} ms"
                     f"  TTFT p50 {r['ttft_p50_s']:.2f} s  ({r['requests']} answers);"
                     f"  long prompts ({lp['prompt_tokens_min']}+ tokens) TTFT p50 {lp['ttft_p50_s']:.2f} s"
                     f"  p99 {lp['ttft_p99_s']:.2f} s ({lp['requests']})")
    mem = result["pd_memory"]
    lines.append(f"  TPOT p99 PD / aggregated = {result['tpot_p99_ratio_pd_over_aggregated']:.2f} "
                 f"(target <= {result['target_ratio']}): {'met' if result['meets_target'] else 'NOT met'}; "
                 f"stream gap p99 ratio {result['gap_p99_ratio_pd_over_aggregated']:.2f}")
    lines.append(f"  local-cpu memory: PSS {mem['pss_bytes'] / 2**30:.2f} GiB, RSS sum {mem['rss_bytes'] / 2**30:.2f} "
                 f"GiB over {mem['processes']} processes")
    return "\n".join(lines)
