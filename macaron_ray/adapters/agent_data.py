"""L1's function-calling conversations, from the authored functions of `data/agent_functions.yaml`.

Four shapes, each call and answer checked before it is kept (`check`, `check_answer`): a call
among other functions offered (the right function, every argument valid under its JSON schema and
equal to the value the request names); two calls for a request that asks for two things; the
turn after the tool's result, answered in words that carry the result's values; and a message
that needs no call although functions are offered. The calls and answers are built from
the values drawn for the request, so the check is the executable gate the training data passes,
not a sampled model's luck. Generation is a pure function of the seed.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from functools import cache

import jsonschema
import yaml

from macaron_ray.adapters.answer_data import NO_CALL, Conversation
from macaron_ray.paths import PACKAGE_DIR

DATA = PACKAGE_DIR / "adapters" / "data" / "agent_functions.yaml"
_FIELDS = re.compile(r"{(\w+)}")


@dataclass(frozen=True)
class Ask:
    text: str
    lang: str
    fixed: dict


@dataclass(frozen=True, eq=False)
class Function:
    name: str
    description: str
    params: dict
    values: dict
    asks: tuple[Ask, ...]
    result: dict
    answers: dict

    @property
    def tool_name(self) -> str:
        """As function-calling clients send a dotted name (BFCL's OpenAI handler among them)."""
        return self.name.replace(".", "_")

    @property
    def schema(self) -> dict:
        props = {p: {k: v for k, v in spec.items() if k != "optional"} for p, spec in self.params.items()}
        return {"type": "object", "properties": props,
                "required": [p for p, spec in self.params.items() if not spec.get("optional")]}

    def tool(self) -> dict:
        return {"type": "function", "function": {"name": self.tool_name, "description": self.description,
                                                 "parameters": self.schema}}


@cache
def functions() -> tuple[Function, ...]:
    rows = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    out = []
    for row in rows:
        asks = tuple(Ask(a, "en", {}) if isinstance(a, str) else Ask(a["text"], a.get("lang", "en"), a.get("set", {}))
                     for a in row["asks"])
        out.append(Function(row["name"], row["description"], row["params"], row.get("values") or {}, asks,
                            row.get("result") or {}, row.get("answers") or {}))
    return tuple(out)


def render(value) -> str:
    if isinstance(value, list):
        return ", ".join(render(v) for v in value)
    return str(value)


def draw(fn: Function, ask: Ask, rng: random.Random) -> tuple[str, dict]:
    """(request text, the call's arguments) for one ask: the values it names, drawn, and the ones
    its words fix."""
    args = {p: rng.choice(fn.values[p]) for p in dict.fromkeys(_FIELDS.findall(ask.text))}
    args.update(ask.fixed)
    text = ask.text.format(**{p: render(v) for p, v in args.items()})
    return text, {p: args[p] for p in fn.params if p in args}  # in the schema's order


def answer(fn: Function, lang: str, args: dict, result: dict) -> str:
    return fn.answers[lang].format(**{k: render(v) for k, v in {**args, **result}.items()})


def check(fn: Function, ask: Ask, text: str, args: dict) -> None:
    """Raises unless the call is one a correct agent makes for `text`: the function exists, its
    arguments are valid under its schema, and each value the request names is as written in it."""
    assert fn in functions(), fn.name
    jsonschema.validate(args, fn.schema)
    for p in _FIELDS.findall(ask.text):
        assert render(args[p]).casefold() in text.casefold(), (fn.name, p, args[p], text)


def check_answer(result: dict, reply: str) -> bool:
    """An answer in words that uses the result: every value the tool returned is in it."""
    folded = reply.casefold()
    return bool(reply.strip()) and all(render(v).casefold() in folded for v in result.values())


def _call(i: int, fn: Function, args: dict) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": fn.tool_name, "arguments": args}}


def _offered(fn: Function | list[Function], rng: random.Random) -> list[dict]:
    wanted = fn if isinstance(fn, list) else [fn]
    others = [f for f in functions() if f not in wanted]
    chosen = [*wanted, *rng.sample(others, rng.randint(0, 3))]
    rng.shuffle(chosen)
    return [f.tool() for f in chosen]


def _summary(calls: list[tuple[Function, dict]]) -> str:
    done = "; ".join(f"{fn.tool_name}({', '.join(f'{k}={render(v)}' for k, v in args.items())})" for fn, args in calls)
    return f"The personal agent called {done}."


SHAPES = ("call", "result", "parallel", "result", "call", "result", "none", "call", "result", "parallel")
"""In turn, per ten conversations: three single calls, two of two calls, four tool results answered in
words, and one message that needs no call although functions are offered."""


def conversations(n: int, seed: int) -> list[Conversation]:
    """n conversations, of the shapes in `SHAPES` in turn."""
    rng = random.Random(f"{seed}:L1-functions")
    fns = functions()
    with_result = [f for f in fns if f.result]
    out: list[Conversation] = []
    for i in range(n):
        shape = SHAPES[i % len(SHAPES)]
        if shape == "none":
            text, reply = NO_CALL[(i // len(SHAPES)) % len(NO_CALL)]
            out.append(Conversation(tools=_offered(rng.choice(fns), rng), messages=[
                {"role": "user", "content": text}, {"role": "assistant", "content": reply}],
                summary=f"The user said \"{text}\"; the personal agent answered without calling a function."))
            continue
        if shape == "parallel":
            first = rng.choice(fns)
            second = first if rng.random() < 0.5 else rng.choice(fns)
            asks = [(f, rng.choice([a for a in f.asks if a.lang == "en"])) for f in (first, second)]
            drawn = [(f, *draw(f, a, rng)) for f, a in asks]
            for (f, a), (_, text, args) in zip(asks, drawn):
                check(f, a, text, args)
            then = drawn[1][1] if drawn[1][1].startswith("I ") else drawn[1][1][0].lower() + drawn[1][1][1:]
            text = f"{drawn[0][1]} {rng.choice(['Also, ', 'And ', 'Then '])}{then}"
            calls = [(f, args) for f, _, args in drawn]
            out.append(Conversation(tools=_offered(list(dict.fromkeys([first, second])), rng), summary=_summary(calls),
                                    messages=[{"role": "user", "content": text},
                                              {"role": "assistant", "content": None,
                                               "tool_calls": [_call(i * 2 + k, f, a) for k, (f, a) in enumerate(calls)]}]))
            continue
        fn = rng.choice(with_result if shape == "result" else fns)
        ask = rng.choice(fn.asks)
        text, args = draw(fn, ask, rng)
        check(fn, ask, text, args)
        messages = [{"role": "user", "content": text}, {"role": "assistant", "content": None,
                                                        "tool_calls": [_call(i, fn, args)]}]
        if shape == "result":
            result = {k: rng.choice(pool) for k, pool in fn.result.items()}
            reply = answer(fn, ask.lang, args, result)
            assert check_answer(result, reply), (fn.name, reply)
            messages += [{"role": "tool", "tool_call_id": f"call_{i}", "content": json.dumps(result, ensure_ascii=False)},
                         {"role": "assistant", "content": reply}]
        out.append(Conversation(tools=_offered(fn, rng), summary=_summary([(fn, args)]), messages=messages))
    return out
