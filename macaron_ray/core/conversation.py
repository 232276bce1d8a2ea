"""The conversation as the core sees it: canonical messages, turns and the hash chain.

Messages arrive from any API surface already translated into OpenAI chat shape.
The core keeps them strict (`extra="forbid"`): translation layers are lenient.
A *turn* is one user message and everything after it up to the next user
message (assistant messages, tool calls, tool results). System messages before
the first user message are the conversation's instructions.

The *hash chain* keys the own-view cache: `h(i) = sha256(h(i-1) || canonical(m_i))`,
seeded with the tenant, so the same history resent by a stateless client maps to
the same keys on any replica, and two tenants never share a key. The instructions
are not in the chain: a client may change them from request to request (the
Responses API's `instructions`, an agent's handoff, a date in a system prompt),
and the conversation stays the same conversation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    arguments: str
    """JSON text, as on the OpenAI wire."""


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None

    def to_openai(self) -> dict:
        out: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def canonical(self) -> str:
        """The stable text of this message for hashing (independent of wire field order)."""
        return json.dumps(self.to_openai(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class Turn:
    """One user turn of a history: its key, the user message, and what followed it."""

    key: str
    """Hash-chain value at the user message: identifies the conversation prefix ending there."""
    user: Message
    rest: tuple[Message, ...]

    @property
    def messages(self) -> tuple[Message, ...]:
        return (self.user, *self.rest)


@dataclass(frozen=True)
class History:
    instructions: tuple[Message, ...]
    """System messages before the first user message."""
    turns: tuple[Turn, ...]
    """Completed turns and, last, the turn the request is about."""


class HistoryError(ValueError):
    """The messages do not form a conversation the core can serve (a client error)."""

    def __init__(self, message: str, param: str = "messages"):
        super().__init__(message)
        self.param = param


def chain_seed(tenant: str) -> str:
    return hashlib.sha256(b"macaron-ray/v1\0" + tenant.encode()).hexdigest()


def chain_step(prev: str, message: Message) -> str:
    return hashlib.sha256(prev.encode() + b"\0" + message.canonical().encode()).hexdigest()


def split_turns(tenant: str, messages: list[Message] | tuple[Message, ...]) -> History:
    """Cut a request's messages into instructions and turns, keyed by the hash chain."""
    if not messages:
        raise HistoryError("messages must not be empty")
    h = chain_seed(tenant)
    instructions: list[Message] = []
    turns: list[tuple[str, Message, list[Message]]] = []
    calls: set[str] = set()
    for i, m in enumerate(messages):
        if m.role == "system" and not turns:
            instructions.append(m)  # not chained: see the module's docstring
            continue
        h = chain_step(h, m)
        if m.tool_calls:
            calls.update(c.id for c in m.tool_calls)
        if m.role == "tool" and m.tool_call_id not in calls:
            raise HistoryError(f"messages[{i}]: tool result for unknown tool_call_id {m.tool_call_id!r}")
        if m.role == "user":
            turns.append((h, m, []))
        elif not turns:
            raise HistoryError(f"messages[{i}]: a {m.role} message before the first user message")
        else:
            turns[-1][2].append(m)
    if not turns:
        raise HistoryError("messages must contain a user message")
    return History(tuple(instructions), tuple(Turn(k, u, tuple(r)) for k, u, r in turns))


def pending_tool_results(turn: Turn) -> tuple[Message, tuple[Message, ...]] | None:
    """(assistant tool-call message, its trailing tool results) if the turn ends in tool results."""
    rest = turn.rest
    n = len(rest)
    while n and rest[n - 1].role == "tool":
        n -= 1
    if n == len(rest):
        return None
    if n == 0 or not rest[n - 1].tool_calls:
        raise HistoryError("a tool message must follow an assistant message with tool_calls")
    return rest[n - 1], rest[n:]


@dataclass(frozen=True)
class TurnMeta:
    """What the own-view cache holds per turn (private: never sent to a client)."""

    label: str
    summary: str | None = None
    """None while the summary hop has not finished."""
    summary_s: float | None = None
    answer_sha: str | None = None
    """Fingerprint of the answer the summary describes (`summary_hop.answer_sha`): a client that
    regenerated the answer sends another one, and that one gets its own summary."""


def answer_key(turn_key: str, answer_sha: str) -> str:
    """The cache key of a turn with a given answer, when it is not the answer first committed."""
    return hashlib.sha256(f"{turn_key}\0answer\0{answer_sha}".encode()).hexdigest()


__all__ = [
    "FunctionCall", "ToolCall", "Message", "Turn", "History", "HistoryError", "TurnMeta",
    "split_turns", "pending_tool_results", "chain_seed", "chain_step", "answer_key",
]
