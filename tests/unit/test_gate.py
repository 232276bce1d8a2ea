"""Auth and limits before the body is read: hashed keys, tenants, rate, concurrency, back-pressure;
prefix-cache salts per tenant; deadlines on engine calls."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time

import httpx
import pytest

from macaron_ray.api.app import build_api
from macaron_ray.api.gate import Limits
from macaron_ray.api.keys import MIN_KEY_CHARS, KeyRing, KeysError, hash_line, new_key
from macaron_ray.api.surface import Surfaces
from macaron_ray.core.deadlines import DeadlineEngine, Deadlines
from macaron_ray.core.engine_client import EngineRequest, EngineTimeout
from macaron_ray.core.turn_runner import TurnRunner
from macaron_ray.store.sqlite import SQLiteStore
from macaron_ray.testing.fake_engine import FakeEngine, WhitespaceTokenCounter
from tests.unit.api_server import PUBLIC_MODEL, SECRET_ADAPTERS, secret_registry, start_api

A1, A2, B = new_key(), new_key(), new_key()
KEYS = KeyRing.parse("\n".join(["# tenants", hash_line("acme", A1), hash_line("acme", A2), "",
                                hash_line("bravo", B)]))
ANTHROPIC = {"anthropic-version": "2023-06-01"}
TURN = {
    "chat": ("/v1/chat/completions", {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"model": PUBLIC_MODEL, "input": "hi"}),
    "messages": ("/v1/messages", {"model": PUBLIC_MODEL, "max_tokens": 16,
                                  "messages": [{"role": "user", "content": "hi"}]}),
}


def auth(key: str, surface: str = "chat") -> dict:
    return {"x-api-key": key, **ANTHROPIC} if surface == "messages" else {"authorization": f"Bearer {key}"}


def rows(db, table: str) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def rejections(base_url: str, reason: str, key: str = A1) -> float:
    text = httpx.get(base_url + "/metrics", headers=auth(key)).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ray_macaron_rejected_requests_total{") and f'reason="{reason}"' in line)


# -- the keys file -----------------------------------------------------------------------------


def test_a_keys_file_holds_salted_hashes_and_names_the_tenant_of_each_key():
    line = hash_line("acme", A1)
    assert A1 not in line and line.startswith("acme sha256:")
    assert hash_line("acme", A1) != line  # a fresh salt each time
    assert KEYS.tenant_of(A1) == KEYS.tenant_of(A2) == "acme"  # rotation: two keys, one tenant
    assert KEYS.tenant_of(B) == "bravo"
    for wrong in (None, "", A1[:-1], A1 + "x", "acme", line):
        assert KEYS.tenant_of(wrong) is None
    assert KEYS.tenants == {"acme", "bravo"}


def test_plain_keys_short_keys_and_empty_files_are_refused_without_echoing_them():
    with pytest.raises(KeysError) as err:
        KeyRing.parse(hash_line("acme", A1) + "\nsk-plain-key-never-hashed-12345")
    assert "line 2" in str(err.value) and "sk-plain" not in str(err.value)
    with pytest.raises(KeysError, match=f"at least {MIN_KEY_CHARS}"):
        hash_line("acme", "short")
    with pytest.raises(KeysError, match="tenant"):
        hash_line("no spaces allowed", A1)
    with pytest.raises(KeysError, match="no key"):
        KeyRing.parse("# nothing here\n\n")


def test_keys_cli_makes_a_key_and_its_line(capsys, monkeypatch):
    from macaron_ray.cli import main

    assert main(["keys", "new", "--tenant", "acme"]) == 0
    out = capsys.readouterr().out
    key = next(w for w in out.split() if w.startswith("mk-"))
    line = next(ln for ln in out.splitlines() if ln.startswith("acme sha256:"))
    assert KeyRing.parse(line).tenant_of(key) == "acme"
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(key + "\n"))
    assert main(["keys", "hash", "--tenant", "zulu"]) == 0
    assert KeyRing.parse(capsys.readouterr().out).tenant_of(key) == "zulu"


# -- auth at the gate --------------------------------------------------------------------------


@pytest.fixture()
def api(tmp_path):
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path / "s.db", keys=KEYS)
    yield running
    running.stop()


@pytest.mark.parametrize("method,path", [
    ("GET", "/v1/models"), ("GET", f"/v1/models/{PUBLIC_MODEL}"), ("GET", "/metrics"),
    ("POST", "/v1/chat/completions"), ("POST", "/v1/responses"), ("GET", "/v1/responses/resp_x"),
    ("DELETE", "/v1/responses/resp_x"), ("GET", "/v1/responses/resp_x/input_items"), ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"), ("GET", "/v1/no-such-path")])
def test_every_endpoint_but_health_needs_a_key(api, method, path):
    for headers in ({}, auth("not-a-key-" + "x" * 30, "messages" if "messages" in path else "chat")):
        resp = httpx.request(method, api.base_url + path, headers={**ANTHROPIC, **headers}, json={})
        assert resp.status_code == 401, (path, resp.text)
        body = resp.json()
        if path.startswith("/v1/messages"):
            assert body == {"type": "error", "error": {"type": "authentication_error", "message": body["error"]["message"]}}
        else:
            assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == "invalid_api_key"
    assert httpx.get(api.base_url + "/health").status_code == 200


def test_the_key_is_checked_before_the_body_is_read():
    """An unauthenticated request is refused on its headers: the app never asks for its body."""
    store = SQLiteStore(":memory:")
    runner = TurnRunner(secret_registry(), FakeEngine(), store)
    app = build_api(Surfaces(runner=runner, tokens=WhitespaceTokenCounter(), keys=KEYS))
    reads, sent = [], []

    async def receive():
        reads.append(1)
        return {"type": "http.request", "body": b"{" * (1 << 20), "more_body": True}

    async def send(message):
        sent.append(message)

    for path in TURN:
        reads.clear()
        sent.clear()
        scope = {"type": "http", "method": "POST", "path": TURN[path][0], "raw_path": TURN[path][0].encode(),
                 "query_string": b"", "headers": [(b"content-type", b"application/json")], "scheme": "http",
                 "server": ("t", 80), "client": ("c", 1), "root_path": "", "http_version": "1.1"}
        asyncio.run(app(scope, receive, send))
        assert sent[0]["status"] == 401 and reads == []


def test_each_tenant_sees_only_its_own_stored_responses_and_every_key_of_a_tenant_sees_them(api):
    created = httpx.post(api.base_url + "/v1/responses", headers=auth(A1), json=TURN["responses"][1]).json()
    rid = created["id"]
    assert httpx.get(f"{api.base_url}/v1/responses/{rid}", headers=auth(A2)).status_code == 200  # same tenant
    for method, suffix in (("GET", ""), ("GET", "/input_items"), ("DELETE", "")):
        other = httpx.request(method, f"{api.base_url}/v1/responses/{rid}{suffix}", headers=auth(B))
        assert other.status_code == 404, (method, suffix)  # never 403: no existence oracle
        missing = httpx.request(method, f"{api.base_url}/v1/responses/resp_{'0' * 24}{suffix}", headers=auth(B))
        assert other.json() | {"error": {**other.json()["error"], "message": ""}} == \
            missing.json() | {"error": {**missing.json()["error"], "message": ""}}
    chained = httpx.post(api.base_url + "/v1/responses", headers=auth(B),
                         json={**TURN["responses"][1], "previous_response_id": rid})
    assert chained.status_code == 404
    assert httpx.get(f"{api.base_url}/v1/responses/{rid}", headers=auth(A1)).status_code == 200


# -- limits ------------------------------------------------------------------------------------


def test_a_tenant_over_its_rate_gets_429_with_retry_after_and_others_are_not_slowed(tmp_path):
    running = start_api(FakeEngine(), WhitespaceTokenCounter(), tmp_path / "s.db", keys=KEYS,
                        limits=Limits(requests_per_s=0.2, burst=2))
    try:
        for surface in ("chat", "responses"):  # the burst
            path, body = TURN[surface]
            assert httpx.post(running.base_url + path, headers=auth(A1, surface), json=body).status_code == 200
        # A2 is another key of the same tenant: it shares the tenant's bucket.
        over = httpx.post(running.base_url + TURN["messages"][0], headers=auth(A2, "messages"), json=TURN["messages"][1])
        assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
        assert over.json()["error"]["type"] == "rate_limit_error"
        over = httpx.post(running.base_url + TURN["chat"][0], headers=auth(A1), json=TURN["chat"][1])
        assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limit_exceeded"
        assert httpx.post(running.base_url + TURN["chat"][0], headers=auth(B), json=TURN["chat"][1]).status_code == 200
        assert httpx.get(running.base_url + "/v1/models", headers=auth(A1)).status_code == 200  # reads are not limited
        assert rejections(running.base_url, "rate_limited") == 2
        assert rows(tmp_path / "s.db", "turns") == 2  # one "hi" turn per tenant; the refused stored nothing
    finally:
        running.stop()


HOLD_S = 3.0


def holding_engine() -> FakeEngine:
    """An engine whose answers to "hold" stall HOLD_S after their first chunk: the turn stays open."""
    engine = FakeEngine()
    engine.stall(lambda r: FakeEngine.kind(r) == "answer" and "hold" in r.messages[-1]["content"], HOLD_S,
                 after_chunks=1, times=100)
    return engine


def _hold_a_stream(base_url: str, key: str, started: threading.Event) -> None:
    with httpx.stream("POST", base_url + TURN["chat"][0], headers=auth(key), timeout=30,
                      json={**TURN["chat"][1], "messages": [{"role": "user", "content": "hold"}], "stream": True}) as resp:
        assert resp.status_code == 200
        for _ in resp.iter_lines():
            started.set()


def test_concurrent_turns_per_tenant_and_in_flight_per_replica_are_capped(tmp_path):
    running = start_api(holding_engine(), WhitespaceTokenCounter(), tmp_path / "s.db", keys=KEYS,
                        limits=Limits(concurrent_turns=1, turns_in_flight=2))
    try:
        started = threading.Event()
        holder = threading.Thread(target=_hold_a_stream, args=(running.base_url, A1, started))
        holder.start()
        assert started.wait(10)
        second = httpx.post(running.base_url + TURN["chat"][0], headers=auth(A2), json=TURN["chat"][1])
        assert second.status_code == 429 and second.headers["retry-after"] == "1"
        assert second.json()["error"]["code"] == "too_many_concurrent_requests"
        started_b = threading.Event()
        holder_b = threading.Thread(target=_hold_a_stream, args=(running.base_url, B, started_b))
        holder_b.start()
        assert started_b.wait(10)
        third = httpx.post(running.base_url + TURN["messages"][0], headers=auth(B, "messages"),
                           json=TURN["messages"][1])
        assert third.status_code == 503  # two turns in flight: the replica's cap answers first
        assert third.json()["error"]["type"] == "overloaded_error"
        holder.join(20)
        holder_b.join(20)
        assert httpx.post(running.base_url + TURN["chat"][0], headers=auth(A2), json=TURN["chat"][1]).status_code == 200
        assert rejections(running.base_url, "too_many_concurrent") == 1
        assert rejections(running.base_url, "overloaded") == 1
    finally:
        running.stop()


def test_back_pressure_answers_503_overloaded_in_each_surfaces_envelope(tmp_path):
    running = start_api(holding_engine(), WhitespaceTokenCounter(), tmp_path / "s.db", keys=KEYS,
                        limits=Limits(turns_in_flight=1))
    try:
        started = threading.Event()
        holder = threading.Thread(target=_hold_a_stream, args=(running.base_url, A1, started))
        holder.start()
        assert started.wait(10)
        for surface, (path, body) in TURN.items():
            resp = httpx.post(running.base_url + path, headers=auth(B, surface), json=body)
            assert resp.status_code == 503 and resp.headers["retry-after"] == "1", surface
            err = resp.json()["error"]
            assert err["type"] == ("overloaded_error" if surface == "messages" else "server_error")
        holder.join(20)
        assert httpx.post(running.base_url + TURN["chat"][0], headers=auth(B), json=TURN["chat"][1]).status_code == 200
        assert rejections(running.base_url, "overloaded") == 3
    finally:
        running.stop()


# -- the prefix cache, salted per tenant ---------------------------------------------------------


def test_every_hop_is_salted_with_its_tenant_so_cached_tokens_never_cross_tenants(api):
    engine = api.runner.engine
    long = {"model": PUBLIC_MODEL, "messages": [{"role": "user", "content": "tell me about " + "tea " * 40}]}
    first = httpx.post(api.base_url + TURN["chat"][0], headers=auth(A1), json=long).json()
    again = httpx.post(api.base_url + TURN["chat"][0], headers=auth(A2), json=long).json()
    other = httpx.post(api.base_url + TURN["chat"][0], headers=auth(B), json=long).json()
    cached = lambda r: r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    assert cached(again) > 0 and cached(again) == again["usage"]["prompt_tokens"]  # same tenant: reused
    # Another tenant's identical prompt: B's first sight of it caches no more than A's first did.
    assert cached(other) == cached(first) < cached(again)
    deadline = time.monotonic() + 10
    while len(engine.of_kind("summary")) < 2 and time.monotonic() < deadline:  # one per tenant's turn
        time.sleep(0.05)
    salts = {}
    for req in engine.requests:
        salts.setdefault(FakeEngine.kind(req), set()).add(req.cache_salt)
    assert set(salts) == {"route", "answer", "summary"}
    assert all(None not in s and len(s) == 2 for s in salts.values()), salts  # acme and bravo


# -- deadlines -----------------------------------------------------------------------------------


def test_a_stalled_engine_becomes_an_engine_timeout_and_its_stream_is_closed():
    engine = FakeEngine()
    engine.stall(lambda r: True, 5.0, after_chunks=1)
    closed = []

    class Watch:
        async def stream(self, req):
            try:
                async for d in engine.stream(req):
                    yield d
            finally:
                closed.append(1)

    fast = DeadlineEngine(Watch(), Deadlines(first_token_s=1.0, inter_token_s=0.2))
    req = EngineRequest(adapter="a", messages=[{"role": "user", "content": "one two three"}])

    async def drain():
        return [d async for d in fast.stream(req)]

    with pytest.raises(EngineTimeout, match="no token from the engine within 0.2 s"):
        asyncio.run(drain())
    assert closed == [1]
    engine.stall(lambda r: True, 5.0, after_chunks=0)
    with pytest.raises(EngineTimeout, match="no first token"):
        asyncio.run(drain())
    with pytest.raises(ValueError):
        Deadlines(first_token_s=0)


@pytest.mark.parametrize("after_chunks", [0, 2])
def test_a_stalled_answer_rolls_the_turn_back_with_a_retryable_error(tmp_path, after_chunks):
    engine = FakeEngine()
    engine.stall(lambda r: FakeEngine.kind(r) == "answer", 30.0, after_chunks=after_chunks, times=10)
    running = start_api(engine, WhitespaceTokenCounter(), tmp_path / "s.db",
                        deadlines=Deadlines(first_token_s=0.5, inter_token_s=0.5))
    try:
        resp = httpx.post(running.base_url + TURN["chat"][0], json=TURN["chat"][1], timeout=10)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        assert resp.json()["error"]["code"] == "engine_unavailable"
        with httpx.stream("POST", running.base_url + TURN["messages"][0], headers=ANTHROPIC, timeout=10,
                          json={**TURN["messages"][1], "stream": True}) as stream:
            text = "".join(stream.iter_text())
        assert stream.status_code == 503 or "event: error" in text
        metrics = httpx.get(running.base_url + "/metrics").text
        assert 'ray_macaron_rollbacks_total{cause="timeout",surface="chat"} 1.0' in metrics
        assert rows(tmp_path / "s.db", "turns") == 0
    finally:
        running.stop()
