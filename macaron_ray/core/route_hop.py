"""The route hop: L0 reads the routing prompt, the previous turn and the new user turn, and
decodes one label.

Context block: after the cacheable scaffold, the previous turn's label and its
summary (or its user message while the summary is pending), cut to a fixed
budget, so a follow-up such as "make the buttons bigger" stays with the
specialist that built them while a new request still goes where it belongs.

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
from dataclasses import dataclass

from macaron_ray import prompts
from macaron_ray.core.engine_client import ROUTE_PRIORITY, EngineRequest
from macaron_ray.specialists.labels import LABELS

ROUTE_BUDGET_TOKENS = 24
FALLBACK_LABEL = "L0"
NEW_MESSAGE = "\nNew message: "
"""Between the context block and the new message in the route prompt's user turn."""
ROUTE_CONTEXT_MAX_CHARS = 240
"""The context block's budget for the previous turn's text: about 60 tokens of English, so the
uncached tail of the route prompt stays short (the scaffold before it is cached)."""


@dataclass(frozen=True)
class RouteContext:
    """The previous turn, as the route hop shows it to L0."""

    label: str
    """The specialist that answered it (canonical label)."""
    text: str
    """Its summary, or its user message while the summary is still pending."""

    def block(self) -> str:
        text = " ".join(self.text.split())
        if len(text) > ROUTE_CONTEXT_MAX_CHARS:
            text = text[:ROUTE_CONTEXT_MAX_CHARS - 1].rsplit(" ", 1)[0] + "…"
        return f"Previous turn ({self.label}): {text}"


def label_prefix(labels: tuple[str, ...] = LABELS) -> str:
    """The text every label starts with, short of any whole label (each keeps an ending)."""
    prefix = os.path.commonprefix(list(labels))
    while prefix in labels:
        prefix = prefix[:-1]
    return prefix


def route_messages(user_text: str, labels: tuple[str, ...] = LABELS,
                   context: RouteContext | None = None) -> list[dict]:
    """The whole route-hop prompt: scaffold (cached), the context block if there was a previous
    turn, the new user turn, and the labels' shared start."""
    content = user_text if context is None else f"{context.block()}{NEW_MESSAGE}{user_text}"
    messages = [{"role": "system", "content": prompts.load("routing")},
                {"role": "user", "content": content}]
    if prefix := label_prefix(labels):
        messages.append({"role": "assistant", "content": prefix})
    return messages


def route_request(adapter: str, user_text: str, labels: tuple[str, ...] = LABELS, *,
                  context: RouteContext | None = None) -> EngineRequest:
    """The route request under L0's adapter (engine-side id): greedy, one label ending."""
    prefix = label_prefix(labels)
    endings = tuple(label[len(prefix):] for label in labels)
    # An ending of n bytes is at most n tokens (every byte has a token of its own).
    budget = min(ROUTE_BUDGET_TOKENS, max(len(e.encode()) for e in endings))
    return EngineRequest(adapter=adapter, messages=route_messages(user_text, labels, context), max_tokens=budget,
                         temperature=0.0, choice=endings, continue_final_message=bool(prefix),
                         priority=ROUTE_PRIORITY)


def parse_label(output: str, labels: tuple[str, ...] = LABELS) -> str | None:
    """The canonical label the output completes, or None if it completes none."""
    text = label_prefix(labels) + output.strip()
    return text if text in labels else None
