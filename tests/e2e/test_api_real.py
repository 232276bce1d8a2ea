"""The API surfaces on the real local model (base + four adapters on a vLLM CPU engine), via the SDKs."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from macaron_ray.adapters.manifest import Manifest
from macaron_ray.api.tokens import TemplateTokenCounter
from macaron_ray.core.registry import SpecialistRegistry
from macaron_ray.engine.local_server import TOOL_CALL_PARSER
from macaron_ray.engine.openai_http import OpenAIHTTPEngine
from tests.unit.api_server import start_api

PUBLIC = "Macaron-V1-Venti"
BOOK = {"type": "function", "function": {
    "name": "book_table", "description": "Reserve a restaurant table.",
    "parameters": {"type": "object", "properties": {"restaurant": {"type": "string"}, "people": {"type": "integer"},
                                                    "time": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def api(engine, base_model_dir, tmp_path_factory):
    running = start_api(OpenAIHTTPEngine(engine.spec.base_url, tool_call_parser=TOOL_CALL_PARSER),
                        TemplateTokenCounter.embedded(base_model_dir),
                        tmp_path_factory.mktemp("api") / "state.db", registry=SpecialistRegistry.from_manifest(),
                        context_tokens=engine.spec.max_model_len)
    yield running
    running.stop()


@pytest.fixture
def oai(api):
    with openai.OpenAI(base_url=api.base_url + "/v1", api_key="k", _strict_response_validation=True,
                       max_retries=0) as client:
        yield client


@pytest.fixture
def claude(api):
    with anthropic.Anthropic(base_url=api.base_url, api_key="k", _strict_response_validation=True,
                             max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def private_names(base_model_dir) -> list[str]:
    return [a.adapter_id for a in Manifest.load().adapters] + [str(base_model_dir), base_model_dir.name]


def no_private(text: str, names: list[str]) -> None:
    for name in names:
        assert name not in text, name


def test_chat_stream_and_count_tokens_agree_with_the_engine(oai, claude, private_names):
    msgs = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    chunks = list(oai.chat.completions.create(model=PUBLIC, messages=msgs, stream=True, max_tokens=48,
                                              stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "def " in text or "```" in text, text
    no_private("".join(c.model_dump_json() for c in chunks), private_names)
    counted = claude.messages.count_tokens(model=PUBLIC, messages=msgs).input_tokens
    assert counted == chunks[-1].usage.prompt_tokens  # a first turn's own-view is the conversation itself


def test_chat_tool_round_trip_with_the_personal_agent(oai, private_names):
    msgs = [{"role": "user", "content": "Book a table for 2 at Sakura at 7pm."}]
    first = oai.chat.completions.create(model=PUBLIC, messages=msgs, tools=[BOOK], max_tokens=64)
    assert first.choices[0].finish_reason == "tool_calls", first.choices[0].message
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "book_table"
    assert json.loads(call.function.arguments).get("restaurant") == "Sakura"
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": '{"status": "ok"}'}]
    second = oai.chat.completions.create(model=PUBLIC, messages=msgs, tools=[BOOK], max_tokens=48)
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls
    no_private(first.model_dump_json() + second.model_dump_json(), private_names)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
WEATHER_RESULT = '{"city": "Paris", "temp_c": 22, "sky": "sunny"}'


def _answered(text: str | None, calls) -> bool:
    return bool((text or "").strip()) or bool(calls)


def test_a_forced_call_then_its_result_is_answered_on_chat(oai, private_names):
    """Found by hand on 2026-12-07: after the tool result the answer was empty, its tokens
    generated and dropped by the engine's streaming tool parser. Whatever the specialist writes
    now reaches the client: a call it makes, or its words."""
    msgs = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    first = oai.chat.completions.create(model=PUBLIC, messages=msgs, tools=[WEATHER], tool_choice="required",
                                        max_tokens=64)
    calls = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and len(calls) == 1, first.choices[0].message
    assert calls[0].function.name == "get_weather"
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": calls[0].id, "content": WEATHER_RESULT}]
    for temperature in (0.0, 0.7):
        second = oai.chat.completions.create(model=PUBLIC, messages=msgs, tools=[WEATHER], max_tokens=48,
                                             temperature=temperature, seed=7)
        message = second.choices[0].message
        print(f"t={temperature}: {second.usage.completion_tokens} tokens -> {message.content!r} {message.tool_calls}")
        assert _answered(message.content, message.tool_calls), (temperature, second)
        streamed = list(oai.chat.completions.create(model=PUBLIC, messages=msgs, tools=[WEATHER], max_tokens=48,
                                                    temperature=temperature, seed=7, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        calls = [t for c in streamed if c.choices for t in c.choices[0].delta.tool_calls or ()]
        assert _answered(text, calls), (temperature, streamed)
        no_private(second.model_dump_json() + "".join(c.model_dump_json() for c in streamed), private_names)


def test_a_forced_tool_use_then_its_result_is_answered_on_messages(claude, private_names):
    tools = [{"name": "get_weather", "description": "The current weather in a city.",
              "input_schema": WEATHER["function"]["parameters"]}]
    msgs = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    first = claude.messages.create(model=PUBLIC, max_tokens=64, tools=tools, tool_choice={"type": "any"},
                                   messages=msgs)
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather", first
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                           "content": WEATHER_RESULT}]}]
    second = claude.messages.create(model=PUBLIC, max_tokens=48, tools=tools, messages=msgs)
    text = "".join(b.text for b in second.content if b.type == "text")
    print(f"{second.usage.output_tokens} tokens -> {text!r}")
    assert _answered(text, [b for b in second.content if b.type == "tool_use"]), second
    with claude.messages.stream(model=PUBLIC, max_tokens=48, tools=tools, messages=msgs) as stream:
        final = stream.get_final_message()
    assert _answered("".join(b.text for b in final.content if b.type == "text"),
                     [b for b in final.content if b.type == "tool_use"]), final
    no_private(second.model_dump_json() + final.model_dump_json(), private_names)


def test_responses_chain_and_messages_stream(oai, claude, private_names):
    r1 = oai.responses.create(model=PUBLIC, input="Hi! How are you today?", max_output_tokens=32)
    with oai.responses.stream(model=PUBLIC, input="Write a SQL query that counts orders per day.",
                              previous_response_id=r1.id, max_output_tokens=48) as stream:
        events = list(stream)
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.output_text
    with claude.messages.stream(model=PUBLIC, max_tokens=32,
                                messages=[{"role": "user", "content": "Tell me a fun fact about honeybees."}]) as s:
        final = s.get_final_message()
    assert final.content[0].text and final.stop_reason in ("end_turn", "max_tokens")
    no_private(r1.model_dump_json() + final.model_dump_json() + json.dumps([e.model_dump() for e in events]),
               private_names)


def test_a_bounded_loadtest_on_the_real_engine_adds_up(api):
    """`macaron loadtest`'s driver on the real model: what it reports is what it sent, and each
    turn's hops add up to the latency the ingress measured, within the client's."""
    import asyncio

    from macaron_ray.loadtest.client import LoadConfig, run_level
    from macaron_ray.loadtest.report import summarize
    from macaron_ray.loadtest.traces import load_traces

    traces = load_traces()
    cfg = LoadConfig(url=api.base_url, model=PUBLIC, conversations=2, max_requests=10, duration_s=60, max_tokens=24)
    records, wall_s = asyncio.run(run_level(cfg, traces, concurrency=2))
    assert 0 < len(records) <= 10 and all(r.ok for r in records), [r.error for r in records if not r.ok]
    summary = summarize(records, wall_s)
    assert summary["requests"]["sent"] == len(records)
    assert summary["requests"]["user_turns_ok"] + summary["requests"]["tool_results_ok"] == len(records)
    for r in records:
        s = r.server
        hops = s.get("route", 0.0) + s["wait"] + s["answer"]
        assert hops <= s["total"] + 0.002, s  # Server-Timing rounds to 0.1 ms per hop
        assert s["total"] - hops < 0.25, s  # what no hop accounts for stays small
        assert s["total"] <= r.client_total_s + 0.002


def test_requests_that_cannot_fit_the_context_get_a_400_before_the_engine(oai, claude, private_names):
    """Found by hand on 2026-12-04: both were 500s from the engine. (The unit tier checks that no
    engine request is made for them.)"""
    with pytest.raises(openai.BadRequestError) as huge:
        oai.chat.completions.create(model=PUBLIC, max_tokens=10**12, messages=[{"role": "user", "content": "hi"}])
    assert huge.value.body["param"] == "max_tokens" and huge.value.status_code == 400
    long = "please remember this word " * 8000  # about 40,000 tokens; the context is 4,096
    with pytest.raises(openai.BadRequestError) as chat:
        oai.chat.completions.create(model=PUBLIC, max_tokens=16, messages=[{"role": "user", "content": long}])
    assert chat.value.body["code"] == "context_length_exceeded"
    assert "maximum context length is 4096 tokens" in chat.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as messages:
        claude.messages.create(model=PUBLIC, max_tokens=16, messages=[{"role": "user", "content": long}])
    assert messages.value.body["error"]["type"] == "invalid_request_error"
    for err in (huge.value, chat.value, messages.value):
        no_private(json.dumps(err.body), private_names)
