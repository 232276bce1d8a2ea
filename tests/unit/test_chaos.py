"""The chaos harness's clients and checks, against the API on the fake engine (the faults themselves
run on the real topology: `macaron chaos`, tests/fault)."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import httpx

from macaron_ray import chaos
from macaron_ray.core.engine_client import EngineUnavailable
from macaron_ray.store.base import tenant_id
from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.unit.api_server import PUBLIC_MODEL, SECRET_ADAPTERS, start_api


def stored(db) -> dict[str, dict]:
    with sqlite3.connect(db) as conn:
        return {k: json.loads(m) for k, m in conn.execute("SELECT key, meta FROM turns WHERE tenant = ?",
                                                         (tenant_id(chaos.API_KEY),))}


def run_load(load: chaos.Load, seconds: float) -> None:
    async def main():
        task = asyncio.create_task(load.run())
        await asyncio.sleep(seconds)
        load.stop()
        await asyncio.wait_for(task, 30)
    asyncio.run(main())


def test_clients_retry_refused_turns_and_every_stored_turn_was_delivered(tmp_path):
    engine = FakeEngine(chunk_delay_s=0.01, tag=lambda a: next(k for k, v in SECRET_ADAPTERS.items() if v == a))
    engine.fail(lambda r: FakeEngine.kind(r) == "answer", times=6, error=EngineUnavailable)
    engine.fail(lambda r: FakeEngine.kind(r) == "answer", after_chunks=2, times=3)  # mid-stream
    api = start_api(engine, WhitespaceTokenCounter(), tmp_path / "s.db")
    try:
        load = chaos.Load(api.base_url, PUBLIC_MODEL, conversations=4, max_tokens=8, start_jitter_s=0.1,
                          private=tuple(SECRET_ADAPTERS.values()))
        run_load(load, 6.0)
    finally:
        api.stop()
    attempts = [a for c in load.clients for a in c.attempts]
    summary = chaos.attempts_summary(attempts, 0.0, float("inf"))
    assert summary["failed_by_kind"] == {"refused": 6, "stream_error": 3}
    assert summary["unclear"] == 0 and summary["retries"] > 0
    for c in load.clients:  # a failed turn is tried again, the same turn, next
        for a, b in zip(c.attempts, c.attempts[1:]):
            if a.outcome != "delivered":
                assert (b.turn, b.number) == (a.turn, a.number + 1)
    refused = [a for a in attempts if a.outcome == "refused"]
    assert {(a.status, a.retry_after) for a in refused} == {(503, "1")}
    assert {c.surface for c in load.clients} == {"chat", "messages"}
    delivered = set().union(*(c.delivered for c in load.clients))
    assert summary["delivered"] >= len(delivered) > 8  # a restarted trace repeats its keys
    assert load.scan.found == set()
    after = stored(tmp_path / "s.db")
    result = chaos.check(after, after, delivered)
    assert result["undelivered"] == 0 and result["lost"] == 0  # every stored turn was delivered


def test_sdk_clients_classify_failures_as_the_http_clients_do(tmp_path):
    """The official SDKs (the cluster tier's clients), over two URLs: the same refusals (503 +
    Retry-After), the same mid-stream error events, the same bookkeeping."""
    engine = FakeEngine(chunk_delay_s=0.01, tag=lambda a: next(k for k, v in SECRET_ADAPTERS.items() if v == a))
    engine.fail(lambda r: FakeEngine.kind(r) == "answer", times=6, error=EngineUnavailable)
    engine.fail(lambda r: FakeEngine.kind(r) == "answer", after_chunks=2, times=3)  # mid-stream
    api = start_api(engine, WhitespaceTokenCounter(), tmp_path / "s.db")
    try:
        load = chaos.Load([api.base_url, api.base_url], PUBLIC_MODEL, conversations=4, max_tokens=8,
                          start_jitter_s=0.1, private=tuple(SECRET_ADAPTERS.values()), sdk=True)
        run_load(load, 6.0)
    finally:
        api.stop()
    summary = chaos.attempts_summary([a for c in load.clients for a in c.attempts], 0.0, float("inf"))
    assert summary["failed_by_kind"] == {"refused": 6, "stream_error": 3}, summary
    assert summary["unclear"] == 0 and summary["retries"] > 0
    refused = [a for c in load.clients for a in c.attempts if a.outcome == "refused"]
    assert {(a.status, a.retry_after) for a in refused} == {(503, "1")}
    delivered = set().union(*(c.delivered for c in load.clients))
    assert len(delivered) > 8 and load.scan.found == set()
    after = stored(tmp_path / "s.db")
    assert chaos.check(after, after, delivered)["undelivered"] == 0


def test_disconnecting_clients_roll_their_turns_back(tmp_path):
    api = start_api(FakeEngine(chunk_delay_s=0.01), WhitespaceTokenCounter(), tmp_path / "s.db")
    try:
        load = chaos.Load(api.base_url, PUBLIC_MODEL, conversations=2, max_tokens=8, start_jitter_s=0.1,
                          private=tuple(SECRET_ADAPTERS.values()))
        load.disconnect_until = float("inf")
        run_load(load, 1.5)
    finally:
        api.stop()
    attempts = [a for c in load.clients for a in c.attempts]
    assert attempts and {a.outcome for a in attempts if a.ended} == {"disconnected"}
    # This fake engine names the adapter in its first delta: the clients' leak scan sees it.
    assert load.scan.found and load.scan.found <= set(SECRET_ADAPTERS.values())
    assert stored(tmp_path / "s.db") == {}


def test_the_checks_count_lost_changed_and_undelivered_turns():
    before = {"a": {"label": "L1", "summary": "s"}, "b": {"label": "L2", "summary": None},
              "c": {"label": "L0", "summary": "x"}}
    after = {"a": {"label": "L1", "summary": "s"}, "b": {"label": "L2", "summary": "filled later"},
             "c": {"label": "L0", "summary": "y"}, "d": {"label": "L3"}}
    assert chaos.check(before, after, {"a", "b", "c"}) == {
        "committed_before": 3, "committed_after": 4, "lost": 0, "changed": 1, "undelivered": 1}
    assert chaos.check(before, {"a": before["a"]}, {"a", "b", "c"})["lost"] == 2
    # "d" is the turn a client is still trying to get delivered: not (yet) undelivered
    assert chaos.check(before, after, {"a", "b", "c"}, {"d"})["undelivered"] == 0


def test_a_client_counts_its_turn_under_the_key_the_runner_files_its_own_answer_under():
    """A stream broken after its commit is retried; the answer the retry delivers may not be the one
    committed, and the next turn files that answer's summary under a key of its own. The client
    counts its delivered turn under that key too, so it is not taken for an undelivered one."""
    from macaron_ray.core.conversation import Message, answer_key, split_turns
    from macaron_ray.core.turn_runner import _answer_sha

    client = chaos.Client(0, "chat", ["hi", "and then?"])
    messages = [{"role": "user", "content": "hi"}]
    client.begin("t", messages)
    client.deliver(messages, "hello there\nfriend")
    past = split_turns("t", [Message(**m) for m in [*client.history, {"role": "user", "content": "and then?"}]]).turns[0]
    assert client.delivered == {past.key, answer_key(past.key, _answer_sha(past))}
    assert client.pending is None and client.next_turn == 1


def test_error_bodies_are_read_in_each_surfaces_envelope():
    assert chaos._error_of(b'{"error": {"message": "m", "type": "server_error", "code": "engine_unavailable"}}',
                           "chat") == ("engine_unavailable", True)
    assert chaos._error_of(b'{"type": "error", "error": {"type": "overloaded_error", "message": "m"}}',
                           "messages") == ("overloaded_error", True)
    assert chaos._error_of(b"Internal Server Error", "chat") == (None, False)
    assert chaos._error_of(b'{"detail": "x"}', "messages") == (None, False)


def test_a_sqlite_file_locked_by_another_process_is_a_503_then_recovers(tmp_path):
    """Another process holds the store's SQLite file in an exclusive transaction: turns that need the
    store fail after its busy timeout with a retryable 503 and commit nothing; once the lock is gone
    the same request succeeds, without a restart."""
    import subprocess
    import sys
    import time

    import httpx

    db = tmp_path / "s.db"
    api = start_api(FakeEngine(), WhitespaceTokenCounter(), db)
    body = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "write python code"}]}
    try:
        locker = subprocess.Popen([sys.executable, "-c", (
            "import sqlite3, sys, time\n"
            f"db = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "db.execute('BEGIN EXCLUSIVE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(8)\n"
            "db.execute('ROLLBACK')\n")], stdout=subprocess.PIPE, text=True)
        assert locker.stdout.readline().strip() == "locked"
        started = time.monotonic()
        refused = httpx.post(api.base_url + "/v1/chat/completions", json=body, timeout=30)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "store_unavailable"
        assert time.monotonic() - started < 8  # the busy timeout, not the lock, ended the wait
        locker.wait(20)
        locker.stdout.close()
        assert httpx.post(api.base_url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        assert len(stored(db)) == 0  # another tenant: the chaos client's tenant has nothing
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT COUNT(*) FROM turns").fetchone()[0] == 1  # committed once, after the lock
    finally:
        api.stop()


async def _dying_ingress(reader, writer, *, began: bool):
    """Serve's proxy as a client sees it when the ingress replica dies: before the response, a bare
    500; after it began, a chunked stream closed without its last chunk."""
    await reader.readuntil(b"\r\n\r\n")
    if began:
        event = b'data: {"choices": [{"index": 0, "delta": {"content": "Hel"}}]}\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     + f"{len(event):x}\r\n".encode() + event + b"\r\n")
    else:
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: 21\r\n\r\n"
                     b"Internal Server Error")
    await writer.drain()
    writer.close()


def test_an_ingress_replica_dying_is_counted_apart_from_unclear_failures():
    async def attempt(began: bool) -> chaos.Attempt:
        server = await asyncio.start_server(lambda r, w: _dying_ingress(r, w, began=began), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        load = chaos.Load(url, PUBLIC_MODEL, conversations=1, max_tokens=8)
        client = load.clients[0]
        record = chaos.Attempt(0, 0, 1, client.surface, 0.0)
        async with server, httpx.AsyncClient(base_url=url) as http:
            answer = await load._attempt(http, client, record, [{"role": "user", "content": "hi"}])
        assert answer is None
        record.ended = 1.0
        return record

    before, after = asyncio.run(attempt(began=False)), asyncio.run(attempt(began=True))
    assert (before.outcome, before.status) == ("proxy_500", 500)
    assert (after.outcome, after.status, after.code) == ("stream_cut", 200, "RemoteProtocolError")
    summary = chaos.attempts_summary([before, after], 0.0, 2.0)
    assert summary["unclear"] == 0 and summary["proxy_500"] == 1 and summary["stream_cut"] == 1
    # A stream that ends cleanly without its end is the app's fault, not a dead process: unclear.
    clean_end = chaos.Attempt(0, 0, 2, "chat", 0.0, ended=1.0, outcome="transport", status=200, clear=False)
    assert chaos.attempts_summary([clean_end], 0.0, 2.0)["unclear"] == 1
