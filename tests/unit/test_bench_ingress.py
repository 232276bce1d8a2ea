"""bench ingress's pure parts: the zero-latency engine speaks the Serve LLM chunk format, the figures add up."""

from __future__ import annotations

import asyncio
import json

import pytest

from macaron_ray.bench.ingress import ZeroLatencyLLM, level_figures, self_time_s
from macaron_ray.core import route_hop
from macaron_ray.engine.openai_http import StreamAccumulator, request_body
from macaron_ray.serve.handle_engine import sse_payloads


def _deltas(engine: ZeroLatencyLLM, req) -> list:
    from ray.serve.llm.openai_api_models import ChatCompletionRequest

    async def collect():
        acc, out = StreamAccumulator(), []
        async for item in engine.chat(ChatCompletionRequest(**request_body(req))):
            for data in sse_payloads(item):
                if data != "[DONE]" and (delta := acc.feed(json.loads(data))) is not None:
                    out.append(delta)
        return out + [acc.final()]

    return asyncio.run(collect())


def test_the_zero_latency_engine_answers_route_requests_with_a_choice_and_others_with_text():
    from macaron_ray.core.engine_client import EngineRequest

    engine = ZeroLatencyLLM()
    labels = set()
    for _ in range(4):
        *deltas, final = _deltas(engine, route_hop.route_request("adapter-0", "hello"))
        labels.add(route_hop.parse_label("".join(d.text for d in deltas)))
        assert final.finish_reason == "stop" and final.usage.completion_tokens == 4
    assert labels <= {"L0", "L1", "L2", "L3"} and len(labels) > 1  # the route hop's answers vary
    answer = _deltas(engine, EngineRequest("adapter-2", [{"role": "user", "content": "hi"}]))
    assert "".join(d.text for d in answer) == "The assistant answered briefly."


def test_self_time_is_the_total_less_the_engine_hops():
    assert self_time_s({"route": 0.01, "wait": 0.002, "answer": 0.02, "total": 0.035}) == pytest.approx(0.003)
    assert self_time_s({"total": 0.01}) is None  # the stock ingress has no hops of its own
    records = [{"ok": True, "client_s": 0.04, "server": {"route": 0.01, "answer": 0.02, "total": 0.032}},
               {"ok": True, "client_s": 0.05, "server": {}}, {"ok": False, "client_s": 1.0, "server": {}}]
    figures = level_figures(records, wall_s=2.0, cpu_s={"ingress": 0.01, "proxy": 0.004})
    assert figures["requests"] == 3 and figures["ok"] == 2 and figures["turns_per_s"] == 1.0
    assert figures["cpu_ms_per_turn"] == pytest.approx({"ingress": 5.0, "proxy": 2.0})  # per successful turn
    assert figures["self_s"]["n"] == 1 and figures["self_s"]["p50"] == pytest.approx(0.002)
    assert figures["client_s"]["p99"] == 0.05
