"""The ConversationStore protocol.

Keys are hash-chain values (`core.conversation`) scoped by tenant: the tenant
is part of every key, so one tenant can never read another's state. Values are
small JSON documents. Every backend gives the same guarantees:

- `put_turn` inserts only if absent and says whether it did: a delivered turn
  is committed exactly once, whichever replica commits it;
- `set_summary` fills a pending summary once; a later write never replaces it;
- nothing is written until a turn is delivered (the runner stages, then commits).
"""

from __future__ import annotations

import hashlib
import json
from typing import Protocol

from macaron_ray.core.conversation import TurnMeta


class StoreError(RuntimeError):
    """A store operation failed (the backend is down, locked, or answered an error); retryable."""


def tenant_id(api_key: str | None) -> str:
    """A stable, non-reversible tenant id for an API key (raw keys are never stored)."""
    return hashlib.sha256(b"tenant\0" + (api_key or "").encode()).hexdigest()[:32]


def named_tenant_id(name: str) -> str:
    """The tenant id of a tenant named in a keys file: the same for each of its keys (rotation)."""
    return hashlib.sha256(b"named-tenant\0" + name.encode()).hexdigest()[:32]


def encode_meta(meta: TurnMeta) -> str:
    return json.dumps({"label": meta.label, "summary": meta.summary, "summary_s": meta.summary_s,
                       "answer_sha": meta.answer_sha})


def decode_meta(raw: str | bytes) -> TurnMeta:
    d = json.loads(raw)
    return TurnMeta(label=d["label"], summary=d.get("summary"), summary_s=d.get("summary_s"),
                    answer_sha=d.get("answer_sha"))


class ConversationStore(Protocol):
    async def get_turn(self, tenant: str, key: str) -> TurnMeta | None:
        """The cached metadata of a turn, or None (a miss is normal: the caller re-derives)."""
        ...

    async def get_turns(self, tenant: str, keys: list[str]) -> list[TurnMeta | None]:
        """`get_turn` of each of `keys` in one round trip (a long conversation costs no more round trips
        than a short one), results in the order of `keys`."""
        ...

    async def put_turn(self, tenant: str, key: str, meta: TurnMeta) -> bool:
        """Insert if absent. True if this call wrote it."""
        ...

    async def set_summary(self, tenant: str, key: str, summary: str, summary_s: float | None) -> bool:
        """Fill the summary of an existing turn whose summary is still pending. True if written."""
        ...

    async def put_response(self, tenant: str, response_id: str, doc: dict) -> None:
        """Store a delivered Responses-API response (with what chaining needs)."""
        ...

    async def get_response(self, tenant: str, response_id: str) -> dict | None:
        ...

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        ...

    async def close(self) -> None:
        ...
