"""Own-view: each specialist's view of the conversation, rebuilt at every turn.

- turns this specialist answered: verbatim (user message, its assistant messages,
  tool calls and tool results);
- turns other specialists answered: the user message, then that turn's summary as a
  system note (`summary_note`), not as an assistant message: a specialist imitates
  its own past replies, and a summary shown as one was parroted ("The user asked:
  ..." as the answer to the next request);
- the scaffold (routing and summary prompts) never appears.

The rendering of a past turn depends only on that turn and its cached metadata,
never on what came later, so a specialist's view is append-only: its prompt at a
turn it answers is a byte prefix of its prompt at any later turn. That is what lets the
engine's prefix cache (keyed per adapter) absorb every re-entry.
"""

from __future__ import annotations

from collections.abc import Sequence

from macaron_ray.core.conversation import Message, Turn, TurnMeta


def summary_note(summary: str) -> dict:
    """How another specialist's answer appears in this specialist's view."""
    return {"role": "system", "content": f"Another assistant answered that message. Summary: {summary}"}


def render_turn(label: str, turn: Turn, meta: TurnMeta) -> list[dict]:
    if meta.label == label:
        return [m.to_openai() for m in turn.messages]
    if meta.summary is None:
        raise ValueError("another specialist's turn needs its summary before it can be viewed")
    return [turn.user.to_openai(), summary_note(meta.summary)]


def own_view(label: str, instructions: Sequence[Message], past: Sequence[tuple[Turn, TurnMeta]],
             current: Turn) -> list[dict]:
    """The messages `label` is prompted with for `current` (whose messages are all included)."""
    view = [m.to_openai() for m in instructions]
    for turn, meta in past:
        view += render_turn(label, turn, meta)
    view += [m.to_openai() for m in current.messages]
    return view


def naive_view(label: str, instructions: Sequence[Message], past: Sequence[tuple[Turn, TurnMeta]],
               current: Turn) -> list[dict]:
    """The baseline own-view is measured against: every specialist gets the whole shared history,
    other specialists' answers verbatim (what a single-model chat would send)."""
    view = [m.to_openai() for m in instructions]
    for turn, _ in past:
        view += [m.to_openai() for m in turn.messages]
    return view + [m.to_openai() for m in current.messages]


VIEWS = {"own": own_view, "naive": naive_view}
