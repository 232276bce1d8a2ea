"""Redis backend: state shared by all ingress replicas.

Each turn is one string key `{prefix}:{tenant}:turn:{key}` holding the JSON
meta. Insert-if-absent is `SET NX`; filling a pending summary is a small Lua
script so that the check and the write are one atomic step. A request reads
all its past turns with MGET, in one round trip, and the connection pool is
bounded: a burst waits for a connection instead of opening one per command.
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

DEFAULT_MAX_CONNECTIONS = 64
MGET_CHUNK = 512
"""Keys per MGET (the chunks go in one pipeline, one round trip): Redis runs one command at a time,
so one huge MGET would hold up every other client."""


class RedisStore:
    def __init__(self, url: str, *, prefix: str = "macaron", ttl_s: int | None = None, timeout_s: float = 5.0,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS):
        """`ttl_s`: every key expires that long after it is written (a summary keeps its turn's).
        `timeout_s`: connecting, waiting for a free connection, and each command, at most; then the
        operation fails (a 503). `max_connections`: this replica's connections to Redis, at most (a
        `?max_connections=` in `url` wins); a burst beyond them waits for one (up to `timeout_s`)
        rather than failing."""
        import redis.asyncio as aioredis

        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=timeout_s, socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s, health_check_interval=30)
        self._redis = aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._set_summary = self._redis.register_script(_SET_SUMMARY)

    def _key(self, tenant: str, key: str) -> str:
        return f"{self._prefix}:{tenant}:turn:{key}"

    async def get_turn(self, tenant: str, key: str) -> TurnMeta | None:
        raw = await self._redis.get(self._key(tenant, key))
        return decode_meta(raw) if raw is not None else None

    async def get_turns(self, tenant: str, keys: list[str]) -> list[TurnMeta | None]:
        if not keys:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for i in range(0, len(keys), MGET_CHUNK):
            pipe.mget([self._key(tenant, k) for k in keys[i:i + MGET_CHUNK]])
        chunks = await pipe.execute()
        return [decode_meta(raw) if raw is not None else None for chunk in chunks for raw in chunk]

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
