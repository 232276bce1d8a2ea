"""Redis backend: state shared by all ingress replicas.

Each turn is one string key `{prefix}:{tenant}:turn:{key}` holding the JSON
meta. Insert-if-absent is `SET NX`; filling a pending summary is a small Lua
script so that the check and the write are one atomic step.
"""

from __future__ import annotations

import json

from macaron_ray.core.conversation import TurnMeta
from macaron_ray.store.base import decode_meta, encode_meta

_SET_SUMMARY = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local meta = cjson.decode(raw)
if meta['summary'] ~= nil and meta['summary'] ~= cjson.null then return 0 end
meta['summary'] = ARGV[1]
if ARGV[2] ~= '' then meta['summary_s'] = tonumber(ARGV[2]) end
redis.call('SET', KEYS[1], cjson.encode(meta), 'KEEPTTL')
return 1
"""


class RedisStore:
    def __init__(self, url: str, *, prefix: str = "macaron", ttl_s: int | None = None, timeout_s: float = 5.0):
        """`ttl_s`: every key expires that long after it is written (a summary keeps its turn's).
        `timeout_s`: connecting and each command, at most; then the operation fails (a 503)."""
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                              health_check_interval=30)
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._set_summary = self._redis.register_script(_SET_SUMMARY)

    def _key(self, tenant: str, key: str) -> str:
        return f"{self._prefix}:{tenant}:turn:{key}"

    async def get_turn(self, tenant: str, key: str) -> TurnMeta | None:
        raw = await self._redis.get(self._key(tenant, key))
        return decode_meta(raw) if raw is not None else None

    async def put_turn(self, tenant: str, key: str, meta: TurnMeta) -> bool:
        return bool(await self._redis.set(self._key(tenant, key), encode_meta(meta), nx=True, ex=self._ttl_s))

    async def set_summary(self, tenant: str, key: str, summary: str, summary_s: float | None) -> bool:
        args = [summary, "" if summary_s is None else repr(summary_s)]
        return bool(await self._set_summary(keys=[self._key(tenant, key)], args=args))

    def _rkey(self, tenant: str, response_id: str) -> str:
        return f"{self._prefix}:{tenant}:response:{response_id}"

    async def put_response(self, tenant: str, response_id: str, doc: dict) -> None:
        await self._redis.set(self._rkey(tenant, response_id), json.dumps(doc), ex=self._ttl_s)

    async def get_response(self, tenant: str, response_id: str) -> dict | None:
        raw = await self._redis.get(self._rkey(tenant, response_id))
        return json.loads(raw) if raw is not None else None

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        return bool(await self._redis.delete(self._rkey(tenant, response_id)))

    async def close(self) -> None:
        await self._redis.aclose()
