"""`MeteredStore`: any ConversationStore, with its failures counted by operation.

A backend's own exception (redis' ConnectionError, sqlite3's OperationalError)
becomes a `StoreError`, so the layers above tell a store failure from an engine
failure without knowing the backend, and the API answers it as retryable.
"""

from __future__ import annotations

from macaron_ray.core.conversation import TurnMeta
from macaron_ray.observability.metrics import MoLMetrics
from macaron_ray.store.base import ConversationStore, StoreError


class MeteredStore:
    def __init__(self, store: ConversationStore, metrics: MoLMetrics):
        self.inner = store
        self._metrics = metrics

    async def _call(self, operation: str, call):
        try:
            return await call
        except Exception as exc:
            self._metrics.store_errors.inc(operation=operation)
            raise StoreError(f"conversation store: {operation} failed ({type(exc).__name__})") from exc

    async def get_turn(self, tenant: str, key: str) -> TurnMeta | None:
        return await self._call("get_turn", self.inner.get_turn(tenant, key))

    async def get_turns(self, tenant: str, keys: list[str]) -> list[TurnMeta | None]:
        return await self._call("get_turns", self.inner.get_turns(tenant, keys))

    async def put_turn(self, tenant: str, key: str, meta: TurnMeta) -> bool:
        return await self._call("put_turn", self.inner.put_turn(tenant, key, meta))

    async def set_summary(self, tenant: str, key: str, summary: str, summary_s: float | None) -> bool:
        return await self._call("set_summary", self.inner.set_summary(tenant, key, summary, summary_s))

    async def put_response(self, tenant: str, response_id: str, doc: dict) -> None:
        return await self._call("put_response", self.inner.put_response(tenant, response_id, doc))

    async def get_response(self, tenant: str, response_id: str) -> dict | None:
        return await self._call("get_response", self.inner.get_response(tenant, response_id))

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        return await self._call("delete_response", self.inner.delete_response(tenant, response_id))

    async def close(self) -> None:
        await self.inner.close()
