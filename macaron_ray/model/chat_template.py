"""The project's chat template for the base model (see chat_template.jinja)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")


@cache
def load_chat_template() -> str:
    return CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")
