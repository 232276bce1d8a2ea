"""The API surfaces on the real local model (base + four adapters on a vLLM CPU engine), via the SDKs."""

from __future__ import annotations

import json
import re

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


def test_tool_results_are_answered_in_words_with_their_values_on_all_three_surfaces(oai, claude, private_names):
    """The authored round trips of `bench quality` (a request, the call, the tool's result), each
    sent the way its surface's SDK sends a tool result, with a history this deployment never
    stored (the tool specialist answers): every surface delivers the same answers, and they are
    words that carry the result's values. Issue 33's target is 90 %; the committed L1 reached
    83.3 % on each surface (2026-12-07), so this holds it there as a floor (at most four misses
    of 24) until a retrained L1 meets the target."""
    from macaron_ray.bench.quality import item_tool, load, tool_round_trip, uses_result

    items = load()["tool_results"]
    used: dict[str, list[bool]] = {"chat": [], "responses": [], "messages": []}
    for item in items:
        tool, result = item_tool(item)["function"], json.dumps(item["result"], ensure_ascii=False)
        args = json.dumps(item["call"], ensure_ascii=False)
        chat = oai.chat.completions.create(model=PUBLIC, messages=tool_round_trip(item), tools=[item_tool(item)],
                                           max_tokens=64)
        used["chat"].append(uses_result(chat.choices[0].message.content or "", chat.choices[0].message.tool_calls or [],
                                        item["uses"]))
        resp = oai.responses.create(model=PUBLIC, max_output_tokens=64, tools=[{"type": "function", **tool}], input=[
            {"role": "user", "content": item["ask"]},
            {"type": "function_call", "call_id": "call_1", "name": tool["name"], "arguments": args},
            {"type": "function_call_output", "call_id": "call_1", "output": result}])
        used["responses"].append(uses_result(resp.output_text, [o for o in resp.output if o.type == "function_call"],
                                             item["uses"]))
        msg = claude.messages.create(model=PUBLIC, max_tokens=64, tools=[{
            "name": tool["name"], "description": tool["description"], "input_schema": tool["parameters"]}], messages=[
            {"role": "user", "content": item["ask"]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": tool["name"],
                                               "input": item["call"]}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}])
        used["messages"].append(uses_result("".join(b.text for b in msg.content if b.type == "text"),
                                            [b for b in msg.content if b.type == "tool_use"], item["uses"]))
        no_private(chat.model_dump_json() + resp.model_dump_json() + msg.model_dump_json(), private_names)
    rates = {surface: sum(ok) / len(ok) for surface, ok in used.items()}
    print(f"answered in words with the result's values ({len(items)} round trips): {rates}")
    assert used["chat"] == used["responses"] == used["messages"], used  # one answer, three envelopes
    assert all(rate >= 20 / 24 for rate in rates.values()), rates


def _readme_requests() -> list[str]:
    """The requests of the README's "First requests" section: the curl example's, then the quoted ones."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## First requests", 1)[1].split("\n## ", 1)[0]
    curl = re.search(r'"content": "([^"]+)"', section).group(1)
    return [curl, *[" ".join(q.split()) for q in re.findall(r'"([A-Z][^"]+[.?!])"', section.split("```")[-1])]]


def test_the_readme_coding_example_returns_code_that_passes_a_test(oai):
    from macaron_ray.bench.quality import passes_tests, python_code

    ask = _readme_requests()[0]
    assert ask == "Write a Python function that reverses a string."
    answer = oai.chat.completions.create(model=PUBLIC, messages=[{"role": "user", "content": ask}],
                                         max_tokens=200).choices[0].message.content
    code = python_code(answer or "")
    assert code and (name := re.search(r"def (\w+)\(", code)), answer
    assert passes_tests(code, f"assert {name.group(1)}('hello') == 'olleh'\nassert {name.group(1)}('') == ''"), answer


BOOK_TOOL = {"type": "function", "function": {
    "name": "book_table", "description": "Reserve a restaurant table.",
    "parameters": {"type": "object", "properties": {"restaurant": {"type": "string"}, "people": {"type": "integer"},
                                                    "time": {"type": "string"}}, "required": ["restaurant"]}}}
REMIND_TOOL = {"type": "function", "function": {
    "name": "set_reminder", "description": "Remind the user of something.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}, "when": {"type": "string"}},
                   "required": ["text", "when"]}}}


def _words(answer: str, must: str | None = None) -> bool:
    from macaron_ray.core.text import repetition_loop

    return (len(answer.split()) >= 3 and "```" not in answer and not repetition_loop(answer)
            and (must is None or must.casefold() in answer.casefold()))


def _code(answer: str, must: str) -> bool:
    return "```" in answer and must.casefold() in answer.casefold()


def _ui(answer: str, contains: list[list[str]]) -> bool:
    from macaron_ray.specialists.components import ui_check

    return ui_check(answer, contains) == (True, True)


# (request, tools, check of the answer text, the call expected or None): the README's requests and
# a dozen everyday ones, across the four specialists.
EVERYDAY = [
    ("Give me three tips to sleep better.", None, lambda a: _words(a), None),
    ("Book a table for 2 at Sakura at 7pm.", [BOOK_TOOL], None, ("book_table", {"restaurant": "Sakura"})),
    ("Show my weekly steps as a bar chart: Mon 5000, Tue 7000, Wed 6500.", None,
     lambda a: _ui(a, [["BarChart"], ["5000"], ["7000"], ["6500"]]), None),
    ("Hi! How are you today?", None, lambda a: _words(a), None),
    ("What is the capital of Italy?", None, lambda a: _words(a, "Rome"), None),
    ("Tell me a joke.", None, lambda a: _words(a), None),
    ("How do I read a CSV file in Python?", None, lambda a: _code(a, "csv"), None),
    ("Write a SQL query that counts the orders of each customer.", None, lambda a: _code(a, "count"), None),
    ("Write a JavaScript function that adds two numbers.", None, lambda a: _code(a, "function"), None),
    ("Remind me to call mom tomorrow at 6pm.", [REMIND_TOOL], None, ("set_reminder", {})),
    ("Build a signup form with name and email fields.", None, lambda a: _ui(a, [["Form"], ["name"], ["email"]]), None),
    ("Make a pie chart of my budget: rent 900, food 300, fun 100.", None,
     lambda a: _ui(a, [["PieChart"], ["900"], ["300"], ["100"]]), None),
]


def test_the_readme_requests_and_everyday_requests_get_sensible_answers(oai, private_names):
    readme = _readme_requests()[1:]
    assert readme and set(readme) <= {ask for ask, *_ in EVERYDAY}, readme
    failed = []
    for ask, tools, check, call in EVERYDAY:
        reply = oai.chat.completions.create(model=PUBLIC, messages=[{"role": "user", "content": ask}],
                                            max_tokens=200, **({"tools": tools} if tools else {}))
        message = reply.choices[0].message
        no_private(reply.model_dump_json(), private_names)
        if call is not None:
            calls = message.tool_calls or []
            ok = len(calls) == 1 and calls[0].function.name == call[0] and all(
                json.loads(calls[0].function.arguments).get(k) == v for k, v in call[1].items())
        else:
            ok = not message.tool_calls and check(message.content or "")
        print(f"{'ok ' if ok else 'BAD'} {ask!r} -> {message.content!r} {message.tool_calls}")
        if not ok:
            failed.append(ask)
    assert not failed, failed
