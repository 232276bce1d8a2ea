"""SQLite backend: the embedded default. WAL mode; survives a restart; one file per deployment.

sqlite3 calls block, so each runs in a worker thread. One connection serves all
of them; `check_same_thread=False` is safe because a lock serializes its use
(sqlite3 connection objects are not safe for concurrent use).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
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


class SQLiteStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        # Serializes use of the one connection across worker threads.
        self._lock = threading.Lock()

    def _run(self, sql: str, args: tuple) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, args)

    async def get_turn(self, tenant: str, key: str) -> TurnMeta | None:
        row = (await asyncio.to_thread(
            self._run, "SELECT meta FROM turns WHERE tenant = ? AND key = ?", (tenant, key))).fetchone()
        return decode_meta(row[0]) if row else None

    async def put_turn(self, tenant: str, key: str, meta: TurnMeta) -> bool:
        cur = await asyncio.to_thread(
            self._run, "INSERT OR IGNORE INTO turns (tenant, key, meta) VALUES (?, ?, ?)",
            (tenant, key, encode_meta(meta)))
        return cur.rowcount == 1

    async def set_summary(self, tenant: str, key: str, summary: str, summary_s: float | None) -> bool:
        cur = await asyncio.to_thread(
            self._run,
            "UPDATE turns SET meta = json_set(meta, '$.summary', ?, '$.summary_s', ?) "
            "WHERE tenant = ? AND key = ? AND json_extract(meta, '$.summary') IS NULL",
            (summary, summary_s, tenant, key))
        return cur.rowcount == 1

    async def put_response(self, tenant: str, response_id: str, doc: dict) -> None:
        await asyncio.to_thread(self._run, "INSERT OR REPLACE INTO responses (tenant, id, doc) VALUES (?, ?, ?)",
                                (tenant, response_id, json.dumps(doc)))

    async def get_response(self, tenant: str, response_id: str) -> dict | None:
        row = (await asyncio.to_thread(
            self._run, "SELECT doc FROM responses WHERE tenant = ? AND id = ?", (tenant, response_id))).fetchone()
        return json.loads(row[0]) if row else None

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        cur = await asyncio.to_thread(
            self._run, "DELETE FROM responses WHERE tenant = ? AND id = ?", (tenant, response_id))
        return cur.rowcount == 1

    async def close(self) -> None:
        with self._lock:
            self._db.close()
