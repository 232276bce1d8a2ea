"""Bad input on every surface: a 4xx in the surface's envelope, and nothing stored or sent to an engine."""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest

from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.unit.api_server import PUBLIC_MODEL, SECRET_ADAPTERS, start_api

LIMIT = 8192
CONTEXT = 256
"""The engines' context (tokens) for this module's API: the whitespace counter's prompt of `LONG` is over it."""
LONG = "word " * 400
MAX_MESSAGES = 64
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "k"}

SURFACES = {
    "chat": ("/v1/chat/completions", lambda **kw: {"model": PUBLIC_MODEL,
                                                   "messages": [{"role": "user", "content": "hi"}], **kw}),
    "responses": ("/v1/responses", lambda **kw: {"model": PUBLIC_MODEL, "input": "hi", **kw}),
    "messages": ("/v1/messages", lambda **kw: {"model": PUBLIC_MODEL, "max_tokens": 16,
                                               "messages": [{"role": "user", "content": "hi"}], **kw}),
}

def _tools_of(surface: str):
    """`tools` with one function `f` in `surface`'s shape, its parameters schema given (or a plain one)."""
    def tools(schemas=({"type": "object", "properties": {"city": {"type": "string"}}},)) -> dict:
        schema = schemas[0]
        if surface == "chat":
            return {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
        if surface == "responses":
            return {"tools": [{"type": "function", "name": "f", "parameters": schema}]}
        return {"tools": [{"name": "f", "input_schema": schema}]}
    return tools


TOOLS_OF = {s: _tools_of(s) for s in SURFACES}

# case -> surface -> (raw body bytes, expected status)
CASES = {
    "malformed json": {s: (b'{"model": "x", ', 400) for s in SURFACES},
    "not an object": {s: (b'["model"]', 400) for s in SURFACES},
    "empty body": {s: (b"", 400) for s in SURFACES},
    "missing fields": {"chat": ({"model": PUBLIC_MODEL}, 400), "responses": ({"model": PUBLIC_MODEL}, 400),
                       "messages": ({"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "x"}]}, 400)},
    "mistyped field": {"chat": (SURFACES["chat"][1](messages="hi"), 400),
                       "responses": (SURFACES["responses"][1](input=5), 400),
                       "messages": (SURFACES["messages"][1](max_tokens="many"), 400)},
    "empty messages": {"chat": (SURFACES["chat"][1](messages=[]), 400),
                       "responses": (SURFACES["responses"][1](input=[]), 400),
                       "messages": (SURFACES["messages"][1](messages=[]), 400)},
    "unknown role": {s: (SURFACES[s][1](**{("input" if s == "responses" else "messages"):
                                           [{"role": "wizard", "content": "x"}]}), 400) for s in SURFACES},
    "tool result without its call": {
        "chat": (SURFACES["chat"][1](messages=[{"role": "user", "content": "x"},
                                               {"role": "tool", "tool_call_id": "call_9", "content": "r"}]), 400),
        "responses": (SURFACES["responses"][1](input=[{"type": "function_call_output", "call_id": "call_9",
                                                       "output": "r"}]), 400),
        "messages": (SURFACES["messages"][1](messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_9", "content": "r"}]}]), 400)},
    "non-utf8 body": {s: (b'{"model": "\xff\xfe"}', 400) for s in SURFACES},
    "body over the limit": {s: (SURFACES[s][1](pad="x" * (LIMIT + 10)), 413) for s in SURFACES},
    "unknown model": {s: (SURFACES[s][1](model="gpt-4o"), 404) for s in SURFACES},
    "max_tokens above the context": {"chat": (SURFACES["chat"][1](max_tokens=10**12), 400),
                                     "responses": (SURFACES["responses"][1](max_output_tokens=10**12), 400),
                                     "messages": (SURFACES["messages"][1](max_tokens=10**12), 400)},
    "prompt over the context": {
        "chat": (SURFACES["chat"][1](messages=[{"role": "user", "content": LONG}]), 400),
        "responses": (SURFACES["responses"][1](input=LONG), 400),
        "messages": (SURFACES["messages"][1](messages=[{"role": "user", "content": LONG}]), 400)},
    "seed beyond 64 bits": {"chat": (SURFACES["chat"][1](seed=2**70), 400),
                            "responses": (SURFACES["responses"][1](max_output_tokens=2**70), 400),
                            "messages": (SURFACES["messages"][1](max_tokens=2**70), 400)},
    "integer of 5,000 digits": {s: (json.dumps(SURFACES[s][1]()).replace('"model"', '"n": ' + "9" * 5000 + ', "model"', 1)
                                    .encode(), 400) for s in SURFACES},
    "nesting 3,000 deep": {s: (json.dumps(SURFACES[s][1]()).replace('"model"', '"x": ' + "[" * 1500 + "]" * 1500
                                                                    + ', "model"', 1).encode(), 400) for s in SURFACES},
    "lone surrogate in text": {s: (json.dumps(SURFACES[s][1]()).replace('"hi"', '"\\ud800 hi"').encode(), 400)
                               for s in SURFACES},
    "lone surrogate in metadata": {s: (json.dumps(SURFACES[s][1](metadata={"k": "v"})).replace('"v"', '"\\udfff"')
                                       .encode(), 400) for s in SURFACES},
    "too many messages": {
        "chat": (SURFACES["chat"][1](messages=[{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)), 400),
        "responses": (SURFACES["responses"][1](input=[{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)), 400),
        "messages": (SURFACES["messages"][1](messages=[{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)), 400)},
    "a non-finite number": {s: (json.dumps(SURFACES[s][1](metadata={"k": "v"})).replace('"v"', "NaN").encode(), 400)
                            for s in SURFACES},
    "a float beyond a double": {s: (json.dumps(SURFACES[s][1](metadata={"k": "v"})).replace('"v"', "-1e999").encode(),
                                    400) for s in SURFACES},
    "Infinity in a tool parameter's default": {s: (json.dumps(SURFACES[s][1](**TOOLS_OF[s]([{"type": "object", "properties": {
        "days": {"type": "number", "default": "INF"}}}]))).replace('"INF"', "Infinity").encode(), 400) for s in SURFACES},
    "tool_choice naming a function not in tools": {
        "chat": (SURFACES["chat"][1](**TOOLS_OF["chat"](), tool_choice={"type": "function", "function": {"name": "nope"}}),
                 400),
        "responses": (SURFACES["responses"][1](**TOOLS_OF["responses"](), tool_choice={"type": "function", "name": "nope"}),
                      400),
        "messages": (SURFACES["messages"][1](**TOOLS_OF["messages"](), tool_choice={"type": "tool", "name": "nope"}), 400)},
    "tool_choice of an unknown shape": {
        "chat": (SURFACES["chat"][1](**TOOLS_OF["chat"](), tool_choice={"type": "custom", "custom": {"name": "f"}}), 400),
        "responses": (SURFACES["responses"][1](**TOOLS_OF["responses"](), tool_choice={"type": "file_search"}), 400),
        "messages": (SURFACES["messages"][1](**TOOLS_OF["messages"](), tool_choice={"type": "anything"}), 400)},
    "a forced tool without tools": {
        "chat": (SURFACES["chat"][1](tool_choice="required"), 400),
        "responses": (SURFACES["responses"][1](tool_choice={"type": "function", "name": "f"}), 400),
        "messages": (SURFACES["messages"][1](tool_choice={"type": "any"}), 400)},
    "a tool schema whose properties is a list": {s: (SURFACES[s][1](**TOOLS_OF[s]([{"type": "object", "properties": []}])),
                                                     400) for s in SURFACES},
    "a tool schema that is not an object": {s: (SURFACES[s][1](**TOOLS_OF[s](["string"])), 400) for s in SURFACES},
    "malformed tool-call arguments in the history": {
        "chat": (SURFACES["chat"][1](messages=[
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                  "function": {"name": "f", "arguments": "oops"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"}]), 400),
        "responses": (SURFACES["responses"][1](input=[
            {"role": "user", "content": "x"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "[1, 2]"},
            {"type": "function_call_output", "call_id": "c1", "output": "r"}]), 400),
        "messages": (SURFACES["messages"][1](messages=[
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": "oops"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]}]), 400)},
    "bad sampling value": {"chat": (SURFACES["chat"][1](temperature=9), 400),
                           "responses": (SURFACES["responses"][1](max_output_tokens=0), 400),
                           "messages": (SURFACES["messages"][1](top_p=3), 400)},
}

ANTHROPIC_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "request_too_large"}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path_factory.mktemp("api") / "s.db",
                        body_limit_bytes=LIMIT, context_tokens=CONTEXT, max_messages=MAX_MESSAGES)
    yield running
    running.stop()


@pytest.mark.parametrize("surface", list(SURFACES))
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_a_clear_error_and_stores_nothing(api, case, surface):
    if surface not in CASES[case]:
        pytest.fail(f"case {case!r} has no {surface} variant")
    body, status = CASES[case][surface]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    path = SURFACES[surface][0]
    headers = {"content-type": "application/json", **(ANTHROPIC_HEADERS if surface == "messages" else {})}
    before = len(api.runner.engine.requests)
    resp = httpx.post(api.base_url + path, content=raw, headers=headers)
    assert resp.status_code == status, resp.text
    data = resp.json()
    if surface == "messages":
        assert data["type"] == "error" and set(data["error"]) == {"type", "message"}
        assert data["error"]["type"] == ANTHROPIC_TYPES[status]
        message = data["error"]["message"]
    else:
        assert set(data["error"]) == {"message", "type", "param", "code"}
        assert data["error"]["type"] == "invalid_request_error"
        message = data["error"]["message"]
    assert message and "Traceback" not in resp.text
    for secret in SECRET_ADAPTERS.values():
        assert secret not in resp.text
    assert len(api.runner.engine.requests) == before
    with sqlite3.connect(api.store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 0
        assert db.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 0


def test_missing_anthropic_version_is_rejected(api):
    resp = httpx.post(api.base_url + "/v1/messages", headers={"x-api-key": "k"}, json=SURFACES["messages"][1]())
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"


def test_validation_errors_name_the_field(api):
    resp = httpx.post(api.base_url + "/v1/chat/completions", json=SURFACES["chat"][1](temperature=9))
    assert resp.json()["error"]["param"] == "temperature"


def test_unknown_route_and_method_use_the_envelope(api):
    assert httpx.get(api.base_url + "/v1/nope").json()["error"]["type"] == "invalid_request_error"
    resp = httpx.get(api.base_url + "/v1/messages")
    assert resp.status_code == 405 and resp.json()["type"] == "error"


def test_get_and_delete_of_unknown_response_are_404(api):
    for method in ("GET", "DELETE"):
        resp = httpx.request(method, api.base_url + "/v1/responses/resp_missing")
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    resp = httpx.get(api.base_url + "/v1/responses/resp_missing/input_items")
    assert resp.status_code == 404


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", SURFACES["chat"][1](max_tokens=10**12), "max_tokens"),
    ("/v1/chat/completions", SURFACES["chat"][1](max_completion_tokens=CONTEXT), "max_completion_tokens"),
    ("/v1/responses", SURFACES["responses"][1](max_output_tokens=10**12), "max_output_tokens"),
])
def test_a_token_budget_above_the_context_names_its_param(api, path, body, param):
    resp = httpx.post(api.base_url + path, json=body)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param and resp.json()["error"]["code"] == "invalid_value"
    assert f"context is {CONTEXT} tokens" in resp.json()["error"]["message"]


def test_a_prompt_over_the_context_says_how_long_it_was(api):
    for path, body, param in (("/v1/chat/completions", CASES["prompt over the context"]["chat"][0], "messages"),
                              ("/v1/responses", CASES["prompt over the context"]["responses"][0], "input")):
        error = httpx.post(api.base_url + path, json=body).json()["error"]
        assert (error["param"], error["code"]) == (param, "context_length_exceeded")
        assert f"maximum context length is {CONTEXT} tokens" in error["message"]
    resp = httpx.post(api.base_url + "/v1/messages", headers=ANTHROPIC_HEADERS,
                      json=CASES["prompt over the context"]["messages"][0])
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert "maximum context length" in resp.json()["error"]["message"]


def test_a_request_that_fits_is_not_tokenized(tmp_path):
    """Its UTF-8 size bounds its tokens: the common request costs no tokenizer pass."""
    class Counting(WhitespaceTokenCounter):
        calls = 0

        def count(self, messages, tools):
            Counting.calls += 1
            return super().count(messages, tools)

    running = start_api(FakeEngine(), Counting(), tmp_path / "s.db", context_tokens=4096)
    try:
        assert httpx.post(running.base_url + "/v1/chat/completions", json=SURFACES["chat"][1]()).status_code == 200
        assert Counting.calls == 0
        long = SURFACES["chat"][1](messages=[{"role": "user", "content": "word " * 1000}], max_tokens=16)
        assert httpx.post(running.base_url + "/v1/chat/completions", json=long).status_code == 200
        assert Counting.calls == 1  # 5,000 bytes could be 4,096 tokens: counted (1,000), and it fits
    finally:
        running.stop()


def test_an_engine_that_refuses_the_request_is_a_400_without_its_words(tmp_path):
    """vLLM answers 400 for a prompt its specialist's view makes too long; its message may name
    private models, so the client gets the surface's own."""
    from functools import partial

    from macaron_ray.core.engine_client import EngineError

    engine = FakeEngine()
    engine.fail(lambda req: FakeEngine.kind(req) == "answer", times=3,
                error=partial(EngineError, retryable=False, status=400))
    running = start_api(engine, WhitespaceTokenCounter(), tmp_path / "s.db")
    try:
        for path, body in (("/v1/chat/completions", SURFACES["chat"][1]()),
                           ("/v1/responses", SURFACES["responses"][1]())):
            resp = httpx.post(running.base_url + path, json=body)
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_request", resp.text
        resp = httpx.post(running.base_url + "/v1/messages", headers=ANTHROPIC_HEADERS, json=SURFACES["messages"][1]())
        assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
        assert "fake engine failure" not in resp.text
        with sqlite3.connect(running.store.path) as db:
            assert db.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 0
    finally:
        running.stop()


def test_a_body_that_is_not_json_by_its_content_type_is_415(api):
    before = len(api.runner.engine.requests)
    for path, body in (("/v1/chat/completions", SURFACES["chat"][1]()), ("/v1/messages", SURFACES["messages"][1]())):
        resp = httpx.post(api.base_url + path, content=json.dumps(body),
                          headers={"content-type": "text/plain", **ANTHROPIC_HEADERS})
        assert resp.status_code == 415, resp.text
    assert len(api.runner.engine.requests) == before


def test_an_escaped_surrogate_pair_is_text(api):
    resp = httpx.post(api.base_url + "/v1/chat/completions", content=json.dumps(SURFACES["chat"][1]()).replace(
        '"hi"', '"\\ud83d\\ude00 hi"'), headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text
