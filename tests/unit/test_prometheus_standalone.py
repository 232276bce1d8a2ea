"""The standalone app's /metrics scraped by a real Prometheus under a short mixed load (fake engine):
the hop histograms count exactly the turns sent, and every MoL overview panel query returns a series.

The engine and Ray Serve dashboards read Ray's and vLLM-through-Ray's metrics, which only a Ray
deployment exports: tests/e2e/test_serve_topology.py checks every dashboard there.
"""

from __future__ import annotations

import time

import anthropic
import httpx
import openai
import pytest

from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.prometheus import SCRAPE_INTERVAL_S, PrometheusServer, evaluate_every_panel
from tests.unit.api_server import PUBLIC_MODEL, start_api

TOOL = {"type": "function", "function": {"name": "book_table", "description": "Book a table.",
                                         "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
def api(tmp_path):
    running = start_api(FakeEngine(chunk_delay_s=0.005), WhitespaceTokenCounter(), tmp_path / "state.db")
    yield running
    running.stop()


def mixed_load(base_url: str) -> int:
    """Multi-turn conversations on all three surfaces, a tool call and its result, and one stream the
    client abandons. Returns the number of turns delivered."""
    delivered = 0
    with openai.OpenAI(base_url=base_url + "/v1", api_key="k", max_retries=0) as client:
        history = []
        for text in ("write python code to sort a list", "now book a table for two", "draw a chart of it"):
            history.append({"role": "user", "content": text})
            answer = client.chat.completions.create(model=PUBLIC_MODEL, messages=history)
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
            delivered += 1
        previous = None
        for text in ("hello there", "fix this python bug", "hello again"):
            stream = client.responses.create(model=PUBLIC_MODEL, input=text, previous_response_id=previous,
                                             stream=True)
            previous = [e for e in stream if e.type == "response.completed"][0].response.id
            delivered += 1
        # A tool call, then its result: stickiness, no route hop, no commit of its own.
        messages = [{"role": "user", "content": "tool:book_table book dinner"}]
        call = client.chat.completions.create(model=PUBLIC_MODEL, messages=messages, tools=[TOOL])
        calls = call.choices[0].message.tool_calls
        messages += [{"role": "assistant", "tool_calls": [c.model_dump() for c in calls]},
                     {"role": "tool", "tool_call_id": calls[0].id, "content": '{"ok": true}'}]
        client.chat.completions.create(model=PUBLIC_MODEL, messages=messages, tools=[TOOL])
        delivered += 2
    with anthropic.Anthropic(base_url=base_url, api_key="k", max_retries=0) as claude:
        history = []
        for text in ("send a message to Ana", "write sql code for it"):
            history.append({"role": "user", "content": text})
            with claude.messages.stream(model=PUBLIC_MODEL, max_tokens=64, messages=history) as stream:
                history.append({"role": "assistant", "content": stream.get_final_text()})
            delivered += 1
    # The client walks away after the first delta of a long answer: a rollback, not a turn.
    body = {"model": PUBLIC_MODEL, "stream": True,
            "messages": [{"role": "user", "content": "explain " + "this at great length " * 100}]}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=30) as resp:
        next(line for line in resp.iter_lines() if '"content"' in line)
    return delivered


def test_prometheus_scrapes_the_standalone_metrics_and_every_overview_panel_has_data(api, tmp_path):
    host = api.base_url.removeprefix("http://")
    with PrometheusServer([host], tmp_path) as prom:
        delivered = mixed_load(api.base_url)
        sent = delivered + 1  # the abandoned stream
        count = "sum(ray_macaron_{}_count)".format
        assert prom.wait_for(count("turn_seconds"), delivered, timeout_s=30) == delivered
        # Every user turn but the tool result commits and is summarized (the abandoned one is not).
        assert prom.wait_for(count("summary_hop_seconds"), delivered - 1, timeout_s=30) == delivered - 1
        time.sleep(3 * SCRAPE_INTERVAL_S)  # a few samples after the last change, for rate()
        assert prom.targets_up()
        # Each hop is counted when it completes: the abandoned turn was routed and started answering.
        assert prom.scalar(count("turn_seconds")) == delivered
        assert prom.scalar(count("answer_seconds")) == delivered
        assert prom.scalar(count("answer_ttft_seconds")) == sent
        assert prom.scalar(count("summary_wait_seconds")) == sent
        assert prom.scalar(count("route_hop_seconds")) == sent - 1  # the tool result skipped routing
        assert prom.scalar("sum(ray_macaron_stickiness_hits_total)") == 1
        assert prom.scalar("sum(ray_macaron_turns_committed_total)") == delivered - 1
        assert prom.wait_for('sum(ray_macaron_rollbacks_total{cause="client_disconnect"})', 1, timeout_s=10) == 1
        assert prom.scalar('sum(ray_macaron_requests_total{surface="responses",status_class="2xx"})') == 3
        assert evaluate_every_panel(prom, "1m", uids=("mol-overview",)) == []
