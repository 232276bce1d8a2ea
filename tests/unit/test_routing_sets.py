"""The authored routing sets: the field set is never trained on, splits are by concept and position."""

from __future__ import annotations

from macaron_ray.adapters.routing_data import generate
from macaron_ray.adapters.routing_sets import LANGUAGES, authored, field_set, followups
from macaron_ray.adapters.train import ROUTE_EXAMPLES_PER_LABEL
from macaron_ray.specialists.labels import LABELS


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def test_the_field_set_covers_every_label_and_language():
    field = field_set()
    assert {r.label for r in field} == set(LABELS) and {r.lang for r in field} == set(LANGUAGES)
    assert len({_norm(r.text) for r in field}) == len(field)


def test_the_second_field_set_covers_every_label_and_language_and_repeats_none_of_the_first():
    field2 = field_set("field2")
    assert {r.label for r in field2} == set(LABELS) and {r.lang for r in field2} >= set(LANGUAGES)
    assert len({_norm(r.text) for r in field2}) == len(field2) >= 120
    assert not {_norm(r.text) for r in field2} & {_norm(r.text) for r in field_set()}


def test_no_training_text_repeats_a_field_request():
    field = {_norm(r.text) for name in ("field", "field2") for r in field_set(name)}
    training = [*authored("train"), *followups("train")]
    texts = {_norm(r.text) for r in training} | {_norm(r.context.text) for r in training if r.context}
    texts |= {_norm(e.text) for e in generate("train", ROUTE_EXAMPLES_PER_LABEL, 0)}
    assert not field & texts
    assert not field & {_norm(r.text) for r in authored("heldout")}


def test_authored_concepts_are_split_whole():
    train, heldout = authored("train"), authored("heldout")
    assert {(r.label, r.concept) for r in train}.isdisjoint({(r.label, r.concept) for r in heldout})
    for label in LABELS:
        assert sum(r.label == label for r in heldout) > 0 and sum(r.label == label for r in train) > 0
    assert {r.lang for r in train + heldout} == set(LANGUAGES)


def test_followups_pair_contexts_with_stays_and_switches_by_split():
    train, heldout = followups("train"), followups("heldout")
    assert {r.context for r in train}.isdisjoint({r.context for r in heldout})
    assert {r.text for r in train if r.label == r.context.label} & {r.text for r in heldout if r.label == r.context.label} == set()
    for requests in (train, heldout):
        stays = [r for r in requests if r.label == r.context.label]
        switches = [r for r in requests if r.label != r.context.label]
        assert stays and switches
        assert {r.label for r in stays} == set(LABELS) and {r.context.label for r in switches} == set(LABELS)
    assert followups("heldout", seed=0) == followups("heldout", seed=0)
