"""Token counting for `count_tokens`: the base model's tokenizer over the project's chat template."""

from __future__ import annotations

import json
from pathlib import Path

from macaron_ray.model.chat_template import load_chat_template


class TemplateTokenCounter:
    """Counts the prompt tokens of a conversation as the engines render it."""

    def __init__(self, model: str | Path, chat_template: str | None = None):
        """`model`: the base's directory or an id this node can load; `chat_template`: the Jinja
        text the engines are started with, or None for the tokenizer's own (as vLLM then uses)."""
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(model)
        self._template = chat_template

    @classmethod
    def embedded(cls, model_dir: Path) -> "TemplateTokenCounter":
        """The embedded base with the project's chat template."""
        return cls(model_dir, load_chat_template())

    def count(self, messages: list[dict], tools: list[dict] | None) -> int:
        msgs = json.loads(json.dumps(messages))
        for m in msgs:  # as vLLM does before templating: tool-call arguments become mappings
            for c in m.get("tool_calls") or []:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"] or "{}")
        text = self._tok.apply_chat_template(msgs, tools=tools, chat_template=self._template,
                                             tokenize=False, add_generation_prompt=True)
        # As vLLM tokenizes a rendered chat prompt: the template already holds the special tokens.
        return len(self._tok(text, add_special_tokens=False)["input_ids"])

