"""The summary hop: L0 condenses a delivered turn into one or two sentences for the other specialists.

It runs after the answer has been delivered, off the critical path. Its prompt
(the summary scaffold) never enters any own-view.
"""

from __future__ import annotations

import hashlib
import json

from macaron_ray import prompts
from macaron_ray.core.text import repetition_loop

SUMMARY_BUDGET_TOKENS = 64
"""The hop's decode budget. Recipe 3's summaries run 19 tokens on average, 32 at most, on the quality
benchmark (recipe 2's copied the turn: 65 on average, up to 192); the budget bounds what a
degenerate output costs on a CPU core."""


def answer_digest(content: str | None, tool_calls: list[tuple[str, dict]] | None) -> str:
    """What the assistant did, in the summary prompt's words. Shared with the L0 training data."""
    if tool_calls:
        name, arguments = tool_calls[0]
        return f"called {name} with {json.dumps(arguments)}"
    return "answered: " + (content or "").replace("\n", " ")[:160]


def answer_sha(digest: str) -> str:
    """Fingerprint of an answer, as the summary hop sees it (its digest, whitespace collapsed)."""
    return hashlib.sha256(" ".join(digest.split()).encode()).hexdigest()[:32]


def usable(summary: str) -> bool:
    """A summary the other specialists and the route hop may be shown: not empty, not a repetition
    loop (a looping summary misleads both: "The UI agent (UI-UI) (UI-UI) ..." sent a follow-up to L3)."""
    return bool(summary.strip()) and not repetition_loop(summary)


def fallback_summary(user_text: str) -> str:
    """What stands for a summary the hop could not make (empty output, or every attempt failed)."""
    return f'Earlier message from the user, not summarized: "{" ".join(user_text.split())[:200]}"'


SUBJECTS = {"L0": "The user", "L1": "The personal agent", "L2": "The coding assistant", "L3": "The UI assistant"}
"""How a summary of a turn answered by each specialist begins (the start of L0's trained summaries).
The hop writes it into the reply itself, as the route hop writes "L": the runner knows who answered,
and L0 guessing it from the answer alone named the wrong specialist ("The UI assistant wrote a
regex ..."), which then misrouted the follow-up."""


def summary_messages(user_text: str, digest: str, label: str | None = None) -> list[dict]:
    """The summary prompt; with the answering specialist's label, the reply begun with its subject
    (`SUBJECTS`; the request then continues that message)."""
    messages = [{"role": "system", "content": prompts.load("summary")},
                {"role": "user", "content": f"User: {user_text}\nAssistant: {digest}"}]
    if label in SUBJECTS:
        messages.append({"role": "assistant", "content": SUBJECTS[label]})
    return messages


def begun(messages: list[dict]) -> str:
    """The part of the summary the prompt already wrote (the subject), if any."""
    return messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""


def stored_summary(messages: list[dict], output: str, user_text: str) -> str:
    """What is kept for the turn: the begun subject and L0's output, or the fallback when the output
    is not usable."""
    return (begun(messages) + output).strip() if usable(output) else fallback_summary(user_text)
