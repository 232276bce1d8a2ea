"""L1's authored functions: every call the generator writes is one a correct agent makes."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from macaron_ray.adapters import agent_data
from macaron_ray.bench import quality


def test_every_ask_yields_a_call_valid_under_the_schema_with_the_values_it_names():
    for fn in agent_data.functions():
        jsonschema.Draft202012Validator.check_schema(fn.schema)
        assert "." not in fn.tool_name
        for ask in fn.asks:
            for seed in range(5):
                text, args = agent_data.draw(fn, ask, random.Random(seed))
                agent_data.check(fn, ask, text, args)  # a required param no ask names fails here
                assert "{" not in text, text


def test_the_check_rejects_wrong_calls():
    fn = next(f for f in agent_data.functions() if f.name == "arith.greatest_common_divisor")
    ask = fn.asks[0]
    text, args = agent_data.draw(fn, ask, random.Random(0))
    with pytest.raises(jsonschema.ValidationError):
        agent_data.check(fn, ask, text, {"a": args["a"]})  # a required argument left out
    with pytest.raises(jsonschema.ValidationError):
        agent_data.check(fn, ask, text, {**args, "a": str(args["a"])})  # a string for an integer
    with pytest.raises(AssertionError):
        agent_data.check(fn, ask, text, {**args, "a": args["a"] + 1})  # not the value asked for


def test_tool_results_are_answered_in_the_asks_language_with_every_value():
    for fn in agent_data.functions():
        if not fn.result:
            continue
        for ask in fn.asks:
            assert ask.lang in fn.answers, (fn.name, ask.lang)
            rng = random.Random(1)
            _, args = agent_data.draw(fn, ask, rng)
            result = {k: rng.choice(pool) for k, pool in fn.result.items()}
            assert agent_data.check_answer(result, agent_data.answer(fn, ask.lang, args, result))
    assert not agent_data.check_answer({"kwh": 312}, "You used a lot of electricity.")
    assert not agent_data.check_answer({"kwh": 312}, "")


def test_conversations_take_every_shape_and_eight_languages():
    convs = agent_data.conversations(100, seed=0)
    assert convs == agent_data.conversations(100, seed=0)  # a pure function of the seed
    plain = [c for c in convs if len(c.messages) == 2 and not c.messages[1].get("tool_calls")]
    assert len(plain) == 10 and all(c.tools for c in plain)  # functions offered, none needed
    convs = [c for c in convs if c not in plain]
    calls = [c.messages[1]["tool_calls"] for c in convs]
    assert sum(len(c) == 2 for c in calls) == 20
    results = [c for c in convs if c.messages[-1]["role"] == "assistant" and c.messages[-1]["content"]]
    assert len(results) == 40 and all(c.messages[2]["role"] == "tool" for c in results)
    for conv in convs:
        offered = {t["function"]["name"] for t in conv.tools}
        assert {c["function"]["name"] for c in conv.messages[1]["tool_calls"]} <= offered
    langs = {a.lang for f in agent_data.functions() for a in f.asks}
    assert langs == {"en", "de", "fr", "es", "it", "pt", "ru", "zh"}


def test_no_function_is_a_held_out_round_trips():
    """Training functions are not the held-out round trips' (BFCL's names: test_bench_suites)."""
    ours = {f.tool_name.casefold() for f in agent_data.functions()}
    held_out = {i["tool"]["name"].casefold() for i in quality.load()["tool_results"]}
    assert not ours & held_out, ours & held_out


def test_a_tool_result_round_trip_is_scored_on_words_that_carry_the_values():
    item = quality.load()["tool_results"][0]
    messages = quality.tool_round_trip(item)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert json.loads(messages[1]["tool_calls"][0]["function"]["arguments"]) == item["call"]
    assert json.loads(messages[2]["content"]) == item["result"]
    assert quality.item_tool(item)["function"]["name"] == item["tool"]["name"]
    assert quality.uses_result("It leaves at 14:35 from gate B12.", [], ["14:35"])
    assert not quality.uses_result("It is delayed.", [], ["14:35"])
    assert not quality.uses_result("14:35", [{"name": "flight_status", "arguments": {}}], ["14:35"])
    assert not quality.uses_result("", [], [])


def test_the_tool_results_section_reports_what_every_section_does(monkeypatch):
    """Each section's row carries `loops` beside its own figures (the e2e tier reads it on every one)."""
    items = quality.load()["tool_results"][:2]
    monkeypatch.setattr(quality, "complete", lambda client, url, model, messages, max_tokens, tools=None,
                        sampling=None: quality.Reply("It leaves at 14:35. It leaves at 14:35.", [], 9, "stop"))
    runner = quality.Runner("http://engine", {"L1": "agent"})
    try:
        row = runner.tool_results(items)
    finally:
        runner.close()
    assert {"answered_using", "empty", "called_again", "loops", "samples"} <= set(row)
    assert row["answered_using"] == 0.5 and row["empty"] == 0.0 and len(row["samples"]) == 2
