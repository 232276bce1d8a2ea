"""`macaron bench quality`: each specialist against the base, on its own domain's held-out prompts.

Same engine, same prompts, temperature 0; only the adapter differs. The prompts
and their checks are `adapters/data/quality.yaml` (never trained on).

    L0 chat     chrF against an authored reference; distinct answers for distinct questions;
                repetition loops
    L1 agent    with tools offered: the expected call (function and arguments), or no call
    L2 coding   the answer's code parses and passes the item's tests (subprocess, time limit,
                no network)
    L3 GenUI    the component block parses under `specialists.components` and contains what
                was asked
    tool results  after the tool ran (the call, then its result): an answer in words, no new call,
                that carries the result's values the item names
    summaries   the summary hop on a delivered turn: recall of its names, numbers and dates,
                length in tokens, loops (and how many the runner would replace by the user
                message); then the next request, to another specialist whose own-view shows
                what the runner stores: the rate of answers that parrot the summary

Base rows run the same hops on the base: its own summaries, its own answers.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from macaron_ray.adapters.answer_data import TOOLS, function_tool
from macaron_ray.adapters.manifest import BUILT_DIR, Manifest
from macaron_ray.core.conversation import Message, TurnMeta, split_turns
from macaron_ray.core.own_view import own_view
from macaron_ray.core.summary_hop import (
    SUMMARY_BUDGET_TOKENS, answer_digest, begun, stored_summary, summary_messages, usable,
)
from macaron_ray.core.text import repetition_loop
from macaron_ray.paths import PACKAGE_DIR
from macaron_ray.specialists.components import ui_check
from macaron_ray.specialists.labels import EMBEDDED_ANSWER_SAMPLING

DATA = PACKAGE_DIR / "adapters" / "data" / "quality.yaml"
BASE = "base"
"""The engine's served name of the base model (no adapter)."""
MAX_TOKENS = {"chat": 192, "agent": 128, "coding": 320, "ui": 320, "tool_results": 96}
TEST_TIMEOUT_S = 5.0
CONCURRENCY = 8

TARGETS = {
    "chat": "chrF >= 95 % of the base's, loops < 1 %, distinct >= base",
    "agent": "exact calls >= base",
    "coding": "tests passed >= base",
    "ui": "parse and contains >= base",
    "tool_results": "answered in words with the result's values >= 90 % and >= base",
    "summaries": "entity recall >= 90 % and >= base, parroting 0",
}


def load() -> dict:
    return yaml.safe_load(DATA.read_text(encoding="utf-8"))


def held_out_texts() -> set[str]:
    """Every benchmark request, case and spacing folded: this set's and the routing sets' (field,
    authored held-out concepts, follow-ups). No training data may contain one."""
    from macaron_ray.adapters.routing_sets import authored, field_set, followups

    data = load()
    texts = [i["ask"] for s in ("chat", "agent", "coding", "ui", "tool_results") for i in data[s]]
    texts += [i["user"] for i in data["summaries"]] + [i["next"]["ask"] for i in data["summaries"]]
    texts += [r.text for r in [*field_set("field"), *field_set("field2"), *authored("heldout"),
                               *followups("heldout", 0)]]
    return {" ".join(t.casefold().split()) for t in texts}


# --- scorers (pure) ------------------------------------------------------------------------------

def chrf(hypothesis: str, reference: str) -> float:
    """Sentence chrF (sacrebleu's, character 6-grams, beta 2), in [0, 100]."""
    from sacrebleu.metrics import CHRF

    return CHRF().sentence_score(hypothesis, [reference]).score


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def distinct_rate(answers: list[str]) -> float:
    """Distinct answers (after case, punctuation and spacing are normalized) per answer."""
    return len({_normal(a) for a in answers}) / max(1, len(answers))


def _value(v) -> object:
    if isinstance(v, list):
        return [_value(x) for x in v]
    return _normal(str(v))


def call_matches(expected: dict | None, calls: list[dict]) -> bool:
    """Exactly the expected call (function name, and arguments up to case and punctuation), or
    no call at all when none is expected."""
    if expected is None:
        return not calls
    if len(calls) != 1 or calls[0]["name"] != expected["name"]:
        return False
    got = calls[0]["arguments"]
    want = expected["arguments"]
    return set(got) == set(want) and all(_value(got[k]) == _value(want[k]) for k in want)


_PY_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)
_NO_NETWORK = (
    "import sys\n"
    "def _deny(event, args):\n"
    "    if event.startswith(('socket.', 'subprocess.', 'os.system', 'os.exec', 'os.posix_spawn')):\n"
    "        raise PermissionError(event)\n"
    "sys.addaudithook(_deny)\n"
)


def python_code(answer: str) -> str | None:
    """The first Python block of an answer (or the whole answer when it is bare code), if it parses."""
    match = _PY_FENCE.search(answer)
    code = match.group(1) if match else answer
    try:
        ast.parse(code)
    except SyntaxError:
        return None
    return code


def passes_tests(code: str, tests: str, timeout_s: float = TEST_TIMEOUT_S) -> bool:
    """Run code then tests in a fresh isolated interpreter (no sockets, no subprocesses, a time limit)."""
    with tempfile.TemporaryDirectory(prefix="macaron-quality-") as tmp:
        script = Path(tmp) / "check.py"
        script.write_text(_NO_NETWORK + code + "\n\n" + tests, encoding="utf-8")
        try:
            done = subprocess.run([sys.executable, "-I", str(script)], cwd=tmp, capture_output=True,
                                  stdin=subprocess.DEVNULL,
                                  timeout=timeout_s, env={"PATH": os.environ.get("PATH", "")})
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


def entity_recall(summary: str, keep: list[str]) -> float:
    text = summary.casefold()
    return sum(str(k).casefold() in text for k in keep) / max(1, len(keep))


_PARROT = re.compile(r"(?i)\b(the user (asked|wanted|said|requested)"
                     r"|the (assistant|personal agent|coding assistant|ui assistant) (answered|called|did|said|booked|"
                     r"built|showed|set|added|texted|ordered|paid|explained))\b"
                     r"|^\s*(user|assistant)\s*:|another assistant answered|summary:")


PARROT_NGRAM = 6


def _words(text: str) -> list[str]:
    return _normal(text).split()


def parrots(answer: str, summary: str = "") -> bool:
    """The answer reproduces the summary instead of answering: the summary's form (a report of the
    turn), or a run of `PARROT_NGRAM` words copied from the summary it was shown."""
    if _PARROT.search(answer):
        return True
    said, shown = _words(answer), _words(summary)
    grams = {tuple(shown[i:i + PARROT_NGRAM]) for i in range(len(shown) - PARROT_NGRAM + 1)}
    return any(tuple(said[i:i + PARROT_NGRAM]) in grams for i in range(len(said) - PARROT_NGRAM + 1))


# --- engine calls --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    text: str
    calls: list[dict]
    completion_tokens: int
    finish_reason: str | None


def complete(client: httpx.Client, base_url: str, model: str, messages: list[dict], max_tokens: int,
             tools: list[dict] | None = None, sampling: dict | None = None) -> Reply:
    """sampling: the answering specialist's penalties (`EMBEDDED_ANSWER_SAMPLING`)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, **(sampling or {})}
    if messages[-1]["role"] == "assistant":  # a reply begun in the prompt (the summary hop's subject)
        body.update(continue_final_message=True, add_generation_prompt=False)
    if tools:
        body["tools"] = tools
    resp = client.post(f"{base_url}/v1/chat/completions", json=body)
    resp.raise_for_status()
    data = resp.json()
    choice = data["choices"][0]
    msg = choice["message"]
    calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"] or "{}")}
             for c in msg.get("tool_calls") or ()]
    return Reply(msg.get("content") or "", calls, data["usage"]["completion_tokens"], choice.get("finish_reason"))


def item_tool(item: dict) -> dict:
    """A tool_results item's function as an OpenAI tool."""
    t = item["tool"]
    return function_tool(t["name"], t["description"], **t["params"])


def tool_round_trip(item: dict) -> list[dict]:
    """The request, the agent's call, the tool's result: what the client sends after the tool ran."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": item["tool"]["name"], "arguments": json.dumps(item["call"], ensure_ascii=False)}}
    return [{"role": "user", "content": item["ask"]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(item["result"], ensure_ascii=False)}]


def uses_result(text: str, calls: list, uses: list[str]) -> bool:
    """Answered in words (no new call) that carry each of the result's values the item names."""
    return not calls and bool(text.strip()) and all(str(u).casefold() in text.casefold() for u in uses)


def _chat_messages(item: dict, references: dict[str, str]) -> list[dict]:
    messages = []
    for earlier in item.get("history") or ():
        messages += [{"role": "user", "content": earlier}, {"role": "assistant", "content": references[earlier]}]
    return messages + [{"role": "user", "content": item["ask"]}]


def _turn(item: dict) -> tuple[str, list[dict]]:
    """(what the summary hop reads, the turn's messages) of a summaries item."""
    user = {"role": "user", "content": item["user"]}
    if call := item.get("tool_call"):
        return answer_digest(None, [(call["name"], call["arguments"])]), [user, {
            "role": "assistant", "content": None, "tool_calls": [{
                "id": "call_0", "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]}]
    return answer_digest(item["answer"], None), [user, {"role": "assistant", "content": item["answer"]}]


def next_view(item: dict, summary: str) -> list[dict]:
    """The next specialist's own-view: the summarized turn (not its own), then the new request."""
    messages = [Message.model_validate(m) for m in _turn(item)[1]]
    messages.append(Message(role="user", content=item["next"]["ask"]))
    history = split_turns("bench", messages)
    past, current = history.turns[0], history.turns[1]
    return own_view(item["next"]["label"], (), [(past, TurnMeta(label=item["label"], summary=summary))], current)


class Runner:
    def __init__(self, base_url: str, models: dict[str, str]):
        """models: label -> engine model name (an adapter id, or the base for every label). Answer
        hops use each specialist's sampling (`EMBEDDED_ANSWER_SAMPLING`), whichever
        model serves them, so adapter and base are compared as the runner would send them."""
        self.base_url, self.models = base_url, models
        self.client = httpx.Client(timeout=300.0)
        self.pool = ThreadPoolExecutor(CONCURRENCY)

    def many(self, jobs: list[tuple[str, list[dict], int, list[dict] | None]], answer: bool = True,
             errors_as_empty: bool = False) -> list[Reply]:
        """answer: the jobs are answer hops (False: summary hops, sent with the engine's defaults).
        errors_as_empty: a request the engine rejects (4xx: longer than its context, say) gets an
        empty reply whose finish reason is "error", instead of ending the run."""
        def one(job):
            label, messages, max_tokens, tools = job
            sampling = EMBEDDED_ANSWER_SAMPLING.get(label) if answer else None
            try:
                return complete(self.client, self.base_url, self.models[label], messages, max_tokens, tools,
                                sampling)
            except httpx.HTTPStatusError as e:
                if errors_as_empty and e.response.status_code < 500:
                    return Reply("", [], 0, "error")
                raise

        return list(self.pool.map(one, jobs))

    def close(self) -> None:
        self.pool.shutdown()
        self.client.close()

    def chat(self, items: list[dict]) -> dict:
        references = {i["ask"]: i["reference"] for i in items}
        replies = self.many([("L0", _chat_messages(i, references), MAX_TOKENS["chat"], None) for i in items])
        scores = [chrf(r.text, i["reference"]) for r, i in zip(replies, items)]
        return {"chrf": sum(scores) / len(scores), "distinct": distinct_rate([r.text for r in replies]),
                "loops": sum(repetition_loop(r.text) for r in replies) / len(replies),
                "samples": [{"ask": i["ask"], "answer": r.text, "chrf": round(s, 1)}
                            for i, r, s in zip(items, replies, scores)]}

    def agent(self, items: list[dict]) -> dict:
        replies = self.many([("L1", [{"role": "user", "content": i["ask"]}], MAX_TOKENS["agent"],
                              [TOOLS[t] for t in i["tools"]]) for i in items])
        ok = [call_matches(i["call"], r.calls) for i, r in zip(items, replies)]
        needed = [o for o, i in zip(ok, items) if i["call"]]
        return {"exact": sum(ok) / len(ok), "called_right": sum(needed) / max(1, len(needed)),
                "no_call_right": (sum(ok) - sum(needed)) / max(1, len(ok) - len(needed)),
                "loops": sum(repetition_loop(r.text) for r in replies) / len(replies),
                "samples": [{"ask": i["ask"], "calls": r.calls, "text": r.text, "ok": o}
                            for i, r, o in zip(items, replies, ok)]}

    def coding(self, items: list[dict]) -> dict:
        replies = self.many([("L2", [{"role": "user", "content": i["ask"]}], MAX_TOKENS["coding"], None)
                             for i in items])
        codes = [python_code(r.text) for r in replies]
        passed = [c is not None and passes_tests(c, i["tests"]) for c, i in zip(codes, items)]
        return {"parses": sum(c is not None for c in codes) / len(codes), "passed": sum(passed) / len(passed),
                "loops": sum(repetition_loop(r.text) for r in replies) / len(replies),
                "samples": [{"ask": i["ask"], "answer": r.text, "passed": p}
                            for i, r, p in zip(items, replies, passed)]}

    def ui(self, items: list[dict]) -> dict:
        replies = self.many([("L3", [{"role": "user", "content": i["ask"]}], MAX_TOKENS["ui"], None) for i in items])
        checks = [ui_check(r.text, i["contains"]) for r, i in zip(replies, items)]
        return {"parses": sum(p for p, _ in checks) / len(checks), "contains": sum(c for _, c in checks) / len(checks),
                "loops": sum(repetition_loop(r.text) for r in replies) / len(replies),
                "samples": [{"ask": i["ask"], "answer": r.text, "parses": p, "contains": c}
                            for i, r, (p, c) in zip(items, replies, checks)]}

    def tool_results(self, items: list[dict]) -> dict:
        replies = self.many([("L1", tool_round_trip(i), MAX_TOKENS["tool_results"], [item_tool(i)]) for i in items])
        used = [uses_result(r.text, r.calls, i["uses"]) for r, i in zip(replies, items)]
        return {"answered_using": sum(used) / len(used),
                "empty": sum(not r.text.strip() and not r.calls for r in replies) / len(replies),
                "called_again": sum(bool(r.calls) for r in replies) / len(replies),
                "loops": sum(repetition_loop(r.text) for r in replies) / len(replies),
                "samples": [{"ask": i["ask"], "answer": r.text, "calls": r.calls, "ok": u}
                            for i, r, u in zip(items, replies, used)]}

    def summaries(self, items: list[dict]) -> dict:
        # As the runner sends it: the answering specialist's subject begins the summary.
        prompts = [summary_messages(i["user"], _turn(i)[0], i["label"]) for i in items]
        replies = self.many([("L0", p, SUMMARY_BUDGET_TOKENS, None) for p in prompts], answer=False)
        summaries = [Reply(begun(p) + r.text, r.calls, r.completion_tokens, r.finish_reason)
                     for p, r in zip(prompts, replies)]
        # What the runner stores: an unusable summary (empty, looping) is replaced by the user message.
        shown = [stored_summary(p, r.text, i["user"]) for p, r, i in zip(prompts, replies, items)]
        nexts = self.many([(i["next"]["label"], next_view(i, text), MAX_TOKENS["chat"], None)
                           for i, text in zip(items, shown)])
        recall = [entity_recall(s.text, i["keep"]) for s, i in zip(summaries, items)]
        parroted = [parrots(n.text, text) for n, text in zip(nexts, shown)]
        return {"entity_recall": sum(recall) / len(recall),
                "tokens_mean": sum(s.completion_tokens for s in summaries) / len(summaries),
                "tokens_max": max(s.completion_tokens for s in summaries),
                "parroting": sum(parroted) / len(parroted),
                "loops": sum(repetition_loop(s.text) for s in summaries) / len(summaries),
                "replaced": sum(not usable(r.text) for r in replies) / len(replies),
                "samples": [{"user": i["user"], "summary": s.text, "recall": round(r, 2), "next": n.text, "parrots": p}
                            for i, s, n, r, p in zip(items, summaries, nexts, recall, parroted)]}


SECTIONS = ("chat", "agent", "coding", "ui", "tool_results", "summaries")


def meets(section: str, adapter: dict, base: dict) -> bool:
    if section == "chat":
        return (adapter["chrf"] >= 0.95 * base["chrf"] and adapter["loops"] < 0.01
                and adapter["distinct"] >= base["distinct"])
    if section == "agent":
        return adapter["exact"] >= base["exact"]
    if section == "coding":
        return adapter["passed"] >= base["passed"]
    if section == "ui":
        return adapter["parses"] >= base["parses"] and adapter["contains"] >= base["contains"]
    if section == "tool_results":
        return adapter["answered_using"] >= max(0.9, base["answered_using"])
    return (adapter["entity_recall"] >= max(0.9, base["entity_recall"]) and adapter["parroting"] == 0)


def run(base_url: str, out: Path, sections: tuple[str, ...] = SECTIONS, built_dir: Path = BUILT_DIR,
        suites: tuple[str, ...] = ("project",), bfcl_limit: int | None = None) -> dict:
    """suites: "project" (this module's sections) and any of `bench.suites.SUITES`."""
    from macaron_ray.bench import suites as external

    data = load()
    adapters = {a.label: a.adapter_id for a in Manifest.load(built_dir).adapters}
    result: dict = {"targets": TARGETS, "sections": {}, "suites": {}}
    if "project" in suites:
        runners = {"adapter": Runner(base_url, adapters), "base": Runner(base_url, {k: BASE for k in adapters})}
        try:
            for section in sections:
                rows = {who: getattr(r, section)(data[section]) for who, r in runners.items()}
                rows["meets_targets"] = meets(section, rows["adapter"], rows["base"])
                rows["items"] = len(data[section])
                result["sections"][section] = rows
        finally:
            for r in runners.values():
                r.close()
    if "humaneval" in suites:
        result["suites"]["humaneval"] = external.run_humaneval(base_url, adapters)
    if "bfcl" in suites:
        result["suites"]["bfcl"] = external.run_bfcl(base_url, adapters, limit=bfcl_limit)
    for name, rows in result["suites"].items():
        rows["meets_targets"] = external.meets(name, rows)
    result["meets_targets"] = all(s["meets_targets"] for s in [*result["sections"].values(),
                                                                *result["suites"].values()])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def _figures(section: str, row: dict) -> str:
    keys = [k for k, v in row.items() if k != "samples" and isinstance(v, (int, float))]
    return ", ".join(f"{k} {row[k]:.1%}" if k not in ("chrf", "tokens_mean", "tokens_max") else f"{k} {row[k]:.1f}"
                     for k in keys)


def format_report(result: dict) -> str:
    from macaron_ray.bench import suites as external

    lines = []
    if result["sections"]:
        lines.append("quality: adapter vs base, same held-out prompts, temperature 0 (adapters/data/quality.yaml)")
    for section, rows in result["sections"].items():
        lines.append(f"  {section} ({rows['items']} items; target: {TARGETS[section]}): met {rows['meets_targets']}")
        for who in ("adapter", "base"):
            lines.append(f"    {who:<8} {_figures(section, rows[who])}")
    for suite, rows in result.get("suites", {}).items():
        lines.append(f"  {suite} (external, temperature 0; {external.DOMAIN[suite]} vs base and L0): "
                     f"met {rows['meets_targets']}")
        lines += external.format_rows(suite, rows)
    return "\n".join(lines)
