"""SQLite backend: the embedded default. WAL mode; survives a restart; one file per deployment.

With `ttl_s`, every row carries its expiry: an expired row reads as absent, and
expired rows are deleted as new ones are written (at most once a minute, found
through an index on `expires`).

sqlite3 calls block, so each runs in a worker thread. One connection serves all
of them; `check_same_thread=False` is safe because a lock serializes its use
(sqlite3 connection objects are not safe for concurrent use): every statement,
and every fetch of its rows, happens under that lock.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from pathlib import Path

from macaron_ray.core.conversation import TurnMeta
from macaron_ray.store.base import decode_meta, encode_meta

_SCHEMA = """
CREATE TABLE IF NOT EXISTS turns (
    tenant TEXT NOT NULL,
    key    TEXT NOT NULL,
    meta   TEXT NOT NULL,
    PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS responses (
    tenant TEXT NOT NULL,
    id     TEXT NOT NULL,
    doc    TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
) WITHOUT ROWID;
"""


PURGE_EVERY_S = 60.0
KEYS_PER_QUERY = 500
"""Keys in one `IN (...)` of `get_turns`: well under SQLite's bound on variables in one statement
(999 before SQLite 3.32)."""


class SQLiteStore:
    def __init__(self, path: str | Path, *, ttl_s: float | None = None):
        self.path = Path(path)
        self.ttl_s = ttl_s
        self._purged = 0.0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        for table in ("turns", "responses"):  # files written before rows expired gain the column
            columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if "expires" not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN expires REAL")
            # After the column exists (an old file gains it just above): the purge's range scan.
            self._db.execute(f"CREATE INDEX IF NOT EXISTS {table}_expires ON {table} (expires)")
        # Serializes use of the one connection (statements and fetches) across worker threads.
        self._lock = threading.Lock()

    def _run(self, sql: str, args: tuple) -> tuple[list[tuple], int]:
        """One statement: its rows and its rowcount, both read before the lock is released."""
        with self._lock:
            cur = self._db.execute(sql, args)
            return cur.fetchall(), cur.rowcount

    def _expires(self) -> float | None:
        return None if self.ttl_s is None else time.time() + self.ttl_s

    def _write(self, sql: str, args: tuple) -> int:
        """A write, and its rowcount; first, at most once a minute, the expired rows go (an expired row
        blocks an insert)."""
        with self._lock:
            now = time.time()
            if self.ttl_s is not None and now - self._purged > PURGE_EVERY_S:
                self._purged = now
                for table in ("turns", "responses"):
                    self._db.execute(f"DELETE FROM {table} WHERE expires <= ?", (now,))
            return self._db.execute(sql, args).rowcount

    async def get_turn(self, tenant: str, key: str) -> TurnMeta | None:
        rows, _ = await asyncio.to_thread(
            self._run, "SELECT meta FROM turns WHERE tenant = ? AND key = ? AND (expires IS NULL OR expires > ?)",
            (tenant, key, time.time()))
        return decode_meta(rows[0][0]) if rows else None

    async def get_turns(self, tenant: str, keys: list[str]) -> list[TurnMeta | None]:
        found = dict(await asyncio.to_thread(self._select_turns, tenant, keys, time.time()))
        return [decode_meta(found[k]) if k in found else None for k in keys]

    def _select_turns(self, tenant: str, keys: list[str], now: float) -> list[tuple[str, str]]:
        """(key, meta) of the live turns among `keys`, in one hold of the lock (a query per chunk)."""
        rows = []
        with self._lock:
            for i in range(0, len(keys), KEYS_PER_QUERY):
                chunk = keys[i:i + KEYS_PER_QUERY]
                rows += self._db.execute(
                    f"SELECT key, meta FROM turns WHERE tenant = ? AND key IN ({', '.join('?' * len(chunk))}) "
                    "AND (expires IS NULL OR expires > ?)", (tenant, *chunk, now)).fetchall()
        return rows

    async def put_turn(self, tenant: str, key: str, meta: TurnMeta) -> bool:
        # An expired row of the same key is replaced: insert-if-absent among the live rows.
        written = await asyncio.to_thread(
            self._write, "INSERT INTO turns (tenant, key, meta, expires) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (tenant, key) DO UPDATE SET meta = excluded.meta, expires = excluded.expires "
            "WHERE turns.expires IS NOT NULL AND turns.expires <= ?",
            (tenant, key, encode_meta(meta), self._expires(), time.time()))
        return written == 1

    async def set_summary(self, tenant: str, key: str, summary: str, summary_s: float | None) -> bool:
        _, written = await asyncio.to_thread(
            self._run,
            "UPDATE turns SET meta = json_set(meta, '$.summary', ?, '$.summary_s', ?) "
            "WHERE tenant = ? AND key = ? AND json_extract(meta, '$.summary') IS NULL "
            "AND (expires IS NULL OR expires > ?)",
            (summary, summary_s, tenant, key, time.time()))
        return written == 1

    async def put_response(self, tenant: str, response_id: str, doc: dict) -> None:
        await asyncio.to_thread(self._write, "INSERT OR REPLACE INTO responses (tenant, id, doc, expires) "
                                "VALUES (?, ?, ?, ?)", (tenant, response_id, json.dumps(doc), self._expires()))

    async def get_response(self, tenant: str, response_id: str) -> dict | None:
        rows, _ = await asyncio.to_thread(
            self._run, "SELECT doc FROM responses WHERE tenant = ? AND id = ? AND (expires IS NULL OR expires > ?)",
            (tenant, response_id, time.time()))
        return json.loads(rows[0][0]) if rows else None

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        _, deleted = await asyncio.to_thread(
            self._run, "DELETE FROM responses WHERE tenant = ? AND id = ? AND (expires IS NULL OR expires > ?)",
            (tenant, response_id, time.time()))
        return deleted == 1

    async def close(self) -> None:
        with self._lock:
            self._db.close()
