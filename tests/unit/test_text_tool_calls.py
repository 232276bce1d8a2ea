"""Tool calls parsed from an answer's plain text: the same calls and text as vLLM's own
non-streaming pythonic parser, and no generated text ever dropped."""

from __future__ import annotations

import json

import pytest

from macaron_ray.core.engine_client import EngineRequest
from macaron_ray.engine.openai_http import StreamAccumulator, request_body, text_tool_calls
from macaron_ray.engine.text_tool_calls import may_become_calls, pythonic_calls, whole_calls

OUTPUTS = [
    '[get_weather(city="Paris")]',
    '[get_weather(city="Paris"), get_time(zone="CET", exact=True)]',
    ' [get_weather(city="Paris", days=3, opts={"unit": "C", "hours": [1, 2]})]',
    '[api.weather.get(city="Oslo")]',
    "[f()]",
    "[Sunny]",
    '["Sunny, 22C"]',
    "[get_weather(Paris)]",
    '[get_weather(city="Paris")] It is sunny.',
    "It is sunny in Paris, 22C.",
    "[1, 2, 3]",
    "[get_weather(city=x)]",
    "",
    "[",
]


def _vllm_extract(text: str):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    parser = ToolParserManager.get_tool_parser("pythonic")(None)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    return parser.extract_tool_calls(text, request)


@pytest.mark.parametrize("text", OUTPUTS)
def test_the_calls_are_vllms_own_reading(text):
    ours = pythonic_calls(text)
    theirs = _vllm_extract(text)
    assert (ours is not None) == theirs.tools_called, text
    if ours is not None:
        assert [(c.function.name, json.loads(c.function.arguments)) for c in ours] == \
            [(c.function.name, json.loads(c.function.arguments)) for c in theirs.tool_calls]


def _chunks(text: str, size: int = 3) -> list[dict]:
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    out = [{"id": "cmpl-1", "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
           for p in pieces]
    out.append({"id": "cmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    out.append({"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}})
    return out


def _accumulate(text: str) -> tuple[list[str], object]:
    """The text deltas streamed for an answer of `text` (asked for as plain text), and the final delta."""
    acc = StreamAccumulator(text_calls=True)
    deltas = [d for chunk in _chunks(text) if (d := acc.feed(chunk)) is not None]
    assert len(deltas) == len(_chunks(text)) - 2  # one per text chunk, held or not
    return [d.text for d in deltas if d.text], acc.final()


@pytest.mark.parametrize("text", OUTPUTS)
def test_generated_text_is_never_dropped(text):
    streamed, final = _accumulate(text)
    calls = pythonic_calls(text)
    if calls is not None:
        assert streamed == [] and final.text == "" and final.finish_reason == "tool_calls"
        assert [c.function.name for c in final.tool_calls] == [c.function.name for c in calls]
    else:
        assert "".join(streamed) + final.text == text and final.tool_calls == ()
        assert final.finish_reason == "stop"


def test_plain_text_streams_at_once():
    streamed, final = _accumulate("It is sunny in Paris, 22C.")
    assert len(streamed) > 3 and streamed[0] == "It " and final.text == ""


def test_text_that_cannot_open_a_call_is_let_go_at_once():
    assert may_become_calls("") and may_become_calls("  ") and may_become_calls("[") and may_become_calls("[ get")
    assert may_become_calls("[api.get_weather (") and may_become_calls('[f(city="Par')
    assert not may_become_calls("[1") and not may_become_calls("[Sunny,") and not may_become_calls("[f x")
    assert not may_become_calls(" [f(") and not may_become_calls("Sunny")
    streamed, final = _accumulate("[1] Smith et al. showed that it works.")
    assert streamed[0] == "[1]" and "".join(streamed) + final.text == "[1] Smith et al. showed that it works."


def test_a_call_the_model_chose_twice_is_kept_and_a_forced_one_written_twice_is_one():
    streamed, final = _accumulate('[roll(sides=6), roll(sides=6)]')
    assert [c.function.name for c in final.tool_calls] == ["roll", "roll"]
    (call,) = whole_calls(pythonic_calls('[f(a=1), f(a=1), f(a=2)]')[:2], forced=True)
    assert call.function.arguments == '{"a": 1}'
    # A forced call (`required`) written twice, its JSON spaced differently: one call; or written
    # again until the token budget ran out: the whole call is the answer.
    assert _forced_calls('{\n  "city":"Paris"\n}', '{"city": "Paris"}', finish="tool_calls") == ["c0"]
    assert _forced_calls('{"city": "Paris"}', '{\n  "city" : "Par', finish="length") == ["c0"]


def _forced_calls(*arguments: str, finish: str) -> list[str]:
    """The ids of the calls delivered when the engine streamed calls of `get_weather` with these
    arguments for a request that forced a call."""
    acc = StreamAccumulator(forced=True)
    for i, args in enumerate(arguments):
        acc.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": f"c{i}", "function": {
            "name": "get_weather", "arguments": args}}]}, "finish_reason": None}]})
    acc.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return [c.id for c in acc.final().tool_calls]


def test_auto_turns_ask_the_engine_for_text_and_forced_ones_do_not():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    auto = EngineRequest(adapter="a", messages=[], tools=tools, tool_choice="auto")
    forced = EngineRequest(adapter="a", messages=[], tools=tools, tool_choice="required")
    assert text_tool_calls(auto, "pythonic") and not text_tool_calls(forced, "pythonic")
    assert not text_tool_calls(auto, "qwen3_coder") and not text_tool_calls(auto, None)
    body = request_body(auto, text_calls=True)
    assert body["tool_choice"] == "none" and body["tools"] == tools  # the tools stay in the prompt
    assert "tools" not in request_body(EngineRequest(adapter="a", messages=[], tools=[]))
