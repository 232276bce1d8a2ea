"""Where real clients push (issue 31): tool choices in each surface's shape, count_tokens like a turn,
slow bodies, store failures outside a turn, and conversations whose instructions change."""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time

import anthropic
import httpx
import openai
import pytest

from macaron_ray.api.gate import Limits
from macaron_ray.observability.metrics import OWNVIEW_CACHE_MISSES
from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.unit.api_server import PUBLIC_MODEL, start_api

ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
def api(tmp_path):
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path / "s.db")
    yield running
    running.stop()


def test_responses_tool_choice_in_its_documented_shape_forces_that_function(api):
    client = openai.OpenAI(base_url=api.base_url + "/v1", api_key="k")
    resp = client.responses.create(
        model=PUBLIC_MODEL, input="tool:get_weather in Paris",
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": False},
               {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}},
                "strict": False}],
        tool_choice={"type": "function", "name": "get_weather"})
    assert resp.output[-1].type == "function_call" and resp.output[-1].name == "get_weather"
    assert resp.tool_choice.type == "function" and resp.tool_choice.name == "get_weather"
    answer = api.runner.engine.of_kind("answer")[-1]
    assert answer.tool_choice == {"type": "function", "function": {"name": "get_weather"}}


def test_a_named_tool_choice_reaches_the_engine_in_its_shape_on_every_surface(api):
    chat = httpx.post(api.base_url + "/v1/chat/completions", json={
        "model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "tool:f now"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": WEATHER}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}})
    assert chat.status_code == 200, chat.text
    messages = httpx.post(api.base_url + "/v1/messages", headers=ANTHROPIC_HEADERS, json={
        "model": PUBLIC_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "tool:f now"}],
        "tools": [{"name": "f", "input_schema": WEATHER}], "tool_choice": {"type": "tool", "name": "f"}})
    assert messages.status_code == 200, messages.text
    choices = [r.tool_choice for r in api.runner.engine.of_kind("answer")]
    assert choices == [{"type": "function", "function": {"name": "f"}}] * 2


def test_a_tool_choice_naming_no_tool_is_a_400_naming_the_field(api):
    resp = httpx.post(api.base_url + "/v1/chat/completions", json={
        "model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}],
        "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("tool_choice", "invalid_value")
    assert "get_time" in error["message"] and "get_weather" in error["message"]


# -- count_tokens: like a turn ---------------------------------------------------------------

COUNT_BODY = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "how many tokens is this"}]}


def test_count_tokens_refuses_a_schema_the_template_cannot_render(api):
    resp = httpx.post(api.base_url + "/v1/messages/count_tokens", headers=ANTHROPIC_HEADERS, json={
        **COUNT_BODY, "tools": [{"name": "f", "input_schema": {"type": "object", "properties": []}}]})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert "input_schema.properties" in resp.json()["error"]["message"]


def test_count_tokens_is_capped_and_limited_like_a_turn(tmp_path):
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path / "s.db", max_messages=4,
                        limits=Limits(requests_per_s=0.001, burst=2))
    try:
        url = running.base_url + "/v1/messages/count_tokens"
        many = {**COUNT_BODY, "messages": [{"role": "user", "content": "x"}] * 5}
        resp = httpx.post(url, headers=ANTHROPIC_HEADERS, json=many)
        assert resp.status_code == 400 and "at most 4" in resp.json()["error"]["message"]
        assert httpx.post(url, headers=ANTHROPIC_HEADERS, json=COUNT_BODY).status_code == 200
        resp = httpx.post(url, headers=ANTHROPIC_HEADERS, json=COUNT_BODY)
        assert resp.status_code == 429 and resp.json()["error"]["type"] == "rate_limit_error"
        assert resp.headers["retry-after"]
    finally:
        running.stop()


def test_count_tokens_tokenizes_off_the_event_loop(tmp_path):
    """A long tokenizer pass must not stall the replica's other requests."""
    loop_threads = set()

    class Slow(WhitespaceTokenCounter):
        def count(self, messages, tools):
            loop_threads.add(threading.current_thread().name)
            time.sleep(1.0)
            return super().count(messages, tools)

    running = start_api(FakeEngine(), Slow(), tmp_path / "s.db")
    try:
        resp = httpx.post(running.base_url + "/v1/messages/count_tokens", headers=ANTHROPIC_HEADERS,
                          json=COUNT_BODY, timeout=30)
        assert resp.status_code == 200 and loop_threads
        assert running.thread.name not in loop_threads  # the thread that runs the event loop
    finally:
        running.stop()


# -- slow bodies -----------------------------------------------------------------------------

def _trickle(base_url: str, body: bytes, sent: int) -> socket.socket:
    """A client that sends the head and `sent` bytes of `body`, then nothing more."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(body)}\r\n\r\n".encode() + body[:sent])
    return sock


def _response(sock: socket.socket) -> str:
    """The whole HTTP response on `sock`: its head, then as many body bytes as it declares."""
    sock.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(4096)
    return (head + b"\r\n\r\n" + body).decode()


def test_a_slow_body_holds_no_turn_slot_and_times_out_with_408(tmp_path):
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path / "s.db",
                        limits=Limits(turns_in_flight=2, concurrent_turns=1, body_read_s=1.5))
    body = json.dumps({"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    socks = [_trickle(running.base_url, body, 10) for _ in range(8)]  # one tenant (no key), eight uploads
    try:
        time.sleep(0.3)
        # The slots are free: the same tenant and others get their turns while the uploads trickle.
        for key in ("", "other"):
            resp = httpx.post(running.base_url + "/v1/chat/completions", json=json.loads(body),
                              headers={"authorization": f"Bearer {key}"} if key else {}, timeout=10)
            assert resp.status_code == 200, resp.text
        for sock in socks:
            reply = _response(sock)
            assert reply.startswith("HTTP/1.1 408"), reply[:200]
            assert '"code":"request_timeout"' in reply.replace(" ", "")
    finally:
        for sock in socks:
            sock.close()
        running.stop()


# -- store failures outside a turn -----------------------------------------------------------

def test_store_failures_outside_a_turn_are_503_with_retry_after(api):
    resp = httpx.post(api.base_url + "/v1/responses", json={"model": PUBLIC_MODEL, "input": "hello"})
    rid = resp.json()["id"]

    async def lost(*args, **kwargs):  # the backend fails from here on, as a lost Redis would
        raise sqlite3.OperationalError("disk I/O error")

    for name in ("get_response", "put_response", "delete_response"):
        setattr(api.store, name, lost)
    calls = [("GET", f"/v1/responses/{rid}", None), ("DELETE", f"/v1/responses/{rid}", None),
             ("GET", f"/v1/responses/{rid}/input_items", None),
             ("POST", "/v1/responses", {"model": PUBLIC_MODEL, "input": "more", "previous_response_id": rid})]
    for method, path, body in calls:
        resp = httpx.request(method, api.base_url + path, json=body)
        assert resp.status_code == 503, (method, path, resp.text)
        assert resp.headers["retry-after"] == "1"
        assert resp.json()["error"]["code"] == "store_unavailable"


# -- a conversation is not its instructions --------------------------------------------------

def test_a_100_turn_chain_with_new_instructions_every_turn(api):
    """The OpenAI Agents SDK changes `instructions` on handoffs: every turn stays known, one route
    hop per turn, nothing re-derived."""
    client = openai.OpenAI(base_url=api.base_url + "/v1", api_key="k")
    previous = None
    for i in range(100):
        resp = client.responses.create(model=PUBLIC_MODEL, input=f"turn {i}: tell me something",
                                       instructions=f"You are agent #{i % 7}; today is day {i}.",
                                       previous_response_id=previous)
        assert resp.status == "completed"
        previous = resp.id
    assert len(api.runner.engine.of_kind("route")) == 100
    assert api.runner.metrics.exporter.value(OWNVIEW_CACHE_MISSES) == 0


def test_anthropic_tool_round_trip_stays_with_the_caller(api):
    client = anthropic.Anthropic(base_url=api.base_url, api_key="k")
    tools = [{"name": "book_table", "input_schema": WEATHER}]
    first = client.messages.create(model=PUBLIC_MODEL, max_tokens=32, tools=tools, tool_choice={"type": "any"},
                                   messages=[{"role": "user", "content": "tool:book_table book dinner"}])
    (use,) = [b for b in first.content if b.type == "tool_use"]
    second = client.messages.create(model=PUBLIC_MODEL, max_tokens=32, tools=tools, messages=[
        {"role": "user", "content": "tool:book_table book dinner"},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "booked at 8"}]}])
    assert second.stop_reason == "end_turn" and second.content[0].text.endswith("booked at 8")


def test_a_client_that_leaves_mid_body_is_not_answered_or_counted_as_bad_input(api):
    from macaron_ray.observability.metrics import REJECTIONS

    body = json.dumps({"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
    before = api.runner.metrics.exporter.value(REJECTIONS, surface="chat", reason="invalid_request")
    _trickle(api.base_url, body, 10).close()
    time.sleep(0.5)
    assert api.runner.metrics.exporter.value(REJECTIONS, surface="chat", reason="invalid_request") == before
    assert api.runner.engine.requests == []
