"""Fuzzing the three surfaces (hypothesis) on the fake engine, over HTTP.

Thousands of requests, from valid bodies with fields replaced, dropped or added,
and from arbitrary JSON and bytes: no 5xx; every error in its surface's
envelope; a refused request stores nothing; and no response (body, headers,
streamed events) carries a private adapter id, a path, a stack trace, or
another tenant's data. Derandomized: the same cases every run.
"""

from __future__ import annotations

import json
import sqlite3

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from macaron_ray.api.keys import KeyRing, hash_line, new_key
from macaron_ray.engine.openai_http import request_body
from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.unit.api_server import PUBLIC_MODEL, SECRET_ADAPTERS, start_api

CASES_PER_SURFACE = 700
FUZZ, OTHER = new_key(), new_key()
KEYS = KeyRing.parse(hash_line("fuzz", FUZZ) + "\n" + hash_line("other", OTHER))
MARKER = "ZEBRA-7731-OTHER-TENANT"
"""What the other tenant wrote: it must never appear in an answer to the fuzzing tenant."""
LEAKS = (*SECRET_ADAPTERS.values(), "secret-adapter", "Traceback", 'File "', "/work/", "site-packages",
         "macaron_ray", MARKER)
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages",
         "count_tokens": "/v1/messages/count_tokens"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=16)
texts = st.text(max_size=60) | st.sampled_from(["write python code", "book a table for 2", "make a chart card",
                                                "hi", "", " ", "\u0000", "tool:book_table"])
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "wizard", ""])


def _message(surface: str):
    content = texts | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "image"]),
                                                      "text": texts}), max_size=3) | json_values
    base = {"role": roles, "content": content}
    extra = {"tool_calls": json_values, "tool_call_id": st.text(max_size=10), "name": st.text(max_size=8),
             "type": st.sampled_from(["message", "function_call", "function_call_output"])}
    return st.fixed_dictionaries(base, optional=extra) | json_values


def _valid(surface: str) -> dict:
    return {"chat": {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]},
            "responses": {"model": PUBLIC_MODEL, "input": "hi"},
            "messages": {"model": PUBLIC_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
            "count_tokens": {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]}}[surface]


FIELDS = {
    "chat": ["model", "messages", "stream", "stream_options", "tools", "tool_choice", "max_tokens",
             "max_completion_tokens", "temperature", "top_p", "stop", "seed", "n", "user"],
    "responses": ["model", "input", "instructions", "stream", "store", "previous_response_id", "tools", "tool_choice",
                  "max_output_tokens", "temperature", "top_p", "metadata", "text"],
    "messages": ["model", "messages", "system", "max_tokens", "stream", "tools", "tool_choice", "stop_sequences",
                 "temperature", "top_p", "top_k", "metadata"],
    "count_tokens": ["model", "messages", "system", "tools"],
}


def _field_value(surface: str, name: str, other_response: str):
    special = {
        "model": st.sampled_from([PUBLIC_MODEL, "base", "gpt-4o", ""]) | json_values,
        "messages": st.lists(_message(surface), max_size=4) | json_values,
        "input": texts | st.lists(_message(surface), max_size=4) | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": st.integers(min_value=-5, max_value=10**13) | json_values,
        "previous_response_id": st.sampled_from([other_response, "resp_" + "0" * 24, ""]) | json_values,
        "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": st.text(max_size=8),
                                                 "function": json_values, "input_schema": json_values}),
                          max_size=2) | json_values,
    }
    return special.get(name, json_values)


@st.composite
def bodies(draw, surface: str, other_response: str):
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "json", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    body = dict(_valid(surface))
    for name in draw(st.lists(st.sampled_from(FIELDS[surface]), max_size=4, unique=True)):
        if draw(st.booleans()) and name in body:
            del body[name]
        else:
            body[name] = draw(_field_value(surface, name, other_response))
    if draw(st.booleans()):
        body[draw(st.text(min_size=1, max_size=10))] = draw(json_values)
    return json.dumps(body).encode()


class VLLMCheckedEngine(FakeEngine):
    """The fake engine, taking each request only once vLLM's own request model has: what vLLM would
    refuse (a tool choice naming no tool, a malformed schema) surfaces here as the crash it would be
    on the Serve path, so the fuzzer finds it without an engine."""

    async def stream(self, request):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        ChatCompletionRequest(**request_body(request))
        async for delta in super().stream(request):
            yield delta


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    engine = VLLMCheckedEngine(tag=lambda adapter: next(k for k, v in SECRET_ADAPTERS.items() if v == adapter))
    running = start_api(engine, WhitespaceTokenCounter(), tmp_path_factory.mktemp("fuzz") / "s.db", keys=KEYS,
                        context_tokens=512)
    with httpx.Client(base_url=running.base_url, timeout=30) as client:
        other = client.post(PATHS["responses"], headers={"authorization": f"Bearer {OTHER}"},
                            json={"model": PUBLIC_MODEL, "input": f"remember {MARKER} for me"})
        assert other.status_code == 200
        running.client = client
        running.other_response = other.json()["id"]
        yield running
    running.stop()


def counts(api) -> tuple[int, int]:
    with sqlite3.connect(api.store.path) as db:
        return (db.execute("SELECT COUNT(*) FROM turns").fetchone()[0],
                db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])


def check(api, surface: str, body: bytes) -> None:
    headers = {"authorization": f"Bearer {FUZZ}", "content-type": "application/json"}
    if surface in ("messages", "count_tokens"):
        headers = {"x-api-key": FUZZ, "anthropic-version": "2023-06-01", "content-type": "application/json"}
    before = counts(api)
    resp = api.client.post(PATHS[surface], content=body, headers=headers)
    text = resp.text
    assert resp.status_code < 500, (surface, body[:300], text[:300])
    seen = text + json.dumps(dict(resp.headers))
    assert not [leak for leak in LEAKS if leak in seen], (surface, body[:300], seen[:500])
    if resp.status_code >= 400:
        err = resp.json()
        if surface in ("messages", "count_tokens"):
            assert err["type"] == "error" and set(err["error"]) == {"type", "message"}, err
        else:
            assert set(err) == {"error"} and set(err["error"]) == {"message", "type", "param", "code"}, err
            assert isinstance(err["error"]["message"], str) and err["error"]["message"]
        assert counts(api) == before, (surface, body[:300], text[:300])  # a refused request stores nothing
    elif resp.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
        assert all(isinstance(json.loads(e), dict) for e in events)


@pytest.mark.parametrize("surface", list(PATHS))
def test_fuzzed_requests_get_no_5xx_their_surfaces_envelope_and_store_nothing_when_refused(api, surface):
    @settings(max_examples=CASES_PER_SURFACE if surface != "count_tokens" else CASES_PER_SURFACE // 2,
              derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(body=bodies(surface, api.other_response))
    def run(body):
        check(api, surface, body)

    run()


# -- the classes issue 31 found: tools, tool choices, tool-call arguments, non-finite numbers ----

EDGE_CASES_PER_SURFACE = 300
NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e999", "-2.5e400")
SLOT = "__NUMBER_SLOT__"
"""A string the body's JSON text then carries as a non-finite number literal."""
schemas = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "string"]) | json_values},
    optional={"properties": json_values | st.dictionaries(st.text(max_size=6), json_values | st.just(
        {"type": "number", "default": SLOT}), max_size=3), "required": json_values}) | json_values
names = st.sampled_from(["f", "get_weather", "other", ""]) | json_values
choices = (st.sampled_from(["none", "auto", "required", "any", "tool"]) | json_values
           | st.fixed_dictionaries({"type": st.sampled_from(["function", "tool", "any", "auto", "none", "custom",
                                                             "file_search", "allowed_tools"])},
                                   optional={"name": names, "function": json_values | st.fixed_dictionaries(
                                       {"name": names})}))
arguments = (st.sampled_from(["oops", "", "{}", "[1, 2]", "null", '{"a": NaN}', '{"a": 1e999}', '{"a": 1}'])
             | st.text(max_size=12) | json_values.map(json.dumps))


def _tools(surface: str, name, schema) -> list:
    if surface == "chat":
        return [{"type": "function", "function": {"name": name, "parameters": schema}}]
    if surface == "responses":
        return [{"type": "function", "name": name, "parameters": schema}]
    return [{"name": name, "input_schema": schema}]


def _called(surface: str, args) -> dict:
    """A history with one call of `f` (its arguments `args`) and its result."""
    if surface == "chat":
        return {"messages": [{"role": "user", "content": "tool:f go"},
                             {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                                   "function": {"name": "f", "arguments": args}}]},
                             {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    if surface == "responses":
        return {"input": [{"role": "user", "content": "tool:f go"},
                          {"type": "function_call", "call_id": "c1", "name": "f", "arguments": args},
                          {"type": "function_call_output", "call_id": "c1", "output": "ok"}]}
    try:
        value = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        value = args
    return {"messages": [{"role": "user", "content": "tool:f go"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": value}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}


@st.composite
def edge_bodies(draw, surface: str) -> bytes:
    body = dict(_valid(surface))
    if draw(st.booleans()):
        body["tools"] = _tools(surface, draw(names), draw(schemas))
    if surface != "count_tokens" and draw(st.booleans()):
        body["tool_choice"] = draw(choices)
    if draw(st.booleans()):
        body.update(_called(surface if surface != "count_tokens" else "messages", draw(arguments)))
    if draw(st.booleans()):
        body[draw(st.sampled_from(["metadata", "temperature", "seed", "top_p", "x"]))] = {"k": SLOT} \
            if draw(st.booleans()) else SLOT
    return json.dumps(body).replace(f'"{SLOT}"', draw(st.sampled_from(NON_FINITE))).encode()


@pytest.mark.parametrize("surface", list(PATHS))
def test_tools_choices_arguments_and_non_finite_numbers_never_reach_a_5xx(api, surface):
    @settings(max_examples=EDGE_CASES_PER_SURFACE, derandomize=True, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(body=edge_bodies(surface))
    def run(body):
        check(api, surface, body)

    run()
