"""The external suites of `macaron bench quality` (HumanEval, BFCL): their harness, without an engine,
and the rule that nothing trains on them."""

from __future__ import annotations

import pytest

from macaron_ray.adapters import coding_distill, train
from macaron_ray.adapters.distill import load_distilled
from macaron_ray.bench import suites


def _fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\nDone."


def test_humaneval_is_the_whole_suite_and_its_canonical_solutions_pass_its_own_checks():
    problems = suites.humaneval_problems()
    assert len(problems) == 164
    # A spread of problems (every eighth): the harness runs prompt, answer, tests and check().
    for p in problems[::8]:
        assert suites.humaneval_passes(p, _fenced(p["prompt"] + p["canonical_solution"])), p["task_id"]


def test_humaneval_rejects_wrong_missing_and_body_only_answers():
    p = suites.humaneval_problems()[0]
    assert not suites.humaneval_passes(p, _fenced("def has_close_elements(numbers, threshold):\n    return False\n"))
    assert not suites.humaneval_passes(p, "I would compare every pair of numbers.")
    assert not suites.humaneval_passes(p, _fenced(p["canonical_solution"]))  # a bare body does not parse
    assert not suites.humaneval_passes(p, _fenced("input()\n"))  # no input to wait for


def test_humaneval_answers_that_loop_are_cut_by_the_time_limit(monkeypatch):
    monkeypatch.setattr(suites, "HUMANEVAL_TIMEOUT_S", 1.0)
    assert not suites.humaneval_passes(suites.humaneval_problems()[0], _fenced("while True:\n    pass\n"))


def _ground_truth_calls(item: suites.BfclItem) -> list[dict]:
    calls = []
    for answer in item.ground_truth:
        ((name, args),) = answer.items()
        calls.append({"name": name.replace(".", "_"),
                      "arguments": {k: v[0] for k, v in args.items() if v and v[0] != ""}})
    return calls


@pytest.mark.parametrize("category", suites.BFCL_CATEGORIES)
def test_bfcl_scores_calls_with_its_own_checker(category):
    items = suites.bfcl_items(category)
    assert len(items) >= 200
    right = [suites.bfcl_correct(i, _ground_truth_calls(i)) for i in items[:40]]
    assert sum(right) >= 36  # a few first-listed answers are not what the checker wants by itself
    item = items[0]
    assert not suites.bfcl_correct(item, [])
    wrong = _ground_truth_calls(item)
    wrong[0] = {"name": wrong[0]["name"] + "_x", "arguments": wrong[0]["arguments"]}
    assert not suites.bfcl_correct(item, wrong)


def test_bfcl_tools_use_openai_names_and_types():
    item = next(i for i in suites.bfcl_items("simple_python") if "." in i.functions[0]["name"])
    (tool,) = suites.bfcl_tools(item)
    assert tool["type"] == "function" and "." not in tool["function"]["name"]
    assert tool["function"]["parameters"]["type"] == "object"
    assert item.functions[0]["parameters"]["type"] == "dict"  # BFCL's own docs are left as they were
    calls = _ground_truth_calls(item)
    assert calls[0]["name"] == tool["function"]["name"] and suites.bfcl_correct(item, calls)


def test_bfcl_samples_spread_over_the_category():
    every = suites.bfcl_items("multiple")
    sample = suites.bfcl_sample("multiple", 10)
    assert len(sample) == 10 and sample[0] == every[0] and sample[-1].id != every[9].id
    assert suites.bfcl_sample("multiple", None) == list(every)


def test_targets_need_the_specialist_above_the_base():
    row = lambda n, of: {"passed": n, "of": of}  # noqa: E731
    assert suites.meets("humaneval", {"base": row(10, 164), "L0": row(6, 164), "L2": row(15, 164)})
    assert not suites.meets("humaneval", {"base": row(10, 164), "L0": row(6, 164), "L2": row(14, 164)})
    assert not suites.meets("humaneval", {"base": row(16, 164), "L0": row(6, 164), "L2": row(15, 164)})
    ok = lambda n: {"correct": n, "of": 100}  # noqa: E731
    assert suites.meets("bfcl", {"base": ok(5), "L0": ok(0), "L1": ok(15)})
    assert not suites.meets("bfcl", {"base": ok(5), "L0": ok(0), "L1": ok(14)})


def test_no_training_text_holds_a_suite_request():
    """The suites are never trained on: no message of any adapter's training data (nor the distilled
    answers, nor L2's self-distillation tasks) contains one of their requests."""
    texts = suites.suite_texts()
    assert len(texts) > 2000
    corpus = []
    for label in train.RECIPES:
        for conv in train.dataset(label, seed=0):
            corpus += [m["content"] for m in conv.messages if isinstance(m.get("content"), str)]
    corpus += [t for pair in load_distilled() for t in pair]
    corpus += [a for _, a in coding_distill.requests()] + [t.reference() for t in coding_distill.tasks()]

    def leaks(messages: list[str]) -> list[str]:
        folded = "\n".join(" ".join(t.casefold().split()) for t in messages)
        return [t for t in texts if len(t) >= 24 and t in folded]

    assert not leaks(corpus), leaks(corpus)[:3]
    # The check sees a leak: a suite request, as written, inside a training message.
    planted = "Please help:\n" + suites.humaneval_problems()[7]["prompt"] + "\nthanks"
    assert leaks([*corpus, planted])


def test_no_training_task_or_function_has_a_suite_function_name():
    """L2's tasks and L1's functions share no name with a HumanEval problem's function or a BFCL
    function (dots as BFCL sends them): a shared name would be half a leak."""
    from macaron_ray.adapters import agent_data

    humaneval = {p["entry_point"] for p in suites.humaneval_problems()}
    assert not {t.name for t in coding_distill.tasks()} & humaneval
    assert not {row["task"] for row in coding_distill.load()} & humaneval
    bfcl = {fn["name"].replace(".", "_").casefold() for c in suites.BFCL_CATEGORIES
            for item in suites.bfcl_items(c) for fn in item.functions}
    assert not {f.tool_name.casefold() for f in agent_data.functions()} & bfcl


def test_the_cli_runs_bfcl_as_base_l0_and_the_agent_on_the_same_requests(monkeypatch, tmp_path):
    import json

    from macaron_ray.adapters.manifest import Manifest
    from macaron_ray.bench import quality
    from macaron_ray.cli import build_parser

    ids = {a.label: a.adapter_id for a in Manifest.load().adapters}
    by_question = {i.messages[-1]["content"]: i for c in suites.BFCL_CATEGORIES for i in suites.bfcl_sample(c, 2)}
    seen: dict[str, list[str]] = {}

    def complete(client, base_url, model, messages, max_tokens, tools=None, sampling=None):
        item = by_question[messages[-1]["content"]]
        assert [t["function"]["name"] for t in tools] == [t["function"]["name"] for t in suites.bfcl_tools(item)]
        seen.setdefault(model, []).append(item.id)
        calls = _ground_truth_calls(item) if model == ids["L1"] else []
        return quality.Reply("" if calls else "I cannot do that.", calls, 3, "stop")

    monkeypatch.setattr(quality, "complete", complete)
    out = tmp_path / "q.json"
    args = build_parser().parse_args(["bench", "quality", "--base-url", "http://engine", "--suite", "bfcl",
                                      "--bfcl-limit", "2", "--out", str(out)])
    assert args.func(args) == 0
    rows = json.loads(out.read_text())["suites"]["bfcl"]
    assert set(seen) == {quality.BASE, ids["L0"], ids["L1"]}
    assert sorted(seen[quality.BASE]) == sorted(seen[ids["L0"]]) == sorted(seen[ids["L1"]])
    assert rows["base"]["correct"] == rows["L0"]["correct"] == 0 and rows["L1"]["of"] == 10
    assert rows["L1"]["correct"] >= 8 and rows["meets_targets"]


def test_a_suite_whose_package_is_missing_stops_before_any_engine_starts(monkeypatch, capsys):
    from macaron_ray import cli

    monkeypatch.setattr(suites.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(cli, "_on_engine", lambda *a: pytest.fail("an engine was started"))
    args = cli.build_parser().parse_args(["bench", "quality", "--suite", "project", "bfcl"])
    assert args.func(args) == 2
    assert "bfcl_eval" in capsys.readouterr().err
