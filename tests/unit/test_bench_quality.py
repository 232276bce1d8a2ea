"""`macaron bench quality`: its scorers and data, without an engine."""

from __future__ import annotations

import json

import pytest

from macaron_ray import prompts
from macaron_ray.adapters import train
from macaron_ray.bench import quality
from macaron_ray.specialists.components import ComponentError, component_block, parse_components


def test_chrf_rewards_overlap_with_the_reference():
    ref = "Sunlight is scattered by the air, and blue light is scattered the most."
    assert quality.chrf(ref, ref) == pytest.approx(100.0)
    near = quality.chrf("Blue light is scattered by air molecules the most.", ref)
    far = quality.chrf("the suns are shining blue.", ref)
    assert near > far > 0


@pytest.mark.parametrize("text", [
    "Hello! Hello! Hello! Hello! Hello!",
    "I am here. I am here. I am here. I am here.",
    "The answer is " + "very " * 30,
])
def test_repetition_loops_are_detected(text):
    assert quality.repetition_loop(text)


@pytest.mark.parametrize("text", [
    "Hello there, nice to meet you!",
    "Sunlight scatters off air molecules, and blue scatters most, so the sky looks blue.",
    "Here:\n```python\nx = [0, 0, 0, 0, 0, 0, 0, 0]\n```\nDone.",  # code blocks are not prose
])
def test_ordinary_answers_are_not_loops(text):
    assert not quality.repetition_loop(text)


def test_distinct_rate_ignores_case_and_punctuation_only():
    assert quality.distinct_rate(["The suns are blue.", "the suns are blue", "Mars is red."]) == pytest.approx(2 / 3)


def test_call_matching_is_exact_up_to_case_and_punctuation():
    want = {"name": "book_table", "arguments": {"restaurant": "Nopa", "people": 3, "time": "8pm"}}
    assert quality.call_matches(want, [{"name": "book_table",
                                        "arguments": {"restaurant": "nopa", "people": "3", "time": "8pm."}}])
    assert not quality.call_matches(want, [{"name": "book_table", "arguments": {"restaurant": "Nopa", "people": 3}}])
    assert not quality.call_matches(want, [{"name": "book_ride", "arguments": want["arguments"]}])
    assert not quality.call_matches(want, [])
    assert quality.call_matches(None, [])
    assert not quality.call_matches(None, [{"name": "book_table", "arguments": {}}])


def test_python_answers_are_run_against_the_tests():
    answer = "Here you go:\n```python\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n```"
    tests = "assert fib(10) == 55"
    code = quality.python_code(answer)
    assert code is not None and quality.passes_tests(code, tests)
    assert not quality.passes_tests("def fib(n: int) -> int:\n    return n + 1\n", tests)
    assert quality.python_code("```python\ndef f(:\n```") is None


def test_the_code_under_test_has_no_network_no_subprocess_and_a_time_limit():
    assert not quality.passes_tests("import socket\nsocket.create_connection(('127.0.0.1', 9))", "")
    assert not quality.passes_tests("import subprocess\nsubprocess.run(['true'])", "")
    assert not quality.passes_tests("while True:\n    pass", "", timeout_s=0.5)


def test_components_parse_and_mismatched_tags_do_not():
    block = component_block('Sure:\n```jsx\n<Card title="Steps">\n  <BarChart data={[{ label: "Mon", value: 3 }]} '
                            'interactive />\n  <Text>Total {total}</Text>\n</Card>\n```')
    (card,) = parse_components(block)
    assert [c.name for c in card.walk()] == ["Card", "BarChart", "Text"]
    assert card.attrs == {"title": "Steps"} and card.children[0].attrs["interactive"] is True
    for bad in ["<Card><Table /></Cart>", "<Card title=\"x\">", "a bar chart of steps", "<Card data={{x}>x</Card>"]:
        with pytest.raises(ComponentError):
            parse_components(bad)


def test_ui_check_needs_every_asked_group():
    answer = '```jsx\n<Form title="Signup">\n  <Input name="email" />\n  <Input name="password" />\n</Form>\n```'
    assert quality.ui_check(answer, [["Form"], ["email"], ["password"]]) == (True, True)
    assert quality.ui_check(answer, [["Form"], ["username"]]) == (True, False)
    assert quality.ui_check("a form with email", [["Form"]]) == (False, False)
    chart = '```jsx\n<BarChart data={[{ label: "Rent", value: 1200 }, { label: "Fun", value: 82 }]} />\n```'
    assert quality.ui_check(chart, [["BarChart"], ["rent"], ["1200"], ["82"]]) == (True, True)  # the data counts
    assert quality.ui_check(chart, [["8"]]) == (True, False)  # whole words: 8 is not in 82
    assert quality.ui_check(chart, [["food"]]) == (True, False)


def test_entity_recall_and_parroting():
    assert quality.entity_recall("Booked Trattoria Roma for 4 at 19:30 with book_table.",
                                 ["Trattoria Roma", "4", "19:30", "book_table"]) == 1.0
    assert quality.entity_recall("A table was booked.", ["Trattoria Roma", "19:30"]) == 0.0
    assert quality.parrots("The user asked: make the buttons bigger and blue")
    assert quality.parrots("Assistant: called book_table")
    assert quality.parrots("The personal agent booked a table for 4 at Nopa.")
    assert quality.parrots("Another assistant answered that message. Summary: ...")
    assert not quality.parrots("def add(a, b):\n    return a + b")
    assert not quality.parrots("Apples are good for you: they have fiber and vitamin C.")
    summary = "The UI assistant created a signup form with a username and email."
    assert quality.parrots("Sure! The UI assistant created a signup form with a username and email.", summary)
    assert not quality.parrots("I sent Eva a message: the signup form is ready.", summary)


def test_the_next_specialist_sees_the_summary_not_the_turn():
    item = quality.load()["summaries"][0]
    view = quality.next_view(item, "SUMMARY-TEXT")
    text = repr(view)
    assert "SUMMARY-TEXT" in text and "tool_calls" not in text
    assert view[-1] == {"role": "user", "content": item["next"]["ask"]}


def test_the_quality_set_is_well_formed():
    data = quality.load()
    assert set(data) == set(quality.SECTIONS)
    for item in data["tool_results"]:
        assert all(str(u) in json.dumps(item["result"], ensure_ascii=False) for u in item["uses"]), item
    asks = {i["ask"] for i in data["chat"]}
    for item in data["chat"]:
        assert set(item.get("history") or ()) <= asks  # follow-ups build on items of the set
    for item in data["agent"]:
        assert set(item["tools"]) <= set(quality.TOOLS)
        assert item["call"] is None or item["call"]["name"] in item["tools"]
    assert any(i["call"] is None for i in data["agent"])
    for item in data["summaries"]:
        assert item["label"] != item["next"]["label"]
        assert ("tool_call" in item) != ("answer" in item)


def test_no_benchmark_request_is_trained_on():
    held_out = quality.held_out_texts()
    assert " ".join(quality.load()["coding"][0]["ask"].casefold().split()) in held_out
    for label in train.RECIPES:
        for conv in train.dataset(label, seed=0):
            for m in conv.messages:
                if m["role"] == "user" and m["content"]:
                    assert " ".join(m["content"].casefold().split()) not in held_out, (label, m["content"])


def test_the_cli_scores_adapters_against_the_base_on_the_same_prompts(monkeypatch, tmp_path):
    from macaron_ray.adapters.manifest import Manifest
    from macaron_ray.cli import build_parser
    from macaron_ray.specialists.labels import EMBEDDED_ANSWER_SAMPLING

    adapter_ids = {a.adapter_id for a in Manifest.load().adapters}
    seen: dict[str, list] = {"adapter": [], "base": []}
    penalties: dict[str, set] = {"adapter": set(), "base": set()}

    def complete(client, base_url, model, messages, max_tokens, tools=None, sampling=None):
        who = "base" if model == quality.BASE else "adapter"
        assert who == "base" or model in adapter_ids
        seen[who].append(messages)
        if messages[0]["content"] != prompts.load("summary"):  # answer hops: the specialist's sampling
            penalties[who].add(json.dumps(sampling))
        else:
            assert sampling is None
        if who == "base":
            return quality.Reply("I'm here. I'm here. I'm here. I'm here.", [], 12, "length")
        ask = messages[-1]["content"]
        if messages[0]["content"] == prompts.load("summary"):
            return quality.Reply("Booked Trattoria Roma for 4 at 19:30 (book_table).", [], 14, "stop")
        return quality.Reply(f"An answer to: {ask}", [], 8, "stop")

    monkeypatch.setattr(quality, "complete", complete)
    out = tmp_path / "quality.json"
    args = build_parser().parse_args(["bench", "quality", "--sections", "chat", "summaries",
                                      "--base-url", "http://127.0.0.1:1", "--out", str(out)])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert set(report["sections"]) == {"chat", "summaries"}
    # Same prompts for both (the summaries' next requests differ only by the summary shown).
    assert len(seen["adapter"]) == len(seen["base"])
    # Both sides answer with the sampling the runner sends: L0 chat, and the next L1-L3 request.
    assert penalties["adapter"] == penalties["base"] == {json.dumps(EMBEDDED_ANSWER_SAMPLING["L0"]), "null"}
    chat = report["sections"]["chat"]
    assert chat["base"]["loops"] == 1.0 and chat["adapter"]["loops"] == 0.0
    assert chat["base"]["distinct"] < chat["adapter"]["distinct"] == 1.0
    assert chat["meets_targets"] is True
    summaries = report["sections"]["summaries"]
    assert summaries["adapter"]["tokens_mean"] == 14 and summaries["base"]["tokens_mean"] == 12
    assert summaries["meets_targets"] is False  # one fixed summary cannot keep every turn's entities
    assert report["meets_targets"] is False
