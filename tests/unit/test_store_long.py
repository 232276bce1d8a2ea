"""Long conversations and concurrent load on the Redis store, through the real API app over the fake
engine, against a real redis-server that caps its connections as a managed Redis does: every request
succeeds, and a request's store commands do not grow with its conversation's length."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis.asyncio as aioredis

from macaron_ray.api.app import build_api
from macaron_ray.api.surface import Surfaces
from macaron_ray.core.conversation import TurnMeta
from macaron_ray.core.engine_client import Usage
from macaron_ray.core.turn_runner import TurnRunner
from macaron_ray.store.base import tenant_id
from macaron_ray.store.redis import RedisStore
from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.redis_server import redis_server
from tests.unit.api_server import PUBLIC_MODEL, secret_registry

MAX_CLIENTS = 100
"""The server's cap on connections: a replica that opened one connection per past turn hit it once
a conversation was about 100 turns long, and every refused command was a 503."""
TOPICS = ("write python code", "book a table", "draw a chart", "hello there")
"""Routed to L2, L1, L3, L0 in turn: every turn changes specialist, so every turn needs summaries."""


class NoPrefixCache(FakeEngine):
    """The fake engine without its prefix-cache accounting, which compares each prompt with every
    earlier prompt of its adapter token by token: cubic in a conversation's length (minutes for
    1,000 turns). These tests count requests and store commands, not cached tokens."""

    def _usage(self, req, completion):
        return Usage(prompt_tokens=0, completion_tokens=len(completion), cached_tokens=0)


@pytest.fixture(scope="module")
def capped_redis_url(tmp_path_factory) -> str:
    with redis_server(tmp_path_factory.mktemp("redis-capped"), "--maxclients", str(MAX_CLIENTS)) as port:
        yield f"redis://127.0.0.1:{port}/0"


def api_client(runner: TurnRunner, max_messages: int) -> httpx.AsyncClient:
    app = build_api(Surfaces(runner=runner, tokens=WhitespaceTokenCounter(), max_messages=max_messages))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://api", timeout=30)


async def respond(client: httpx.AsyncClient, key: str, turn: int, previous: str | None) -> str:
    """Turn `turn` of a Responses-API conversation chained by `previous_response_id`; the new id."""
    body = {"model": PUBLIC_MODEL, "input": f"{TOPICS[turn % len(TOPICS)]} {turn}"}
    if previous is not None:
        body["previous_response_id"] = previous
    resp = await client.post("/v1/responses", json=body, headers={"authorization": f"Bearer {key}"})
    assert resp.status_code == 200, f"turn {turn}: {resp.status_code} {resp.text}"
    return resp.json()["id"]


async def command_calls(stats: aioredis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): v["calls"] for name, v in (await stats.info("commandstats")).items()}


def per_request(before: dict[str, int], after: dict[str, int], requests: int) -> dict[str, float]:
    return {c: (n - before.get(c, 0)) / requests for c, n in after.items() if c != "info" and n != before.get(c, 0)}


def test_a_1000_turn_conversation_succeeds_with_store_commands_per_request_flat(capped_redis_url):
    turns, windows = 1000, {100: 200, 900: 1000}  # the store commands of turns 100-199 and 900-999

    async def scenario():
        store = RedisStore(capped_redis_url, prefix="long")
        stats = aioredis.Redis.from_url(capped_redis_url)
        runner = TurnRunner(secret_registry(), NoPrefixCache(), store, summary_retry_delay_s=0.0)
        snapshots, previous = {}, None
        started = time.perf_counter()
        async with api_client(runner, max_messages=2 * turns) as client:
            for turn in range(turns + 1):
                if turn in windows or turn in windows.values():
                    await runner.drain()  # the window's summary hops are its own
                    snapshots[turn] = await command_calls(stats)
                if turn < turns:
                    previous = await respond(client, "sk-long", turn, previous)
        elapsed = time.perf_counter() - started
        await runner.drain()
        await stats.aclose()
        await store.close()
        return elapsed, {start: per_request(snapshots[start], snapshots[end], end - start)
                         for start, end in windows.items()}

    elapsed, per_window = asyncio.run(scenario())
    early, late = per_window[100], per_window[900]
    print(f"{turns} turns chained on Redis in {elapsed:.1f} s")
    # Reading 900 past turns costs what reading 100 did: the same commands, and one more MGET chunk
    # (in the same pipeline, the same round trip) once a request has more past turns than one chunk holds.
    assert late.get("get", 0) <= early.get("get", 0) <= 3, (early, late)
    assert early.get("mget") == 1 and late.get("mget") == 2, (early, late)
    assert sum(late.values()) <= sum(early.values()) + 1, (early, late)


def test_concurrent_long_conversations_and_another_tenant_all_succeed(capped_redis_url):
    conversations, turns = 4, 200

    async def scenario():
        store = RedisStore(capped_redis_url, prefix="load")
        runner = TurnRunner(secret_registry(), NoPrefixCache(), store, summary_retry_delay_s=0.0)
        other_statuses = []
        async with api_client(runner, max_messages=2 * turns) as client:
            async def conversation(n: int) -> None:
                previous = None
                for turn in range(turns):
                    previous = await respond(client, f"sk-load-{n % 2}", turn, previous)

            async def other_tenant() -> None:  # short chats, for as long as the long conversations run
                while not done.is_set():
                    resp = await client.post("/v1/chat/completions", headers={"authorization": "Bearer sk-other"},
                                             json={"model": PUBLIC_MODEL, "messages": [
                                                 {"role": "user", "content": "book a table"},
                                                 {"role": "assistant", "content": "for how many?"},
                                                 {"role": "user", "content": f"for {len(other_statuses)}"}]})
                    other_statuses.append(resp.status_code)

            done = asyncio.Event()
            other = asyncio.create_task(other_tenant())
            try:
                await asyncio.gather(*(conversation(n) for n in range(conversations)))
            finally:
                done.set()
                await other
        await runner.drain()
        await store.close()
        return other_statuses

    other_statuses = asyncio.run(scenario())
    assert other_statuses and set(other_statuses) == {200}, other_statuses


def test_a_burst_beyond_the_pool_waits_for_a_connection(capped_redis_url):
    async def scenario():
        stats = aioredis.Redis.from_url(capped_redis_url)
        before = (await stats.info("clients"))["connected_clients"]
        store = RedisStore(capped_redis_url, prefix="burst", max_connections=4)
        t = tenant_id("burst")
        assert await store.put_turn(t, "k", TurnMeta(label="L1"))
        metas = await asyncio.gather(*(store.get_turn(t, "k") for _ in range(3 * MAX_CLIENTS)))
        opened = (await stats.info("clients"))["connected_clients"] - before
        await store.close()
        await stats.aclose()
        return metas, opened

    metas, opened = asyncio.run(scenario())
    assert metas == [TurnMeta(label="L1")] * (3 * MAX_CLIENTS)
    assert opened <= 4
