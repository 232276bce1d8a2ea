"""What the API shows of each turn: Server-Timing, the debug header, request counts, traces (fake engine)."""

from __future__ import annotations

import re
import time

import anthropic
import httpx
import openai
import pytest

from macaron_ray.observability import metrics as M
from macaron_ray.observability.tracing import NO_TRACING, OTelTracer, tracer_provider
from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.unit.api_server import PUBLIC_MODEL, SECRET_ADAPTERS, start_api

TIMING = re.compile(r"([a-z]+);dur=([0-9.]+)")
CHAT = [{"role": "user", "content": "write python code"}]
HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}


def timings(value: str) -> dict[str, float]:
    return {name: float(ms) for name, ms in TIMING.findall(value)}


@pytest.fixture
def api(tmp_path):
    running = start_api(FakeEngine(chunk_delay_s=0.01), WhitespaceTokenCounter(), tmp_path / "state.db")
    yield running
    running.stop()


def value(api, spec: M.MetricSpec, suffix: str = "", **labels: str) -> float:
    return api.runner.metrics.exporter.value(spec, suffix, **labels)


def test_a_whole_turn_carries_every_hop_in_server_timing_and_no_label(api):
    with openai.OpenAI(base_url=api.base_url + "/v1", api_key="k", _strict_response_validation=True,
                       max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(model=PUBLIC_MODEL, messages=CHAT)
    raw.parse()
    hops = timings(raw.headers["server-timing"])
    assert set(hops) == {"route", "wait", "ttft", "answer", "total"}
    assert hops["total"] >= hops["route"] + hops["answer"] > 0
    assert "x-macaron-specialist" not in raw.headers
    for name in ("L2", *SECRET_ADAPTERS.values()):
        assert name not in str(raw.headers), name


def test_a_stream_has_route_timing_in_its_header_and_the_whole_turn_in_a_closing_comment(api):
    body = {"model": PUBLIC_MODEL, "messages": CHAT, "stream": True}
    with httpx.stream("POST", api.base_url + "/v1/chat/completions", json=body, timeout=30) as resp:
        header = timings(resp.headers["server-timing"])
        lines = [line for line in resp.iter_lines() if line]
    assert set(header) == {"route", "wait"}
    # The comment comes just before `data: [DONE]`: the openai SDK stops at the sentinel and drains
    # the rest for only 0.1 s, so a comment after it was lost now and then (CI, 2026-12-05).
    comments = [line for line in lines if line.startswith(":")]
    assert lines[-1] == "data: [DONE]" and comments == [lines[-2]] and lines[-2].startswith(": server-timing ")
    whole = timings(lines[-2])
    assert set(whole) == {"route", "wait", "ttft", "answer", "total"} and whole["route"] == header["route"]


@pytest.mark.parametrize("surface", ["responses", "messages"])
def test_every_surface_streams_its_timing(api, surface):
    if surface == "responses":
        url, body, headers = "/v1/responses", {"model": PUBLIC_MODEL, "input": "write code", "stream": True}, {}
    else:
        url, headers = "/v1/messages", HEADERS
        body = {"model": PUBLIC_MODEL, "max_tokens": 16, "messages": CHAT, "stream": True}
    with httpx.stream("POST", api.base_url + url, json=body, headers=headers, timeout=30) as resp:
        assert "route" in timings(resp.headers["server-timing"])
        last = [line for line in resp.iter_lines() if line][-1]
    assert "total" in timings(last)
    assert value(api, M.TURN, "_count", specialist="L2", surface=surface) == 1


def test_the_sdks_read_streams_that_end_with_the_timing_comment(api):
    with openai.OpenAI(base_url=api.base_url + "/v1", api_key="k", _strict_response_validation=True,
                       max_retries=0) as client:
        chunks = list(client.chat.completions.create(model=PUBLIC_MODEL, messages=CHAT, stream=True))
        events = list(client.responses.create(model=PUBLIC_MODEL, input="write code", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("[secret-adapter-2]")
    assert events[-1].type == "response.completed"
    with anthropic.Anthropic(base_url=api.base_url, api_key="k", _strict_response_validation=True,
                             max_retries=0) as claude:
        with claude.messages.stream(model=PUBLIC_MODEL, max_tokens=16, messages=CHAT) as stream:
            message = stream.get_final_message()
    assert message.stop_reason == "end_turn"


def test_the_debug_header_names_the_specialist_only_when_turned_on(tmp_path):
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path / "state.db", debug_headers=True)
    try:
        resp = httpx.post(running.base_url + "/v1/chat/completions", json={"model": PUBLIC_MODEL, "messages": CHAT})
        assert resp.headers["x-macaron-specialist"] == "L2"
        with httpx.stream("POST", running.base_url + "/v1/messages", headers=HEADERS, json={
                "model": PUBLIC_MODEL, "max_tokens": 8, "stream": True,
                "messages": [{"role": "user", "content": "book a table"}]}) as stream:
            assert stream.headers["x-macaron-specialist"] == "L1"
    finally:
        running.stop()


def test_requests_are_counted_by_surface_and_status_class_and_streams_close(api):
    httpx.post(api.base_url + "/v1/chat/completions", json={"model": PUBLIC_MODEL, "messages": CHAT})
    httpx.post(api.base_url + "/v1/chat/completions", json={"model": "nope", "messages": CHAT})
    httpx.post(api.base_url + "/v1/messages", json={"model": PUBLIC_MODEL, "max_tokens": 8, "messages": CHAT},
               headers=HEADERS)
    httpx.get(api.base_url + "/v1/responses/resp_missing")
    httpx.get(api.base_url + "/v1/models")
    with httpx.stream("POST", api.base_url + "/v1/responses",
                      json={"model": PUBLIC_MODEL, "input": "hi", "stream": True}) as resp:
        resp.read()
    assert value(api, M.REQUESTS, surface="chat", status_class="2xx") == 1
    assert value(api, M.REQUESTS, surface="chat", status_class="4xx") == 1
    assert value(api, M.REQUESTS, surface="messages", status_class="2xx") == 1
    assert value(api, M.REQUESTS, surface="responses", status_class="4xx") == 1
    assert value(api, M.REQUESTS, surface="responses", status_class="2xx") == 1
    assert value(api, M.REQUESTS, surface="other", status_class="2xx") == 1
    assert value(api, M.STREAMS_IN_FLIGHT, surface="responses") == 0
    metrics = httpx.get(api.base_url + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'ray_macaron_requests_total{status_class="2xx",surface="chat"} 1.0' in metrics.text


def test_a_store_failure_is_a_retryable_503_in_the_surface_envelope(api):
    async def broken(*args):
        raise OSError("database is locked")

    api.store.get_turn = api.store.get_turns = broken
    body = {"model": PUBLIC_MODEL, "messages": [*CHAT, {"role": "assistant", "content": "x"},
                                                {"role": "user", "content": "more code"}]}
    resp = httpx.post(api.base_url + "/v1/chat/completions", json=body)
    assert resp.status_code == 503 and resp.headers["retry-after"]
    assert resp.json()["error"]["code"] == "store_unavailable"
    assert "locked" not in resp.text
    assert value(api, M.STORE_ERRORS, operation="get_turns") == 1
    assert value(api, M.REQUESTS, surface="chat", status_class="5xx") == 1


# -- traces -----------------------------------------------------------------------------------


def test_no_tracing_costs_one_shared_do_nothing_span():
    assert NO_TRACING.start("turn") is NO_TRACING.start("route", NO_TRACING.start("turn"), a=1)


def test_each_turn_is_one_trace_with_a_span_per_hop(tmp_path):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans = InMemorySpanExporter()
    tracer = OTelTracer(tracer_provider(SimpleSpanProcessor(spans)))
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path / "state.db", tracer=tracer)
    try:
        resp = httpx.post(running.base_url + "/v1/chat/completions", headers={"authorization": "Bearer sk-secret"},
                          json={"model": PUBLIC_MODEL, "messages": CHAT})
        assert resp.status_code == 200
        deadline = time.monotonic() + 10  # the summary hop ends after the response
        while "summary" not in {s.name for s in spans.get_finished_spans()} and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        running.stop()
    finished = {s.name: s for s in spans.get_finished_spans()}
    assert set(finished) == {"turn", "route", "answer", "store", "summary"}
    turn = finished["turn"]
    assert {s.context.trace_id for s in finished.values()} == {turn.context.trace_id}
    for name in ("route", "answer", "store", "summary"):
        assert finished[name].parent.span_id == turn.context.span_id, name
    assert turn.attributes["surface"] == "chat" and turn.attributes["specialist"] == "L2"
    assert finished["route"].attributes["specialist"] == "L2"
    for name in ("route", "answer", "summary"):
        assert finished[name].attributes["engine.request_id"].startswith("fake-"), name
    everything = str([dict(s.attributes) for s in finished.values()])
    for private in ("sk-secret", *SECRET_ADAPTERS.values()):
        assert private not in everything
