"""L2's verified self-distillation (`adapters/coding_distill.py`), without an engine."""

from __future__ import annotations

import pytest

from macaron_ray.adapters import coding_distill as cd
from macaron_ray.bench.quality import passes_tests


def _fenced(code: str) -> str:
    return f"Sure:\n```python\n{code}```"


def test_the_tasks_are_many_distinct_and_each_check_can_pass_and_can_fail():
    tasks = cd.tasks()
    assert len(tasks) >= 120 and len({t.name for t in tasks}) == len(tasks)
    for t in tasks:  # the project's own reference code: run in-process (the sandbox is for answers)
        namespace: dict = {}
        exec(t.reference() + "\n" + t.tests, namespace)  # the reference body passes its tests
        with pytest.raises(Exception):  # a stub does not
            exec(f"{t.sig}:\n    return None\n" + t.tests, {})
    assert passes_tests(tasks[0].reference(), tasks[0].tests)  # and the sandbox runs them the same way


def test_requests_ask_each_task_as_a_stub_and_in_words_in_eight_languages():
    reqs = cd.requests()
    assert len(reqs) == 3 * len(cd.tasks())
    asks = [a for _, a in reqs]
    assert len(set(asks)) == len(asks)
    for lang, template in cd.WORD_ASKS.items():
        lead = template.split("`")[0]
        assert any(a.startswith(lead) for a in asks), lang
    task, ask = reqs[0]
    assert task.stub() in ask and task.doc in ask


def test_only_answers_that_define_the_function_and_pass_its_tests_are_verified():
    task = next(t for t in cd.tasks() if t.name == "nth_fibonacci")
    assert cd.verified(task, _fenced(task.reference()))
    assert not cd.verified(task, _fenced("def nth_fibonacci(n: int) -> int:\n    return n + 1\n"))
    assert not cd.verified(task, _fenced(task.reference().replace("nth_fibonacci", "fib")))
    assert not cd.verified(task, "Use a loop that adds the last two numbers.")


def test_a_round_keeps_verified_distinct_answers_and_the_rows_of_earlier_rounds(monkeypatch, tmp_path):
    tasks = cd.tasks()[:3]
    monkeypatch.setattr(cd, "tasks", lambda: tasks)
    out = tmp_path / "distilled.jsonl"
    out.write_text('{"task": "x", "ask": "earlier", "answer": "kept", "round": 0, "from": "base"}\n')
    wrong = "def {name}(*args):\n    return 'wrong'\n"

    def sample(client, base_url, model, ask, seed):
        task = next(t for t in tasks if t.stub() in ask or t.call in ask)
        right = _fenced(task.reference())
        other = _fenced("# another way\n" + task.reference())
        if model == "base":
            return [(right, "stop"), (right, "stop"), (_fenced(wrong.format(name=task.name)), "stop"),
                    (other, "length"), (other, "stop")]
        return [(_fenced("# third\n" + task.reference()), "stop")]

    monkeypatch.setattr(cd, "_sample", sample)
    result = cd.run("http://engine", {"base": "base", "L2": "mol-l2"}, round_=1, out=out)
    rows = cd.load(out)
    assert rows[0]["ask"] == "earlier"
    new = rows[1:]
    assert result["rows"] == len(rows) and result["tasks_solved"] == 3
    per_ask: dict[str, list[str]] = {}
    for r in new:
        per_ask.setdefault(r["ask"], []).append(r["answer"])
        assert r["round"] == 1 and "wrong" not in r["answer"]
    assert len(per_ask) == 9  # three requests per task
    assert all(len(v) == cd.KEEP_PER_REQUEST and len(set(v)) == len(v) for v in per_ask.values())
    assert result["added"] == {"base": 18, "L2": 0}  # the base's two distinct answers fill each request


def test_l2_trains_on_the_verified_answers_and_no_unverified_python(monkeypatch, tmp_path):
    from macaron_ray.adapters import train

    out = tmp_path / "distilled.jsonl"
    task = cd.tasks()[0]
    out.write_text(f'{{"task": "{task.name}", "ask": "Write it.", "answer": "```python\\n{task.sig}: ...\\n```", '
                   '"round": 1, "from": "base"}\n')
    monkeypatch.setattr(cd, "DISTILLED", out)
    convs = train.dataset("L2", seed=0)
    python = [c for c in convs if "```python" in c.messages[-1]["content"]]
    assert [c.messages[0]["content"] for c in python] == ["Write it."]
    assert len(convs) > len(python)  # the other languages' snippets stay


@pytest.mark.parametrize("lang", ["de", "zh"])
def test_word_asks_carry_the_call_and_the_doc(lang):
    t = cd.tasks()[0]
    ask = cd.WORD_ASKS[lang].format(call=t.call, doc=t.doc)
    assert t.call in ask and t.doc in ask and "->" not in t.call


def test_a_request_with_its_answers_is_not_asked_again(monkeypatch, tmp_path):
    tasks = cd.tasks()[:2]
    monkeypatch.setattr(cd, "tasks", lambda: tasks)
    full_task, full_ask = cd.requests()[0]
    out = tmp_path / "distilled.jsonl"
    import json

    out.write_text("".join(json.dumps({"task": full_task.name, "ask": full_ask, "answer": a, "round": 1,
                                       "from": "base"}) + "\n" for a in ("one", "two")))
    asked = []

    def sample(client, base_url, model, ask, seed):
        asked.append(ask)
        return []

    monkeypatch.setattr(cd, "_sample", sample)
    result = cd.run("http://engine", {"L2": "mol-l2"}, round_=2, out=out)
    assert full_ask not in asked and len(asked) == 5 and result["requests"] == 5
