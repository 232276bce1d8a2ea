"""L3's requests that name their data, from `data/ui_tasks.yaml`: the block must carry it.

A chart or table of the values the user lists, or a form with the fields the user lists, in
eight languages. Every answer is checked before it is kept: it parses under the component
grammar and the quality benchmark's `ui_check` finds every label and number asked for.
Generation is a pure function of the seed.
"""

from __future__ import annotations

import random
from functools import cache

import yaml

from macaron_ray.adapters.answer_data import Conversation
from macaron_ray.paths import PACKAGE_DIR

DATA = PACKAGE_DIR / "adapters" / "data" / "ui_tasks.yaml"


@cache
def languages() -> dict:
    return yaml.safe_load(DATA.read_text(encoding="utf-8"))


def chart(lang: dict, rng: random.Random) -> tuple[str, str, list[list[str]]]:
    """(request, answer, what the answer must contain) for a chart or table of listed values."""
    component, kind = rng.choice(sorted(lang["kinds"].items()))
    subject, labels = rng.choice(lang["subjects"])
    picked = rng.sample(labels, rng.randint(3, min(5, len(labels))))
    low, high, step = rng.choice([(2, 100, 1), (100, 3000, 10)])  # one scale per request
    values = [rng.randrange(low, high, step) for _ in picked]
    items = ", ".join(f"{label} {value}" for label, value in zip(picked, values))
    ask = rng.choice(lang["asks"]).format(kind=kind, subject=subject, items=items)
    data = ", ".join(f'{{ label: "{label}", value: {value} }}' for label, value in zip(picked, values))
    title = subject[0].upper() + subject[1:]
    code = f'<Card title="{title}">\n    <{component} data={{[{data}]}} interactive />\n</Card>'
    return ask, f"```jsx\n{code}\n```", [[component], *([str(x)] for pair in zip(picked, values) for x in pair)]


def form(lang: dict, rng: random.Random) -> tuple[str, str, list[list[str]]]:
    """(request, answer, what it must contain) for a form with the fields the user lists."""
    fields = rng.sample(lang["fields"], rng.randint(2, 4))
    ask = rng.choice(lang["forms"]).format(fields=", ".join(fields))
    inputs = "\n".join(f'    <Input name="{f}" label="{f[0].upper() + f[1:]}" />' for f in fields)
    code = f'<Form onSubmit={{submit}}>\n{inputs}\n    <Button type="submit">OK</Button>\n</Form>'
    return ask, f"```jsx\n{code}\n```", [["Form"], *([f] for f in fields)]


def conversations(n: int, seed: int) -> list[Conversation]:
    """n requests, languages in turn, one in four a form; each answer checked (`check`)."""
    rng = random.Random(f"{seed}:L3-data")
    langs = sorted(languages())
    out = []
    for i in range(n):
        code = langs[i % len(langs)]
        ask, reply, contains = (form if i % 4 == 3 else chart)(languages()[code], rng)
        check(reply, contains)
        out.append(Conversation(summary=f"The UI assistant built what was asked: {ask}", messages=[
            {"role": "user", "content": ask}, {"role": "assistant", "content": reply}]))
    return out


def check(reply: str, contains: list[list[str]]) -> None:
    """Raises unless the block parses and carries everything asked for (the benchmark's check)."""
    from macaron_ray.specialists.components import ui_check

    parses, carries = ui_check(reply, contains)
    assert parses and carries, (reply, contains)
