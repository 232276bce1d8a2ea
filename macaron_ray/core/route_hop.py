"""The route hop: L0 reads the routing prompt and the new user turn, and decodes one label.

The label is constrained by vLLM structured outputs (`choice` over the canonical
labels) and is the route: nothing overrides it. An output that is not a
canonical label is a routing error that falls back to L0.
"""

from __future__ import annotations

from macaron_ray import prompts
from macaron_ray.specialists.labels import LABELS

ROUTE_BUDGET_TOKENS = 24
FALLBACK_LABEL = "L0"


def route_messages(user_text: str) -> list[dict]:
    """The whole route-hop prompt: scaffold plus the new user turn, nothing else."""
    return [{"role": "system", "content": prompts.load("routing")},
            {"role": "user", "content": user_text}]


def route_sampling(labels: tuple[str, ...] = LABELS) -> dict:
    """Sampling fields of the route request (OpenAI chat body, vLLM extensions)."""
    return {"temperature": 0.0, "max_tokens": ROUTE_BUDGET_TOKENS,
            "structured_outputs": {"choice": list(labels)}}


def parse_label(output: str, labels: tuple[str, ...] = LABELS) -> str | None:
    """The canonical label the output names, or None if it is not exactly one."""
    text = output.strip()
    return text if text in labels else None
