"""ConversationStore contract, against real SQLite and a real redis-server."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from macaron_ray.core.conversation import TurnMeta
from macaron_ray.store.base import tenant_id
from macaron_ray.store.redis import RedisStore
from macaron_ray.store.sqlite import SQLiteStore


@pytest.fixture(params=["sqlite", "redis"])
def make_store(request, tmp_path, redis_url):
    prefix = f"t{uuid.uuid4().hex[:8]}"

    def make(ttl_s: int | None = None):
        if request.param == "sqlite":
            return SQLiteStore(tmp_path / "state.db", ttl_s=ttl_s)
        return RedisStore(redis_url, prefix=prefix, ttl_s=ttl_s)
    return make


def test_put_is_insert_if_absent_and_summary_fills_once(make_store):
    async def scenario():
        store = make_store()
        t = tenant_id("key-a")
        assert await store.get_turn(t, "k1") is None
        assert await store.put_turn(t, "k1", TurnMeta(label="L2"))
        assert not await store.put_turn(t, "k1", TurnMeta(label="L3"))
        assert await store.get_turn(t, "k1") == TurnMeta(label="L2")
        assert await store.set_summary(t, "k1", "first", 0.5)
        assert not await store.set_summary(t, "k1", "second", 0.1)
        assert await store.get_turn(t, "k1") == TurnMeta(label="L2", summary="first", summary_s=0.5)  # exact in binary
        assert not await store.set_summary(t, "absent", "x", None)
        assert await store.get_turn(t, "absent") is None
        await store.close()
    asyncio.run(scenario())


def test_tenant_is_part_of_every_key(make_store):
    async def scenario():
        store = make_store()
        a, b = tenant_id("key-a"), tenant_id("key-b")
        assert a != b
        await store.put_turn(a, "k", TurnMeta(label="L1", summary="s"))
        assert await store.get_turn(b, "k") is None
        assert await store.put_turn(b, "k", TurnMeta(label="L3"))
        assert (await store.get_turn(a, "k")).label == "L1"
        await store.close()
    asyncio.run(scenario())


def test_state_survives_a_restart(make_store):
    async def scenario():
        store = make_store()
        t = tenant_id("k")
        await store.put_turn(t, "k1", TurnMeta(label="L1"))
        await store.set_summary(t, "k1", "booked", 0.2)
        await store.close()
        reopened = make_store()
        assert await reopened.get_turn(t, "k1") == TurnMeta(label="L1", summary="booked", summary_s=0.2)
        await reopened.close()
    asyncio.run(scenario())


def test_concurrent_commits_of_one_turn_write_once(make_store):
    async def scenario():
        stores = [make_store() for _ in range(4)]
        t = tenant_id("k")
        wrote = await asyncio.gather(*[s.put_turn(t, "same", TurnMeta(label=f"L{i}")) for i, s in enumerate(stores)])
        assert sorted(wrote) == [False, False, False, True]
        for s in stores:
            await s.close()
    asyncio.run(scenario())


def test_sqlite_uses_wal(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    asyncio.run(store.close())


def test_responses_are_stored_per_tenant_and_deletable(make_store):
    async def scenario():
        store = make_store()
        a, b = tenant_id("a"), tenant_id("b")
        doc = {"response": {"id": "resp_1"}, "conversation": [{"role": "user", "content": "hi"}]}
        await store.put_response(a, "resp_1", doc)
        assert await store.get_response(a, "resp_1") == doc
        assert await store.get_response(b, "resp_1") is None
        assert not await store.delete_response(b, "resp_1")
        assert await store.delete_response(a, "resp_1")
        assert await store.get_response(a, "resp_1") is None
        await store.close()
    asyncio.run(scenario())


def test_turns_summaries_and_responses_expire_after_the_ttl(make_store, monkeypatch):
    async def scenario():
        store = make_store(ttl_s=1)
        t = tenant_id("key-a")
        assert await store.put_turn(t, "k", TurnMeta(label="L2", answer_sha="ab"))
        assert await store.set_summary(t, "k", "s", None)  # keeps the turn's expiry
        await store.put_response(t, "resp_1", {"id": "resp_1"})
        assert (await store.get_turn(t, "k")).answer_sha == "ab"
        await asyncio.sleep(1.3)
        assert await store.get_turn(t, "k") is None
        assert await store.get_response(t, "resp_1") is None
        assert not await store.delete_response(t, "resp_1")
        assert not await store.set_summary(t, "k", "late", None)
        # An expired turn is gone: committing it again writes it again.
        assert await store.put_turn(t, "k", TurnMeta(label="L3"))
        assert await store.get_turn(t, "k") == TurnMeta(label="L3")
        await store.close()
    if isinstance(make_store(), SQLiteStore):
        monkeypatch.setattr("macaron_ray.store.sqlite.PURGE_EVERY_S", 0.0)
    asyncio.run(scenario())


def test_sqlite_purges_expired_rows_and_upgrades_an_old_file(tmp_path, monkeypatch):
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # a file of the schema before rows expired
        db.execute("CREATE TABLE turns (tenant TEXT NOT NULL, key TEXT NOT NULL, meta TEXT NOT NULL, "
                   "PRIMARY KEY (tenant, key)) WITHOUT ROWID")
        db.execute("INSERT INTO turns VALUES ('t', 'old', '{\"label\": \"L1\"}')")
    monkeypatch.setattr("macaron_ray.store.sqlite.PURGE_EVERY_S", 0.0)

    async def scenario():
        store = SQLiteStore(path, ttl_s=0.2)
        assert await store.get_turn("t", "old") == TurnMeta(label="L1")  # no expiry: kept
        assert await store.put_turn("t", "new", TurnMeta(label="L2"))
        await asyncio.sleep(0.3)
        assert await store.put_turn("t", "newer", TurnMeta(label="L3"))  # the write purges
        await store.close()
    asyncio.run(scenario())
    with sqlite3.connect(path) as db:
        assert sorted(k for (k,) in db.execute("SELECT key FROM turns")) == ["newer", "old"]


def test_get_turns_reads_many_keys_in_order_with_none_for_misses(make_store):
    # More keys than one MGET chunk (Redis) and one IN (...) query (SQLite) hold.
    async def scenario():
        store = make_store()
        a, b = tenant_id("key-a"), tenant_id("key-b")
        keys = [f"k{i}" for i in range(1200)]
        for i in range(0, 1200, 3):
            assert await store.put_turn(a, keys[i], TurnMeta(label=f"L{i % 4}", answer_sha=str(i)))
        await store.put_turn(b, "k1", TurnMeta(label="L1"))  # another tenant's key: a miss for `a`
        wanted = [*reversed(keys), "absent", "k0"]
        expected = [TurnMeta(label=f"L{int(k[1:]) % 4}", answer_sha=k[1:]) if k[1:].isdigit() and int(k[1:]) % 3 == 0
                    else None for k in wanted]
        assert await store.get_turns(a, wanted) == expected
        assert await store.get_turns(a, []) == []
        await store.close()
    asyncio.run(scenario())


def test_sqlite_purge_finds_expired_rows_through_an_index_in_new_and_old_files(tmp_path):
    import sqlite3

    old = tmp_path / "old.db"
    with sqlite3.connect(old) as db:  # the schema before rows expired: no `expires` column, no index
        db.execute("CREATE TABLE turns (tenant TEXT NOT NULL, key TEXT NOT NULL, meta TEXT NOT NULL, "
                   "PRIMARY KEY (tenant, key)) WITHOUT ROWID")
        db.execute("CREATE TABLE responses (tenant TEXT NOT NULL, id TEXT NOT NULL, doc TEXT NOT NULL, "
                   "PRIMARY KEY (tenant, id)) WITHOUT ROWID")
    for path in (tmp_path / "new.db", old):
        store = SQLiteStore(path, ttl_s=60)
        for table in ("turns", "responses"):
            assert f"{table}_expires" in {row[1] for row in store._db.execute(f"PRAGMA index_list({table})")}
            plan = " ".join(row[3] for row in store._db.execute(
                f"EXPLAIN QUERY PLAN DELETE FROM {table} WHERE expires <= ?", (0.0,)))
            assert f"INDEX {table}_expires" in plan, plan
        asyncio.run(store.close())


class _WatchedConnection:
    """A store's connection that records, at each use of it or of a cursor it made, whether the
    store's lock is held (the test runs one operation at a time, so a held lock is that operation's)."""

    def __init__(self, db, lock):
        self._db, self._lock, self.held = db, lock, []

    def execute(self, *args):
        self.held.append(("execute", self._lock.locked()))
        return _WatchedCursor(self._db.execute(*args), self)

    def close(self):
        self._db.close()


class _WatchedCursor:
    def __init__(self, cursor, conn: _WatchedConnection):
        self._cursor, self._conn = cursor, conn

    def __getattr__(self, name):  # fetchone, fetchall, rowcount, ...
        self._conn.held.append((name, self._conn._lock.locked()))
        return getattr(self._cursor, name)


def test_sqlite_uses_its_connection_and_fetches_rows_only_under_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr("macaron_ray.store.sqlite.PURGE_EVERY_S", 0.0)  # the purge runs on every write
    store = SQLiteStore(tmp_path / "s.db", ttl_s=60)
    watched = store._db = _WatchedConnection(store._db, store._lock)

    async def scenario():
        t = tenant_id("k")
        assert await store.put_turn(t, "k1", TurnMeta(label="L1"))
        assert await store.get_turn(t, "k1") == TurnMeta(label="L1")
        assert await store.set_summary(t, "k1", "s", None)
        await store.put_response(t, "r1", {"id": "r1"})
        assert await store.get_response(t, "r1") == {"id": "r1"}
        assert await store.delete_response(t, "r1")
        assert await store.get_turns(t, ["k1", "k2"]) == [TurnMeta(label="L1", summary="s"), None]
    asyncio.run(scenario())
    asyncio.run(store.close())
    used = {name for name, _ in watched.held}
    assert {"execute", "rowcount"} <= used and used & {"fetchone", "fetchall"}, used
    assert [use for use in watched.held if not use[1]] == []
