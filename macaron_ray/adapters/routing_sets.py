"""The authored routing sets, beside the generator's (`routing_data`): what people write.

    authored   data/routing_natural.tsv: requests by concept; concepts split train / held-out
    field      data/routing_field.tsv: written before any training decision, never trained on
    field2     data/routing_field2.tsv: the same, written 2026-12-07 once the first had been read
               after every recipe (it now serves as a development set)
    follow-up  data/routing_followups.tsv: a previous turn (label + summary, or its user message)
               and a new message: a follow-up that stays with that specialist, or a real switch

Every request is a `LabeledRequest`; one with a `context` is routed with the
route hop's context block. Splits are positional within each label's group
(every fourth held out, as in `routing_data`), so they never change when lines
are appended at the end of a group.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from macaron_ray.adapters.routing_data import Split, _split_of, generate
from macaron_ray.core.route_hop import RouteContext

DATA_DIR = Path(__file__).resolve().parent / "data"
LANGUAGES = ("en", "es", "fr", "de", "pt", "it", "zh", "ja")
SWITCHES_PER_CONTEXT = 8
"""Fresh requests of other labels paired with each context (the real switches)."""


@dataclass(frozen=True)
class LabeledRequest:
    text: str
    label: str
    lang: str
    source: str
    """generator, authored, field or follow-up."""
    context: RouteContext | None = None
    concept: str = ""


def _rows(name: str) -> list[list[str]]:
    rows = []
    for line in (DATA_DIR / name).read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            rows.append(line.split("\t"))
    return rows


FIELD_SETS = {"field": "routing_field.tsv", "field2": "routing_field2.tsv"}
"""The field sets, oldest first: each written before any training decision that uses it."""


def field_set(name: str = "field") -> list[LabeledRequest]:
    """A field set: reported on its own, never trained on."""
    return [LabeledRequest(text=text, label=label, lang=lang, source=name)
            for label, lang, text in _rows(FIELD_SETS[name])]


def _concept_split(rows: list[tuple[str, str]]) -> dict[tuple[str, str], Split]:
    """(label, concept) -> split, by the concept's position among its label's concepts."""
    order: dict[str, list[str]] = {}
    for label, concept in rows:
        concepts = order.setdefault(label, [])
        if concept not in concepts:
            concepts.append(concept)
    return {(label, c): _split_of(i, 4) for label, concepts in order.items() for i, c in enumerate(concepts)}


def authored(split: Split) -> list[LabeledRequest]:
    """The authored requests of the concepts in `split`."""
    rows = _rows("routing_natural.tsv")
    splits = _concept_split([(label, concept) for label, concept, _, _ in rows])
    return [LabeledRequest(text=text, label=label, lang=lang, source="authored", concept=concept)
            for label, concept, lang, text in rows if splits[(label, concept)] == split]


def _positional(rows: list[list[str]], kind: str, split: Split) -> list[tuple[str, str, str]]:
    """(label, lang, text) of one kind's lines in `split`, by position within each label."""
    seen: dict[str, int] = {}
    out = []
    for k, label, lang, text in rows:
        if k != kind:
            continue
        index = seen.get(label, 0)
        seen[label] = index + 1
        if _split_of(index, 4) == split:
            out.append((label, lang, text))
    return out


def contexts(split: Split) -> list[RouteContext]:
    """The previous turns of `split` that follow-ups come after."""
    return [RouteContext(label=label, text=text)
            for label, _, text in _positional(_rows("routing_followups.tsv"), "CONTEXT", split)]


def followups(split: Split, seed: int = 0, switches: int = SWITCHES_PER_CONTEXT) -> list[LabeledRequest]:
    """Every context of `split` with every follow-up of its label that stays (answer: that label),
    and with `switches` fresh requests of other labels from the same split of the generator and
    the authored set (answer: the request's own label)."""
    stays = _positional(_rows("routing_followups.tsv"), "STAY", split)
    rng = random.Random(f"{seed}:followups:{split}")
    fresh = [*authored(split), *(LabeledRequest(e.text, e.label, e.lang, "generator")
                                 for e in generate(split, 40, seed))]
    out = []
    for context in contexts(split):
        label = context.label
        out += [LabeledRequest(text=stay, label=label, lang=stay_lang, source="follow-up", context=context)
                for stay_label, stay_lang, stay in stays if stay_label == label]
        others = [r for r in fresh if r.label != label]
        for request in rng.sample(others, switches):
            out.append(LabeledRequest(text=request.text, label=request.label, lang=request.lang,
                                      source="follow-up", context=context))
    return out


def heldout_sets(per_label: int, seed: int) -> dict[str, list[LabeledRequest]]:
    """What `macaron bench routing` reports, each on its own."""
    return {
        "heldout": [LabeledRequest(e.text, e.label, e.lang, "generator") for e in generate("heldout", per_label, seed)],
        "authored": authored("heldout"),
        "field": field_set("field"),
        "field2": field_set("field2"),
        "follow-up": followups("heldout", seed),
    }
