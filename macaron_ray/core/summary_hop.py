"""The summary hop: L0 condenses a delivered turn into <= 192 tokens for the other specialists.

It runs after the answer has been delivered, off the critical path. Its prompt
(the summary scaffold) never enters any own-view.
"""

from __future__ import annotations

import json

from macaron_ray import prompts

SUMMARY_BUDGET_TOKENS = 192


def answer_digest(content: str | None, tool_calls: list[tuple[str, dict]] | None) -> str:
    """What the assistant did, in the summary prompt's words. Shared with the L0 training data."""
    if tool_calls:
        name, arguments = tool_calls[0]
        return f"called {name} with {json.dumps(arguments)}"
    return "answered: " + (content or "").replace("\n", " ")[:160]


def fallback_summary(user_text: str) -> str:
    """What stands for a summary the hop could not make (empty output, or every attempt failed)."""
    return f'Earlier message from the user, not summarized: "{" ".join(user_text.split())[:200]}"'


def summary_messages(user_text: str, digest: str) -> list[dict]:
    return [{"role": "system", "content": prompts.load("summary")},
            {"role": "user", "content": f"User: {user_text}\nAssistant: {digest}"}]
