"""Verified self-distillation of L2, the coding specialist: the report's self-improvement loop in miniature.

Each round asks the project's own coding tasks (`data/coding_tasks.yaml`: written here, each with
a reference body and tests) of the base and of the current adapter, several samples each, runs
every answer's code against the task's tests in the sandbox `bench.quality` scores with, and keeps
only the answers that pass. L2 is then trained on what passed (`train.dataset("L2")`), and the
next round samples from the new adapter. `macaron adapters distill-code` writes the kept answers to
`data/l2_coding_distilled.jsonl`, committed: training never needs an engine, and the file is the
exact data the adapter learned (its hash is in the manifest).

No external suite is sampled or mined: the tasks are this project's, and a unit test holds every
training text clear of HumanEval's and BFCL's requests.
"""

from __future__ import annotations

import hashlib
import json
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import httpx
import yaml

from macaron_ray.adapters.routing_sets import DATA_DIR

TASKS = DATA_DIR / "coding_tasks.yaml"
DISTILLED = DATA_DIR / "l2_coding_distilled.jsonl"
MAX_TOKENS = 384
SAMPLES = 4
"""Sampled answers per request and model (temperature `TEMPERATURE`), beside the greedy one."""
TEMPERATURE = 0.8
KEEP_PER_REQUEST = 2
"""Distinct passing answers kept per request: more would let the easy tasks drown the rest."""
CONCURRENCY = 16

# How a user asks for a function: with its stub (signature and docstring), or in words, in eight
# languages (the docstring is the task's own English sentence).
STUB_ASKS = (
    "Complete the following Python function. Answer with the whole function in one Python code block."
    "\n\n```python\n{stub}```",
    "Implement this function:\n\n```python\n{stub}```",
    "Fill in the body of this Python function so that it does what its docstring says.\n\n```python\n{stub}```",
)
WORD_ASKS = {
    "en": "Write a Python function `{call}`. {doc}",
    "de": "Schreib eine Python-Funktion `{call}`. {doc}",
    "fr": "Écris une fonction Python `{call}`. {doc}",
    "es": "Escribe una función de Python `{call}`. {doc}",
    "it": "Scrivi una funzione Python `{call}`. {doc}",
    "pt": "Escreva uma função Python `{call}`. {doc}",
    "ru": "Напиши функцию на Python `{call}`. {doc}",
    "zh": "写一个 Python 函数 `{call}`。{doc}",
}


@dataclass(frozen=True)
class Task:
    sig: str
    doc: str
    body: str
    tests: str

    @property
    def name(self) -> str:
        return self.sig.removeprefix("def ").split("(", 1)[0]

    @property
    def call(self) -> str:
        """The signature without its annotations' return part: `name(arg: type, ...)`."""
        return self.sig.removeprefix("def ").split(" -> ", 1)[0]

    def stub(self) -> str:
        return f'{self.sig}:\n    """{self.doc}"""\n'

    def reference(self) -> str:
        return self.sig + ":\n" + "\n".join("    " + line for line in self.body.splitlines()) + "\n"


@cache
def tasks() -> tuple[Task, ...]:
    return tuple(Task(**t) for t in yaml.safe_load(TASKS.read_text(encoding="utf-8")))


def requests(seed: int = 0) -> list[tuple[Task, str]]:
    """Three requests per task: its stub in one wording, in English words, in one other language."""
    rng = random.Random(f"{seed}:L2-distill")
    others = [lang for lang in WORD_ASKS if lang != "en"]
    out = []
    for i, task in enumerate(tasks()):
        out.append((task, rng.choice(STUB_ASKS).format(stub=task.stub())))
        out.append((task, WORD_ASKS["en"].format(call=task.call, doc=task.doc)))
        out.append((task, WORD_ASKS[others[i % len(others)]].format(call=task.call, doc=task.doc)))
    return out


def verified(task: Task, answer: str) -> bool:
    """The answer's Python defines the task's function and passes the task's tests (sandboxed)."""
    from macaron_ray.bench.quality import passes_tests, python_code
    from macaron_ray.core.text import repetition_loop

    code = python_code(answer)
    return (code is not None and f"def {task.name}(" in code and not repetition_loop(answer)
            and passes_tests(code, task.tests))


def _sample(client: httpx.Client, base_url: str, model: str, ask: str, seed: int) -> list[tuple[str, str | None]]:
    """The greedy answer and `SAMPLES` sampled ones: (text, finish reason) each."""
    messages = [{"role": "user", "content": ask}]
    out = []
    for body in ({"temperature": 0.0, "n": 1}, {"temperature": TEMPERATURE, "top_p": 0.95, "n": SAMPLES,
                                                 "seed": seed}):
        resp = client.post(f"{base_url}/v1/chat/completions",
                           json={"model": model, "messages": messages, "max_tokens": MAX_TOKENS, **body})
        resp.raise_for_status()
        out += [(c["message"].get("content") or "", c.get("finish_reason")) for c in resp.json()["choices"]]
    return out


def run(base_url: str, models: dict[str, str], round_: int, out: Path = DISTILLED, seed: int = 0) -> dict:
    """One round: sample every request from each of `models` (who -> engine model name), keep the
    verified answers, and add them to `out` (earlier rounds' rows are kept)."""
    rows = load(out)
    kept_per_ask: dict[str, set[str]] = {}
    for r in rows:
        kept_per_ask.setdefault(r["ask"], set()).add(r["answer"])
    # A request that already has its answers is not asked again.
    reqs = [(task, ask) for task, ask in requests(seed) if len(kept_per_ask.get(ask, ())) < KEEP_PER_REQUEST]
    client = httpx.Client(timeout=600.0)
    jobs = [(who, model, task, ask, int(hashlib.sha256(f"{seed}:{round_}:{ask}".encode()).hexdigest()[:8], 16))
            for who, model in models.items() for task, ask in reqs]

    def one(job):
        who, model, task, ask, job_seed = job
        return [(who, task, ask, text) for text, finish in _sample(client, base_url, model, ask, job_seed)
                if finish == "stop" and verified(task, text)]

    try:
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            passed = [row for rows in pool.map(one, jobs) for row in rows]
    finally:
        client.close()
    added = {who: 0 for who in models}
    for who, task, ask, text in passed:
        answer = text.strip()
        have = kept_per_ask.setdefault(ask, set())
        if answer in have or len(have) >= KEEP_PER_REQUEST:
            continue
        have.add(answer)
        rows.append({"task": task.name, "ask": ask, "answer": answer, "round": round_, "from": who})
        added[who] += 1
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    solved = {t.name for _, t, _, _ in passed}
    return {"requests": len(reqs), "samples": len(jobs) * (SAMPLES + 1), "passed": len(passed),
            "added": added, "tasks_solved": len(solved), "tasks": len(tasks()), "rows": len(rows)}


def load(path: Path = DISTILLED) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def conversations(path: Path | None = None) -> list:
    """The kept answers (of `DISTILLED` by default) as L2's training conversations, in the file's
    order."""
    from macaron_ray.adapters.answer_data import Conversation

    path = path or DISTILLED
    if not path.exists():
        raise FileNotFoundError(f"L2's training data {path.name} is missing from the package")
    return [Conversation(summary=f"The coding assistant wrote the Python function {r['task']}.",
                         messages=[{"role": "user", "content": r["ask"]},
                                   {"role": "assistant", "content": r["answer"]}])
            for r in load(path)]
