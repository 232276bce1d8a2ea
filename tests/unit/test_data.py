"""Data generators: determinism, and a held-out split disjoint by template and wording."""

from __future__ import annotations

from collections import Counter

from macaron_ray.adapters import answer_data, routing_data
from macaron_ray.adapters.routing_data import SLOTS, WRAPPERS, generate, slot_values, template_groups, wrappers
from macaron_ray.adapters.train import data_sha256, dataset
from macaron_ray.specialists.labels import LABELS


def test_generation_is_deterministic_and_seed_dependent():
    assert generate("train", 50, seed=3) == generate("train", 50, seed=3)
    assert generate("train", 50, seed=3) != generate("train", 50, seed=4)
    for label in LABELS:
        assert data_sha256(dataset(label, 0)) == data_sha256(dataset(label, 0))


def test_every_label_and_several_languages_in_both_splits():
    for split, n in (("train", 320), ("heldout", 60)):
        examples = generate(split, n, seed=0)
        assert Counter(e.label for e in examples) == {label: n for label in LABELS}
        assert len({e.text for e in examples}) == len(examples)
        for label in LABELS:
            assert {e.lang for e in examples if e.label == label} >= {"en", "es", "fr", "de"}


def test_heldout_shares_no_template_wording_or_text_with_train():
    train, held = generate("train", 320, seed=0), generate("heldout", 60, seed=0)
    assert not {e.template_id for e in train} & {e.template_id for e in held}
    assert not {e.wording_id for e in train} & {e.wording_id for e in held}
    assert not {e.text for e in train} & {e.text for e in held}


def test_split_pools_are_disjoint():
    for slot, by_lang in SLOTS.items():
        for lang in by_lang:
            assert not set(slot_values(slot, lang, "train")) & set(slot_values(slot, lang, "heldout")), slot
    for lang in WRAPPERS:
        assert "{}" in wrappers(lang, "train")
        assert not set(wrappers(lang, "train")) & set(wrappers(lang, "heldout"))
    ids = [tid for group in template_groups().values() for tid, _ in group]
    assert len(ids) == len(set(ids)) == len(routing_data.TEMPLATES)


def test_no_adapter_trains_on_heldout_routing_text():
    held = {e.text for e in generate("heldout", 60, seed=0)}
    for label in LABELS:
        for conv in dataset(label, 0):
            for m in conv.messages:
                assert m.get("content") not in held


def test_tool_calls_name_an_offered_tool():
    for conv in answer_data.agent_conversations(80, seed=0):
        for m in conv.messages:
            for call in m.get("tool_calls") or []:
                offered = {t["function"]["name"] for t in conv.tools}
                assert call["function"]["name"] in offered
                params = next(t for t in conv.tools if t["function"]["name"] == call["function"]["name"])
                assert set(call["function"]["arguments"]) == set(params["function"]["parameters"]["properties"])


def test_one_in_three_answer_examples_follows_another_specialists_turn_as_the_own_view_shows_it():
    from macaron_ray.core.conversation import Message, Turn, TurnMeta
    from macaron_ray.core.own_view import render_turn

    plain = answer_data.ui_conversations(30, 0)
    convs = answer_data.with_past_turns(plain, "L3", 0)
    behind = [i for i, (c, p) in enumerate(zip(convs, plain)) if c != p]
    assert len(behind) == 30 // answer_data.PAST_TURN_RATE
    # forms and cards alike (the generator makes a form every third example)
    assert {"<Form" in plain[i].messages[-1]["content"] for i in behind} == {True, False}
    for i in behind:
        conv, before = convs[i], plain[i]
        user, note = conv.messages[:2]
        assert conv.messages[2:] == before.messages and conv.tools == before.tools
        summary = note["content"].split("Summary: ", 1)[1]
        assert not summary.startswith("The UI assistant")  # another specialist's turn
        past = Turn(key="k", user=Message(**user), rest=())
        assert render_turn("L3", past, TurnMeta(label="L1", summary=summary)) == [user, note]


def test_l0_chat_behind_a_note_answers_the_question_and_is_not_a_held_out_quality_prompt():
    from macaron_ray.bench import quality
    from macaron_ray.bench.quality import parrots
    from macaron_ray.core.conversation import Message, Turn, TurnMeta
    from macaron_ray.core.own_view import render_turn

    convs = answer_data.chat_after_notes()
    assert convs and all(c in dataset("L0", 0) for c in convs)
    items = quality.load()["summaries"]
    held_out = {i["next"]["ask"] for i in items} | {i["user"] for i in items}
    for conv in convs:
        user, note, ask, answer = conv.messages
        summary = note["content"].split("Summary: ", 1)[1]
        past = Turn(key="k", user=Message(**user), rest=())
        assert render_turn("L0", past, TurnMeta(label="L1", summary=summary)) == [user, note]
        assert not parrots(answer["content"], summary), answer
        assert ask["content"] not in held_out and user["content"] not in held_out


def test_l0_summaries_of_fact_dense_chat_keep_every_number_and_are_no_held_out_prompt():
    import re

    from macaron_ray.bench import quality

    convs = answer_data.fact_chat()
    summaries = answer_data.summary_conversations(384, 0)
    asked = {i["user"] for i in quality.load()["summaries"]} | {i["ask"] for i in quality.load()["chat"]}
    for conv in convs:
        (user, answer) = conv.messages
        assert user["content"] not in asked
        numbers = re.findall(r"\d+(?:,\d+)*", answer["content"])
        assert numbers and all(n in conv.summary for n in numbers), conv.summary
        assert sum(s.messages[-1]["content"] == conv.summary for s in summaries) == answer_data.CHAT_SUMMARY_WEIGHT


def test_l0_routing_data_has_switches_from_the_whole_generator_and_stays_weighted():
    from macaron_ray.adapters.routing_sets import contexts, followups
    from macaron_ray.core.route_hop import NEW_MESSAGE

    convs = answer_data.route_conversations(40, 0)
    prompts = [(c.messages[1]["content"], c.messages[-1]["content"]) for c in convs]
    train_contexts = {c.block(): c.label for c in contexts("train")}
    assert train_contexts and set(train_contexts.values()) == set(LABELS)
    assert not {c.block() for c in contexts("heldout")} & set(train_contexts)
    routed = Counter()
    for content, label in prompts:
        block = content.split(NEW_MESSAGE, 1)[0] if NEW_MESSAGE in content else None
        assert block is None or block in train_contexts  # only training contexts
        routed[("stay" if block and train_contexts[block] == label else "switch" if block else "alone")] += 1
    generated = 4 * 40
    stays = [r for r in followups("train", 0) if r.label == r.context.label]
    assert routed["stay"] == answer_data.STAY_ROUTE_WEIGHT * len(stays)
    # one in SWITCH_RATE generator requests comes after another label's context, on top of the follow-up set's switches
    expected_switches = generated // answer_data.SWITCH_RATE + len(contexts("train")) * answer_data.TRAIN_SWITCHES_PER_CONTEXT
    assert routed["switch"] == expected_switches
