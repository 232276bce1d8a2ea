"""L3's requests that name their data: every answer carries what was asked, in eight languages."""

from __future__ import annotations

import random

import pytest

from macaron_ray.adapters import ui_data
from macaron_ray.specialists.components import component_block, parse_components


def test_every_answer_parses_and_carries_the_labels_and_numbers_asked_for():
    convs = ui_data.conversations(160, seed=0)  # `conversations` checks each one as it goes
    assert convs == ui_data.conversations(160, seed=0)
    for conv in convs:
        ask, reply = conv.messages[0]["content"], conv.messages[1]["content"]
        assert parse_components(component_block(reply))
        assert "{" not in ask
    forms = [c for c in convs if "<Form" in c.messages[1]["content"]]
    assert len(forms) == 40


def test_the_check_refuses_a_block_without_the_data():
    ask, reply, contains = ui_data.chart(ui_data.languages()["en"], random.Random(3))
    ui_data.check(reply, contains)
    with pytest.raises(AssertionError):
        ui_data.check(reply.replace(contains[1][0], "something"), contains)
    with pytest.raises(AssertionError):
        ui_data.check(reply.replace("</Card>", ""), contains)


def test_eight_languages_each_with_every_kind():
    langs = ui_data.languages()
    assert set(langs) == {"en", "de", "fr", "es", "it", "pt", "ru", "zh"}
    for lang in langs.values():
        assert set(lang["kinds"]) == {"BarChart", "LineChart", "PieChart", "Table"}
        assert lang["asks"] and lang["forms"] and len(lang["fields"]) >= 4
