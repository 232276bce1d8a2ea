"""The route hop: L0 reads the routing prompt and the new user turn, and decodes one label.

The label is constrained by vLLM structured outputs and is the route: nothing
overrides it. An output that is not a canonical label is a routing error that
falls back to L0.

Every forward pass of the engine counts here, since the user waits for this hop
before the answer starts. So the text all labels share ("L" of L0..L3) is not
decoded: it is the start of the assistant's reply in the prompt (vLLM's
`continue_final_message`), the same tokens L0 was trained to write there, and
the engine decodes only what tells the labels apart, under a `choice` over those
endings. The token budget ends the request right after the longest ending rather
than on an end-of-sequence token, which would cost one more pass. On one CPU
core, over held-out requests, with the same labels chosen: p50 0.33 s for "L",
digit, end-of-sequence (three passes), 0.21 s for the digit alone.
"""

from __future__ import annotations

import os

from macaron_ray import prompts
from macaron_ray.core.engine_client import EngineRequest
from macaron_ray.specialists.labels import LABELS

ROUTE_BUDGET_TOKENS = 24
FALLBACK_LABEL = "L0"


def label_prefix(labels: tuple[str, ...] = LABELS) -> str:
    """The text every label starts with, short of any whole label (each keeps an ending)."""
    prefix = os.path.commonprefix(list(labels))
    while prefix in labels:
        prefix = prefix[:-1]
    return prefix


def route_messages(user_text: str, labels: tuple[str, ...] = LABELS) -> list[dict]:
    """The whole route-hop prompt: scaffold, the new user turn, and the labels' shared start."""
    messages = [{"role": "system", "content": prompts.load("routing")},
                {"role": "user", "content": user_text}]
    if prefix := label_prefix(labels):
        messages.append({"role": "assistant", "content": prefix})
    return messages


def route_request(adapter: str, user_text: str, labels: tuple[str, ...] = LABELS) -> EngineRequest:
    """The route request under L0's adapter (engine-side id): greedy, one label ending."""
    prefix = label_prefix(labels)
    endings = tuple(label[len(prefix):] for label in labels)
    # An ending of n bytes is at most n tokens (every byte has a token of its own).
    budget = min(ROUTE_BUDGET_TOKENS, max(len(e.encode()) for e in endings))
    return EngineRequest(adapter=adapter, messages=route_messages(user_text, labels), max_tokens=budget,
                         temperature=0.0, choice=endings, continue_final_message=bool(prefix))


def parse_label(output: str, labels: tuple[str, ...] = LABELS) -> str | None:
    """The canonical label the output completes, or None if it completes none."""
    text = label_prefix(labels) + output.strip()
    return text if text in labels else None
