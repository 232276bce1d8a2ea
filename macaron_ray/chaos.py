"""`macaron chaos`: the local topology under concurrent multi-turn conversations, one fault at a time.

The local-cpu profile runs with two ingress replicas on a real Redis (AOF on, so
a restart keeps what was written) while `conversations` clients replay the
load-test traces' user messages over loopback, streaming, half through chat
completions and half through Messages. Each client keeps its own record: the
history of its delivered turns, and every attempt with its outcome. A failed
turn is retried, after the `Retry-After` the server sent, with the same history
(at most `MAX_ATTEMPTS` times).

Faults (`FAULTS`), each injected once, after a quiet spell, while a stream is open:

    decode_kill       SIGKILL the decode replica's vLLM engine process
    prefill_kill      SIGKILL the prefill replica's engine (route hops and KV transfer)
    ingress_kill      SIGKILL one of the two ingress replicas
    redis_restart     SIGTERM redis-server, start it again at once
    redis_down        redis-server stopped for `REDIS_DOWN_S`, then started
    engine_stall      SIGSTOP the decode engine for `STALL_S` (beyond the inter-token deadline), then SIGCONT
    client_disconnect clients close their streams after the first delta, for a while

After each fault, once the service answers again and a settle period has passed,
the checks read the store (Redis) and the clients' records:

    lost          committed turns (in the store before the fault) missing after it: must be 0
    changed       committed turns whose label or summary changed (an own-view would no longer be
                  a prefix of its next one): must be 0
    undelivered   turns in the store that no client saw delivered, nor is still trying to: must be 0.
                  A client's turn counts under its key and, when the answer it received is not
                  the one committed first (a retry after a stream broken past the commit), under
                  the key the runner files that answer's summary under (`answer_key`)
    leaks         private strings (adapter ids, the base's path, stack traces) in anything a client
                  received: must be none
    unclear       failed attempts without a retryable error in the surface's envelope (503/429 +
                  Retry-After, or an error event in the stream): reported, with what they got
    proxy_500     requests whose ingress replica was killed before their response began: Ray
                  Serve's proxy answers them with a bare 500 (not the app's envelope, which the
                  app cannot send once its process is gone); counted apart, 0 outside ingress_kill
    stream_cut    streams whose ingress replica was killed after their response began: the proxy
                  closes the connection without the chunked body's end, HTTP's way of saying the
                  response is incomplete (no event can be sent for a dead process); counted apart,
                  0 outside ingress_kill
    recovery_s    from the fault to the end of the first turn, begun after it, that was delivered

The report (JSON, and a table) counts attempts, delivered turns, failures by kind,
retries, and the figures above, per fault.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from macaron_ray.core.conversation import Message, answer_key, split_turns
from macaron_ray.core.summary_hop import answer_digest, answer_sha
from macaron_ray.loadtest.leaks import LeakScan
from macaron_ray.store.base import tenant_id

FAULTS = ("decode_kill", "prefill_kill", "ingress_kill", "redis_restart", "redis_down", "engine_stall",
          "client_disconnect")
API_KEY = "chaos-client"
MAX_ATTEMPTS = 8
REDIS_DOWN_S = 30.0
STALL_S = 25.0
DISCONNECT_S = 20.0
INTER_TOKEN_S = 10.0
"""The profile's inter-token deadline in this run (the stall outlasts it)."""
RETRYABLE = (429, 503)


# -- the store -----------------------------------------------------------------------------------


class RedisProcess:
    """A redis-server on a loopback port with AOF fsync'd on every write: a restart loses nothing."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise RuntimeError("redis-server is not installed (`make install` installs Debian's redis-server)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir), "--save", "",
             "--appendonly", "yes", "--appendfsync", "always"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)
            self.proc = None

    def turns(self, tenant: str) -> dict[str, dict]:
        return stored_turns(self.url, tenant)


def stored_turns(url: str, tenant: str) -> dict[str, dict]:
    """Every committed turn of `tenant` in the Redis at `url`: key -> its meta."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        prefix = f"macaron:{tenant}:turn:"
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        values = client.mget(keys) if keys else []
        return {k.decode()[len(prefix):]: json.loads(v) for k, v in zip(keys, values) if v is not None}
    finally:
        client.close()


# -- the topology's processes ----------------------------------------------------------------------


def deployment_processes(session_dir: Path, deployment: str):
    """(replica processes, their vLLM engine processes) of one Serve deployment, e.g. "Decode:base"."""
    import psutil

    from macaron_ray.bench.memory import _group, _title, session_processes

    procs = session_processes(Path(session_dir).resolve().name)
    titles = {}
    for proc in procs:
        try:
            titles[proc.pid] = _title(proc)
        except psutil.Error:
            pass

    def serves(proc) -> bool:
        try:
            return proc.pid in titles and _group(proc, titles) == deployment
        except psutil.Error:  # it (or a parent) ended while we looked: a replaced replica's
            return False

    mine = [p for p in procs if serves(p)]
    replicas = [p for p in mine if titles[p.pid].startswith("ray::ServeReplica:")]
    engines = [p for p in mine if "EngineCore" in titles[p.pid]]
    return replicas, engines


# -- the clients -----------------------------------------------------------------------------------


@dataclass
class Attempt:
    conversation: int
    turn: int
    number: int
    surface: str
    started: float
    ended: float = 0.0
    outcome: str = ""
    """delivered | refused (an HTTP error) | stream_error | transport | disconnected | proxy_500 | stream_cut"""
    status: int | None = None
    retry_after: str | None = None
    code: str | None = None
    clear: bool = True
    """A failure in the surface's envelope that says to retry (503/429 + Retry-After, or an error event)."""


@dataclass
class Client:
    index: int
    surface: str
    turns: list[str]
    history: list[dict] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    next_turn: int = 0
    delivered: set[str] = field(default_factory=set)
    """Keys of every turn this client saw delivered, in every conversation it ran."""
    pending: str | None = None
    """Key of the turn this client is trying to get delivered (attempts may be under way)."""
    streaming: bool = False
    """A stream of this client is open and has sent a delta (a fault may be injected now)."""

    def begin(self, tenant: str, messages: list[dict]) -> None:
        """The turn ending in `messages` is the one this client now tries to get delivered."""
        self.pending = split_turns(tenant, [Message(**m) for m in messages]).turns[-1].key

    def deliver(self, messages: list[dict], answer: str) -> None:
        """`answer` to the pending turn arrived whole: it joins the history, and the turn is
        delivered under its key and under the key of this answer's own summary."""
        self.history = [*messages, {"role": "assistant", "content": answer}]
        self.delivered |= {self.pending, answer_key(self.pending, answer_sha(answer_digest(answer, None)))}
        self.pending = None
        self.next_turn += 1


class Load:
    """`conversations` clients replaying the traces until stopped; their records stay for the checks."""

    def __init__(self, url: str | list[str], model: str, conversations: int, max_tokens: int, seed: int = 0,
                 tenant: str = tenant_id(API_KEY), start_jitter_s: float = 3.0, private: tuple[str, ...] = (),
                 sdk: bool = False):
        """`url`: one server, or several (client i talks to url[i % len], as a Service spreads
        clients over its endpoints). `sdk`: the clients are the official SDKs (openai's
        AsyncOpenAI, anthropic's AsyncAnthropic, with their own retries off) rather than raw HTTP."""
        from macaron_ray.loadtest.traces import load_traces

        traces = load_traces()
        users = [[t.user for t in c.turns] for c in traces.conversations]
        self.urls = [url] if isinstance(url, str) else list(url)
        self.url, self.model, self.max_tokens, self.tenant, self.sdk = self.urls[0], model, max_tokens, tenant, sdk
        self.clients = [Client(i, "chat" if i % 2 == 0 else "messages", users[i % len(users)])
                        for i in range(conversations)]
        self.disconnect_until = 0.0
        self.start_jitter_s = start_jitter_s
        self.scan = LeakScan(private)
        """Private strings (adapter ids, the base's path, stack traces) found in what a client received."""
        self.rng = random.Random(seed)
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    def streaming(self) -> bool:
        return any(c.streaming for c in self.clients)

    async def run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            https = [await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(300.0, connect=10.0))) for url in self.urls]
            if self.sdk:
                self._sdks = {c.index: self._sdk_for(c) for c in self.clients}
                for sdk in self._sdks.values():
                    stack.push_async_callback(sdk.close)
            await asyncio.gather(*(self._converse(https[c.index % len(https)], c) for c in self.clients))

    def _sdk_for(self, client: Client):
        """The official SDK of the client's surface, at its server, with the SDK's own retries off."""
        import anthropic
        import openai

        url = self.urls[client.index % len(self.urls)]
        timeout = 300.0
        if client.surface == "chat":
            return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=timeout)
        return anthropic.AsyncAnthropic(base_url=url, api_key=API_KEY, max_retries=0, timeout=timeout)

    async def _converse(self, http: httpx.AsyncClient, client: Client) -> None:
        await asyncio.sleep(self.rng.uniform(0, self.start_jitter_s))
        while not self._stop.is_set():
            if client.next_turn == len(client.turns):  # the trace is done: a new conversation
                client.history, client.next_turn = [], 0
            text = client.turns[client.next_turn]
            messages = [*client.history, {"role": "user", "content": text}]
            client.begin(self.tenant, messages)
            for number in range(1, MAX_ATTEMPTS + 1):
                if self._stop.is_set():
                    return
                attempt = Attempt(client.index, client.next_turn, number, client.surface, time.monotonic())
                client.attempts.append(attempt)
                answer = await self._attempt(http, client, attempt, messages)
                attempt.ended = time.monotonic()
                if answer is not None:
                    client.deliver(messages, answer)
                    break
                wait = float(attempt.retry_after) if (attempt.retry_after or "").isdigit() else 1.0
                await asyncio.sleep(min(wait, 5.0))

    async def _attempt(self, http: httpx.AsyncClient, client: Client, attempt: Attempt,
                       messages: list[dict]) -> str | None:
        if self.sdk:
            return await self._attempt_sdk(http, client, attempt, messages)
        if client.surface == "chat":
            path = "/v1/chat/completions"
            headers = {"authorization": f"Bearer {API_KEY}"}
            body = {"model": self.model, "messages": messages, "stream": True, "max_tokens": self.max_tokens,
                    "temperature": 0}
        else:
            path = "/v1/messages"
            headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
            body = {"model": self.model, "messages": messages, "stream": True, "max_tokens": self.max_tokens,
                    "temperature": 0}
        disconnect = time.monotonic() < self.disconnect_until
        parts: list[str] = []
        try:
            async with http.stream("POST", path, json=body, headers=headers) as resp:
                attempt.status = resp.status_code
                attempt.retry_after = resp.headers.get("retry-after")
                self.scan.scan("\n".join(f"{k}: {v}" for k, v in resp.headers.items()))
                if resp.status_code != 200:
                    raw = await resp.aread()
                    self.scan.scan(raw.decode(errors="replace"))
                    attempt.outcome = "refused"
                    attempt.code, envelope = _error_of(raw, client.surface)
                    if resp.status_code == 500 and not envelope:
                        # The app answers every error in its envelope (the fuzz tier holds it to
                        # that): a bare 500 is Ray Serve's proxy, for a request whose ingress
                        # replica died before its response began.
                        attempt.outcome, attempt.clear = "proxy_500", False
                        return None
                    attempt.clear = envelope and resp.status_code in RETRYABLE and attempt.retry_after is not None
                    return None
                done = False
                try:
                    async for line in resp.aiter_lines():
                        self.scan.scan(line)
                        if not line.startswith("data: "):
                            continue
                        data = line[6:]
                        if data == "[DONE]":
                            done = True
                            break
                        event = json.loads(data)
                        if not isinstance(event, dict):
                            raise json.JSONDecodeError("an event that is not an object", data, 0)
                        if "error" in event:
                            attempt.outcome = "stream_error"
                            attempt.code, _ = _error_of(data.encode(), client.surface)
                            return None
                        text = _delta_text(event, client.surface)
                        if text:
                            parts.append(text)
                            client.streaming = True
                            if disconnect:
                                attempt.outcome = "disconnected"
                                return None
                        if client.surface == "messages" and event.get("type") == "message_stop":
                            done = True
                            break
                finally:
                    client.streaming = False
                if not done:
                    attempt.outcome, attempt.clear = "transport", False  # the stream ended without its end
                    return None
        except httpx.RemoteProtocolError as exc:
            # After a 200: the connection closed mid-body, as Serve's proxy closes a stream whose
            # ingress replica died. Before one: the server broke the protocol.
            outcome = "stream_cut" if attempt.status == 200 else "transport"
            attempt.outcome, attempt.clear, attempt.code = outcome, False, type(exc).__name__
            return None
        except (httpx.TransportError, json.JSONDecodeError) as exc:
            attempt.outcome, attempt.clear, attempt.code = "transport", False, type(exc).__name__
            return None
        attempt.outcome = "delivered"
        return "".join(parts)


    async def _attempt_sdk(self, http: httpx.AsyncClient, client: Client, attempt: Attempt,
                           messages: list[dict]) -> str | None:
        """One attempt through the official SDK of the client's surface (`http` is unused: each SDK
        keeps its own connections)."""
        import anthropic
        import openai

        disconnect = time.monotonic() < self.disconnect_until
        parts: list[str] = []
        done = False
        try:
            sdk = self._sdks[client.index]
            if client.surface == "chat":
                stream = await sdk.chat.completions.create(model=self.model, messages=messages, stream=True,
                                                           max_tokens=self.max_tokens, temperature=0)
                attempt.status = 200
                async with stream:
                    async for chunk in stream:
                        self.scan.scan(chunk.model_dump_json())
                        text = "".join(c.delta.content or "" for c in chunk.choices)
                        done = done or any(c.finish_reason for c in chunk.choices)
                        if text and self._delivering(client, parts, text, disconnect, attempt):
                            return None
            else:
                stream = await sdk.messages.create(model=self.model, messages=messages, stream=True,
                                                   max_tokens=self.max_tokens,
                                                   extra_body={"temperature": 0})  # not a parameter of SDK 2.x
                attempt.status = 200
                async with stream:
                    async for event in stream:
                        self.scan.scan(event.model_dump_json())
                        if event.type == "content_block_delta" and event.delta.type == "text_delta":
                            if self._delivering(client, parts, event.delta.text, disconnect, attempt):
                                return None
                        done = done or event.type == "message_stop"
        except (openai.APIStatusError, anthropic.APIStatusError) as exc:
            # Before the stream (an HTTP error), or an error event in it (status 200).
            self.scan.scan(json.dumps(exc.body) if exc.body is not None else str(exc))
            self.scan.scan("\n".join(f"{k}: {v}" for k, v in exc.response.headers.items()))
            attempt.status = exc.status_code
            attempt.retry_after = exc.response.headers.get("retry-after")
            body = exc.body if isinstance(exc.body, dict) else {}
            error = body.get("error", body) if client.surface == "messages" else body
            attempt.code = (error or {}).get("type") or (error or {}).get("code")
            if exc.status_code == 200:
                attempt.outcome = "stream_error"
                return None
            attempt.outcome = "refused"
            envelope = isinstance(error, dict) and isinstance(error.get("message"), str)
            if exc.status_code == 500 and not envelope:
                attempt.outcome, attempt.clear = "proxy_500", False
                return None
            attempt.clear = envelope and exc.status_code in RETRYABLE and attempt.retry_after is not None
            return None
        except (openai.APIError, anthropic.APIError) as exc:
            if attempt.status == 200 and getattr(exc, "body", None) is not None:  # openai: an error event
                self.scan.scan(json.dumps(exc.body))
                attempt.outcome, attempt.code = "stream_error", (exc.body or {}).get("code") \
                    if isinstance(exc.body, dict) else None
                return None
            # A connection error: before the response, or (the SDK wraps it too) mid-body, where a
            # connection closed before the body's end is Serve's proxy ending the stream.
            cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else ""
            cut = attempt.status == 200 and "Protocol" in cause
            attempt.outcome, attempt.clear = ("stream_cut" if cut else "transport"), False
            attempt.code = f"{type(exc).__name__}({cause}: {str(exc.__cause__)[:120]})" if cause else type(exc).__name__
            return None
        except Exception as exc:
            # The transport failed mid-stream, under the SDK (httpx's errors, or the HTTP library
            # the SDK vendors: matched by name). After a 200, a connection closed mid-body is how
            # Serve's proxy ends a stream whose ingress replica died.
            if not re.search(r"Protocol|Transport|Read|Connect|Timeout|Network|Stream", type(exc).__name__):
                raise
            outcome = "stream_cut" if attempt.status == 200 and "Protocol" in type(exc).__name__ else "transport"
            attempt.outcome, attempt.clear, attempt.code = outcome, False, type(exc).__name__
            return None
        finally:
            client.streaming = False
        if not done:
            attempt.outcome, attempt.clear = "transport", False  # the stream ended without its end
            return None
        attempt.outcome = "delivered"
        return "".join(parts)

    @staticmethod
    def _delivering(client: Client, parts: list[str], text: str, disconnect: bool, attempt: Attempt) -> bool:
        """Takes a delta's text; True when the client leaves now (a disconnect spell)."""
        parts.append(text)
        client.streaming = True
        if disconnect:
            attempt.outcome = "disconnected"
            return True
        return False


def _delta_text(event: dict, surface: str) -> str:
    if surface == "chat":
        return "".join((c.get("delta") or {}).get("content") or "" for c in event.get("choices") or ())
    if event.get("type") == "content_block_delta":
        return (event.get("delta") or {}).get("text") or ""
    return ""


def _error_of(raw: bytes, surface: str) -> tuple[str | None, bool]:
    """(the error's code or type, whether the body is the surface's error envelope)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, False
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return None, False
    if surface == "messages":
        return error.get("type"), body.get("type") == "error"
    return error.get("code") or error.get("type"), True


# -- the checks ------------------------------------------------------------------------------------


def check(before: dict[str, dict], after: dict[str, dict], delivered: set[str], pending: set[str] = frozenset()) -> dict:
    lost = sorted(k for k in before if k not in after)
    changed = sorted(k for k, meta in before.items() if k in after and _fixed(meta) != _fixed(after[k], meta))
    return {"committed_before": len(before), "committed_after": len(after), "lost": len(lost),
            "changed": len(changed), "undelivered": len(undelivered_keys(after, delivered, pending))}


def undelivered_keys(after: dict[str, dict], delivered: set[str], pending: set[str] = frozenset()) -> set[str]:
    return {k for k in after if k not in delivered and k not in pending}


def _fixed(meta: dict, earlier: dict | None = None) -> tuple:
    """What must not change once written: the label, and the summary once there was one."""
    summary = meta.get("summary") if earlier is None or earlier.get("summary") is not None else None
    return meta.get("label"), summary


INGRESS_DEATH = ("proxy_500", "stream_cut")
"""What a client can get when the ingress replica serving it dies: Ray Serve's proxy answers for it."""


def attempts_summary(attempts: list[Attempt], since: float, until: float) -> dict:
    # Attempts that ended in the window (a stream open when the fault came counts for the fault);
    # those still under way are counted apart.
    window = [a for a in attempts if a.outcome and since <= a.ended < until]
    under_way = [a for a in attempts if not a.outcome and a.started < until]
    failed = [a for a in window if a.outcome != "delivered"]
    kinds: dict[str, int] = {}
    for a in failed:
        kinds[a.outcome] = kinds.get(a.outcome, 0) + 1
    unclear = [a for a in failed if not a.clear and a.outcome not in ("disconnected", *INGRESS_DEATH)]
    return {"attempts": len(window), "delivered": sum(a.outcome == "delivered" for a in window),
            "failed": len(failed), "failed_by_kind": kinds, "retries": sum(a.number > 1 for a in window),
            "under_way": len(under_way),
            "unclear": len(unclear),
            **{kind: sum(a.outcome == kind for a in failed) for kind in INGRESS_DEATH},
            "unclear_examples": [{k: v for k, v in asdict(a).items() if k in ("outcome", "status", "code", "surface")}
                                 for a in unclear[:5]]}


# -- the run ---------------------------------------------------------------------------------------


def chaos_config(profile: Path, out: Path, *, port: int, redis_url: str) -> Path:
    from macaron_ray.serve.args import load_profile
    from macaron_ray.serve.local_cluster import serve_config_with

    ingress = load_profile(profile).ingress.model_dump(mode="json", exclude_unset=True)
    ingress.update(num_replicas=2, timeouts={"first_token_s": 90.0, "inter_token_s": INTER_TOKEN_S})
    return serve_config_with(profile, out, port=port,
                             args_updates={"store": {"kind": "redis", "url": redis_url}, "ingress": ingress})


@dataclass(frozen=True)
class Timings:
    """How long each part of a fault phase lasts (the tier in tests/fault runs shorter ones)."""

    quiet_s: float = 20.0
    """Load without a fault before each fault."""
    settle_s: float = 20.0
    """Load after recovery, before the checks."""
    timeout_s: float = 300.0
    """Longest wait for the first turn delivered after the fault."""
    redis_down_s: float = REDIS_DOWN_S
    stall_s: float = STALL_S
    disconnect_s: float = DISCONNECT_S


class Injector:
    def __init__(self, cluster, redis: RedisProcess, load: Load | None = None, timings: Timings = Timings()):
        self.cluster, self.redis, self.load, self.timings = cluster, redis, load, timings

    def engine(self, deployment: str):
        _, engines = deployment_processes(self.cluster.session_dir, deployment)
        if not engines:
            raise RuntimeError(f"no vLLM engine process of {deployment} found")
        return engines[0]

    async def inject(self, fault: str) -> None:
        t = self.timings
        if fault == "decode_kill":
            self.engine("Decode:base").send_signal(signal.SIGKILL)
        elif fault == "prefill_kill":
            self.engine("Prefill:base").send_signal(signal.SIGKILL)
        elif fault == "ingress_kill":
            replicas, _ = deployment_processes(self.cluster.session_dir, "MoLIngress")
            replicas[0].send_signal(signal.SIGKILL)
        elif fault == "redis_restart":
            self.redis.stop()
            self.redis.start()
        elif fault == "redis_down":
            self.redis.stop()
            try:
                await asyncio.sleep(t.redis_down_s)
            finally:
                self.redis.start()
        elif fault == "engine_stall":
            engine = self.engine("Decode:base")
            engine.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(t.stall_s)
            finally:
                engine.send_signal(signal.SIGCONT)
        elif fault == "client_disconnect":
            self.load.disconnect_until = time.monotonic() + t.disconnect_s
            await asyncio.sleep(t.disconnect_s)
        else:
            raise ValueError(f"unknown fault {fault!r}")


async def _phase(fault: str, injector: Injector, load: Load, redis: RedisProcess, tenant: str) -> tuple[dict, set[str]]:
    """(the phase's report, the keys of the stored turns no client has delivered, so far)"""
    t = injector.timings
    phase_started = time.monotonic()
    await asyncio.sleep(t.quiet_s)
    deadline = time.monotonic() + 60
    while not load.streaming() and time.monotonic() < deadline:  # inject while a stream is open
        await asyncio.sleep(0.05)
    before = await asyncio.to_thread(redis.turns, tenant)
    t0 = time.monotonic()
    await injector.inject(fault)
    injected_s = time.monotonic() - t0
    attempts = lambda: [a for c in load.clients for a in c.attempts]  # noqa: E731
    recovered = None
    while recovered is None and time.monotonic() - t0 < t.timeout_s:
        done = [a.ended for a in attempts() if a.started >= t0 + injected_s and a.outcome == "delivered"]
        recovered = min(done) if done else None
        await asyncio.sleep(0.5)
    await asyncio.sleep(t.settle_s)
    after = await asyncio.to_thread(redis.turns, tenant)
    delivered = set().union(*(c.delivered for c in load.clients))
    pending = {c.pending for c in load.clients if c.pending}
    return {"fault": fault, "injected_s": round(injected_s, 2),
            "recovery_s": None if recovered is None else round(recovered - t0, 2),
            **check(before, after, delivered, pending),
            **attempts_summary(attempts(), t0, time.monotonic()),
            "phase_s": round(time.monotonic() - phase_started, 1)}, undelivered_keys(after, delivered, pending)


APP_NAME = "macaron"
"""The application's name in the profiles' Serve config."""

KV_CHECK_PROMPT = ("Please tell me a few facts about Paris, the capital of France: what river runs through it, "
                   "which tower is its best known landmark, and which museum holds the Mona Lisa?")
"""A request whose greedy answer keeps wide margins between tokens: a KV recomputed on the decode
engine is not bit-exact with the prefill engine's (other batch shapes, CPU bf16), so token equality
is a fair check only where no near-tie decides the next token. The earlier prompt (a week's plan,
"which day is the busiest?") was answered token-equal by the agent until its 2026-12-07 retraining,
then diverged after eleven tokens with the recovery itself working (recomputed: 1)."""
KV_CHECK_TOKENS = 24
KV_CHECK_WAIT_S = 60.0
"""Bound on the KV-loss check's wait for the prefill engine to finish the disturbed turn's route hop
and prefill (under a second each on an idle machine), well inside the first-token deadline."""


def _restore_env(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class Rig:
    """Redis, the local topology on it, and (once started) the load: one fault after another.

    A context manager: `with Rig(profile) as rig: rig.phase("decode_kill")`. The load and the
    phases run on an event loop in a thread of their own, so the rig is driven from plain code
    (the CLI, or pytest).
    """

    sdk = False
    """The clients speak raw HTTP (a subclass may use the official SDKs)."""

    def __init__(self, profile: Path, *, conversations: int = 16, max_tokens: int = 24,
                 timings: Timings = Timings(), log_dir: Path = Path(".bench")):
        self.profile, self.conversations, self.max_tokens = Path(profile), conversations, max_tokens
        self.timings, self.log_dir = timings, Path(log_dir)
        self.tenant = tenant_id(API_KEY)
        self.deploy_s: float | None = None
        self.load: Load | None = None
        self._runner: concurrent.futures.Future | None = None
        self._undelivered: set[str] = set()
        self._leaks: set[str] = set()
        """What earlier phases reported, so that each phase reports only what is new."""

    def __enter__(self) -> "Rig":
        self._stack = contextlib.ExitStack()
        try:
            self._start(self._stack)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()  # in reverse: the load, the loop, the cluster, Redis, the env

    def _start(self, stack: contextlib.ExitStack) -> None:
        from macaron_ray.engine.local_server import free_port
        from macaron_ray.serve.args import load_profile
        from macaron_ray.serve.local_cluster import RAY_ENV, LocalRayCluster

        saved = {k: os.environ.get(k) for k in RAY_ENV}
        os.environ.update(RAY_ENV)
        stack.callback(_restore_env, saved)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        redis_dir = self.log_dir / "chaos-redis"
        shutil.rmtree(redis_dir, ignore_errors=True)
        self.redis = RedisProcess(redis_dir)
        self.redis.start()
        stack.callback(self.redis.stop)
        config = chaos_config(self.profile, self.log_dir / "chaos.yaml", port=self.port, redis_url=self.redis.url)
        self.args = load_profile(config)
        self.cluster = stack.enter_context(LocalRayCluster(log_path=self.log_dir / "chaos-ray.log"))
        started = time.monotonic()
        self.cluster.serve_deploy(config)
        self.wait_healthy()
        self.deploy_s = round(time.monotonic() - started, 1)
        self.private = tuple(s.adapter_id for s in self.args.registry().specialists) + (str(self.args.base_source()),)
        self._start_loop(stack)

    def _start_loop(self, stack: contextlib.ExitStack) -> None:
        """The event loop the load and the phases run on, in a thread of its own."""
        import threading

        self._loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._loop.run_forever, name="chaos-loop", daemon=True)
        thread.start()
        stack.callback(self._close_loop, thread)

    def _close_loop(self, thread) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        thread.join(30)
        if not thread.is_alive():
            self._loop.close()

    def _stop_load(self) -> None:
        self._loop.call_soon_threadsafe(self.load.stop)
        self._runner.result(600)  # clients finish the attempt they are in

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout_s: float = 900) -> None:
        self.cluster.wait_running(APP_NAME, self.args.deployment_names(), timeout_s=timeout_s)

    def _run(self, coro, timeout_s: float):
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()  # a phase that overran must not go on under the next one
            raise

    def _load_alive(self) -> None:
        if self._runner is not None and self._runner.done():
            self._runner.result()  # raises what stopped the clients
            raise RuntimeError("the load's clients stopped")

    def load_urls(self) -> list[str]:
        """Where the clients send their turns."""
        return [self.url]

    def injector(self, load: Load | None) -> "Injector":
        return Injector(self.cluster, self.redis, load, self.timings)

    def start_load(self) -> Load:
        if self.load is None:
            self.load = Load(self.load_urls(), self.args.public_model, self.conversations, self.max_tokens,
                             tenant=self.tenant, private=self.private, sdk=self.sdk)
            self._runner = asyncio.run_coroutine_threadsafe(self.load.run(), self._loop)
            self._stack.callback(self._stop_load)
        return self.load

    def phase(self, fault: str) -> dict:
        """One fault under the load, then the checks; returns once every deployment is healthy again.
        Undelivered turns and leaks are those not reported by an earlier phase."""
        load = self.start_load()
        t = self.timings
        bound = t.quiet_s + t.redis_down_s + t.stall_s + t.disconnect_s + t.timeout_s + t.settle_s + 120
        injector = self.injector(load)
        result, undelivered = self._run(_phase(fault, injector, load, self.redis, self.tenant), bound)
        self._load_alive()
        result["undelivered"] = len(undelivered - self._undelivered)
        result["leaks"] = sorted(load.scan.found - self._leaks)
        self._undelivered |= undelivered
        self._leaks |= load.scan.found
        started = time.monotonic()
        self.wait_healthy()
        result["healthy_again_s"] = round(time.monotonic() - started, 1)
        return result

    def prefill_lost_after_prefill(self) -> dict:
        """The KV-transfer loss check, on an idle topology (before the load starts): one answer
        undisturbed, then the same request from another tenant (its own `cache_salt`: nothing of
        the first is reused) with the decode engine stopped until the prefill engine that computed
        its KV has been killed. The decode engine can only pull that KV after the kill; vLLM's
        `kv_load_failure_policy: recompute` turns a failed pull into a local prefill. Returns both
        answers, and how often the decode engine logged that recovery."""
        if self.load is not None:
            raise RuntimeError("the KV-loss check runs before the load starts")
        injector = Injector(self.cluster, self.redis, timings=self.timings)

        def ask(key: str, request_id: str | None = None) -> str:
            body = {"model": self.args.public_model, "temperature": 0, "max_tokens": KV_CHECK_TOKENS,
                    "messages": [{"role": "user", "content": KV_CHECK_PROMPT}]}
            headers = {"authorization": f"Bearer {key}", **({"x-request-id": request_id} if request_id else {})}
            r = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=300, headers=headers)
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"]

        undisturbed = ask("kv-check-undisturbed")
        decode, prefill = injector.engine("Decode:base"), injector.engine("Prefill:base")
        request_id = f"kv-check-disturbed-{os.getpid()}-{time.time_ns()}"
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                decode.send_signal(signal.SIGSTOP)
                try:
                    disturbed = pool.submit(ask, "kv-check-disturbed", request_id)
                    # The route hop, then the answer's prefill: both on the prefill engine. Killed
                    # once the second is done, so the KV exists and only its transfer is lost.
                    self._wait_calls("Prefill:base", request_id, 2, disturbed)
                    prefill.send_signal(signal.SIGKILL)
                finally:
                    decode.send_signal(signal.SIGCONT)
                answer = disturbed.result(300)
        finally:
            self._wait_engine_replaced("Prefill:base", prefill.pid)
            self.wait_healthy()
        return {"undisturbed": undisturbed, "disturbed": answer, "equal": undisturbed == answer,
                "recomputed": self.decode_recovered_kv()}

    def calls_done(self, deployment: str, request_id: str) -> int:
        """Handle calls of request `request_id` that `deployment`'s replicas have finished, from
        Serve's access log on the replicas' stderr ("macaron_Prefill:base <replica> <request id> --
        CALL chat OK 12.3ms"): one line a call, written when its response is complete. Serve takes
        the request id from the client's `X-Request-ID` header and keeps it on every handle call."""
        tag = f"{APP_NAME}_{deployment} "
        return sum(1 for line in self._worker_log(".err").splitlines()
                   if tag in line and f" {request_id} -- CALL " in line and " OK " in line)

    def _wait_calls(self, deployment: str, request_id: str, count: int,
                    request: concurrent.futures.Future) -> None:
        """Until `deployment` has finished `count` calls of `request_id`; fails if `request` ends first."""
        deadline = time.monotonic() + KV_CHECK_WAIT_S
        while self.calls_done(deployment, request_id) < count:
            if request.done():
                request.result()  # raises what failed it
                raise RuntimeError(f"the request ended before {deployment} finished {count} of its calls")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{deployment} did not finish {count} calls within {KV_CHECK_WAIT_S:.0f} s")
            time.sleep(0.2)

    def _wait_engine_replaced(self, deployment: str, pid: int, timeout_s: float = 300) -> None:
        """Until `deployment` runs an engine other than `pid` (Serve notices a dead engine only at
        its next health checks: until then it still reports the replica healthy)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _, engines = deployment_processes(self.cluster.session_dir, deployment)
            if any(e.pid != pid and e.is_running() for e in engines):
                return
            time.sleep(1.0)
        raise TimeoutError(f"{deployment}'s engine was not replaced within {timeout_s:.0f} s")

    def decode_recovered_kv(self) -> int:
        """How many times the decode engine logged vLLM's "Recovered from KV load failure"."""
        return self._worker_log(".out", ".err").count("Recovered from KV load failure")

    def _worker_log(self, *suffixes: str) -> str:
        """What this cluster's Ray workers (replicas, engines) wrote to their `suffixes` files."""
        logs = Path(self.cluster.session_dir) / "logs"
        return "\n".join(path.read_text(errors="replace") for path in sorted(logs.glob("worker-*"))
                         if path.suffix in suffixes)


def run(profile: Path, out: Path, *, faults: tuple[str, ...] = FAULTS, conversations: int = 16,
        max_tokens: int = 24, timings: Timings = Timings(), log_dir: Path = Path(".bench")) -> dict:
    report: dict = {"profile": Path(profile).name, "conversations": conversations, "max_tokens": max_tokens,
                    "ingress_replicas": 2, "inter_token_deadline_s": INTER_TOKEN_S, "faults": []}
    with Rig(profile, conversations=conversations, max_tokens=max_tokens, timings=timings, log_dir=log_dir) as rig:
        report["deploy_s"] = rig.deploy_s
        report["kv_loss"] = rig.prefill_lost_after_prefill()
        out.write_text(json.dumps(report, indent=2) + "\n")
        for fault in faults:
            report["faults"].append(rig.phase(fault))
            out.write_text(json.dumps(report, indent=2) + "\n")
    load = rig.load
    all_attempts = [a for c in load.clients for a in c.attempts] if load else []
    report["totals"] = {**attempts_summary(all_attempts, 0.0, float("inf")),
                        "lost": sum(f["lost"] for f in report["faults"]),
                        "changed": sum(f["changed"] for f in report["faults"]),
                        "undelivered": sum(f["undelivered"] for f in report["faults"]),
                        "leaks": sorted(load.scan.found) if load else []}
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def format_report(report: dict) -> str:
    rows = [f"{'fault':<18} {'attempts':>8} {'delivered':>9} {'failed':>6} {'retries':>7} {'unclear':>7} "
            f"{'lost':>4} {'changed':>7} {'undeliv.':>8} {'recovery_s':>10}"]
    for f in report["faults"]:
        rows.append(f"{f['fault']:<18} {f['attempts']:>8} {f['delivered']:>9} {f['failed']:>6} {f['retries']:>7} "
                    f"{f['unclear']:>7} {f['lost']:>4} {f['changed']:>7} {f['undelivered']:>8} "
                    f"{'-' if f['recovery_s'] is None else f['recovery_s']:>10}")
    t = report.get("totals")
    if t:
        rows.append(f"{'total':<18} {t['attempts']:>8} {t['delivered']:>9} {t['failed']:>6} {t['retries']:>7} "
                    f"{t['unclear']:>7} {t['lost']:>4} {t['changed']:>7} {t['undelivered']:>8}")
    kv = report.get("kv_loss")
    if kv:
        rows.append(f"prefill killed after its prefill: answer token-equal to the undisturbed one: {kv['equal']} "
                    f"(decode recovered from a KV load failure {kv['recomputed']} time(s))")
    return "\n".join(rows)
