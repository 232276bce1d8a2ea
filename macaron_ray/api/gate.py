"""The gate every request passes before its body is read: key -> tenant, then the limits.

An ASGI middleware, so a refused request costs a header lookup, not a 32 MiB
read and a validation:

- auth: with a `KeyRing`, every path but /health needs a key (`Authorization:
  Bearer`, or `x-api-key` on /v1/messages); 401 otherwise. Without one, any key
  (or none) names its own tenant.
- per tenant: a token bucket of requests per second (429 `rate_limit_exceeded`)
  and a cap on turns at once, streams included (429 `too_many_concurrent_requests`);
  both with `Retry-After`.
- back-pressure: a cap on turns in flight in this replica (503 `overloaded` with
  `Retry-After`), below Serve's own `max_ongoing_requests`, so excess load is
  refused in the surface's envelope instead of queueing without bound.

Only the turn endpoints (POST chat completions, responses, messages) and
count_tokens (a tokenizer pass over up to a turn's body) are limited; reads of
stored responses and models are only authenticated.

A limited request's body is read here, after its rate token and before its
slots: a client that trickles its body holds no turn slot, and one that takes
longer than `Limits.body_read_s` gets a 408 (a body over the size limit, a 413).
The route reads the buffered body as it would the wire. A turn's slots are held
until its response (a stream: its last byte) is sent.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from starlette.datastructures import Headers

from macaron_ray.api.errors import APIError, count_rejection, error_response
from macaron_ray.api.keys import KeyRing
from macaron_ray.observability.metrics import MoLMetrics
from macaron_ray.store.base import named_tenant_id, tenant_id

TENANT_STATE = "macaron.tenant"
"""Where the gate leaves the request's tenant id (`scope["state"]`)."""
TURN_PATHS = frozenset({"/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"})
OPEN_PATHS = frozenset({"/health"})
MAX_TRACKED_TENANTS = 100_000
"""Rate buckets kept at once (least recently used dropped): a full bucket is the same as none."""


@dataclass(frozen=True)
class Limits:
    requests_per_s: float | None = None
    """Per tenant, sustained; None: no rate limit."""
    burst: int = 20
    """Per tenant: requests at once above the sustained rate (the bucket's size)."""
    concurrent_turns: int | None = None
    """Per tenant: turns (streams included) at once; None: no cap."""
    turns_in_flight: int | None = None
    """Per ingress replica: turns at once before new ones get 503 (back-pressure); None: no cap."""
    body_read_s: float | None = 30.0
    """A limited request's whole body must arrive within this (else 408); None: no deadline."""


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than the limit of {limit} bytes", code="request_too_large")


def presented_key(headers: Headers, *, anthropic: bool) -> str | None:
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
    if anthropic and headers.get("x-api-key"):
        key = headers["x-api-key"].strip()
    return key or None


def authenticate(keys: KeyRing | None, headers: Headers, path: str) -> str:
    """The tenant id of a request, or a 401."""
    key = presented_key(headers, anthropic=path.startswith("/v1/messages"))
    if keys is None:
        return tenant_id(key)
    tenant = keys.tenant_of(key)
    if tenant is None:
        raise APIError(401, "invalid API key" if key else "missing API key", code="invalid_api_key")
    return named_tenant_id(tenant)


class _Bucket:
    __slots__ = ("tokens", "at")

    def __init__(self, tokens: float, at: float):
        self.tokens, self.at = tokens, at


class Gate:
    def __init__(self, app, *, keys: KeyRing | None, limits: Limits, metrics: MoLMetrics,
                 body_limit_bytes: int = 32 * 1024 * 1024):
        self.app = app
        self.keys = keys
        self.limits = limits
        self.metrics = metrics
        self.body_limit_bytes = body_limit_bytes
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._tenant_turns: dict[str, int] = {}
        self._turns = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        path = scope["path"]
        try:
            headers = Headers(scope=scope)
            tenant = authenticate(self.keys, headers, path)
            turn = scope["method"] == "POST" and path in TURN_PATHS
            if turn:
                if self.limits.requests_per_s is not None:
                    self._take_token(tenant, self.limits.requests_per_s, self.limits.burst)
                receive = await self._buffered(receive, headers)
                if receive is None:
                    return  # the client left before its body was whole: no one to answer
                self._admit(tenant)
        except APIError as err:
            count_rejection(self.metrics, path, err)
            return await error_response(path, err)(scope, receive, send)
        scope.setdefault("state", {})[TENANT_STATE] = tenant
        if not turn:
            return await self.app(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            self._turns -= 1
            left = self._tenant_turns[tenant] - 1
            if left:
                self._tenant_turns[tenant] = left
            else:
                del self._tenant_turns[tenant]

    def _admit(self, tenant: str) -> None:
        """Take a turn's slots, or raise the 429/503 that says why not (nothing taken then). Its rate
        token was taken before its body was read."""
        lim = self.limits
        if lim.turns_in_flight is not None and self._turns >= lim.turns_in_flight:
            raise APIError(503, "The server is at capacity; retry the request shortly.", code="overloaded",
                           headers={"Retry-After": "1"})
        held = self._tenant_turns.get(tenant, 0)
        if lim.concurrent_turns is not None and held >= lim.concurrent_turns:
            raise APIError(429, f"Too many requests at once for this API key (at most {lim.concurrent_turns}); "
                                f"retry when one has finished.", code="too_many_concurrent_requests",
                           headers={"Retry-After": "1"})
        self._turns += 1
        self._tenant_turns[tenant] = held + 1

    async def _buffered(self, receive, headers: Headers):
        """Read the whole body within `body_read_s` and the size limit; a `receive` that gives it
        back, then hands on to the client's (a route listens there for the disconnect). None when
        the client disconnected first."""
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.body_limit_bytes:
            raise _too_large(self.body_limit_bytes)
        chunks, size = [], 0

        async def read() -> bool:
            nonlocal size
            while True:
                message = await receive()
                if message["type"] != "http.request":  # http.disconnect
                    return False
                size += len(message.get("body", b""))
                if size > self.body_limit_bytes:
                    raise _too_large(self.body_limit_bytes)
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    return True

        try:
            async with asyncio.timeout(self.limits.body_read_s):
                if not await read():
                    return None
        except TimeoutError:
            raise APIError(408, f"The request body did not arrive within {self.limits.body_read_s:g} s.",
                           code="request_timeout") from None
        body = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return replay

    def _take_token(self, tenant: str, rate: float, burst: int) -> None:
        now = time.monotonic()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(float(burst), now)
            if len(self._buckets) > MAX_TRACKED_TENANTS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(tenant)
            bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.at) * rate)
            bucket.at = now
        if bucket.tokens < 1.0:
            wait = math.ceil((1.0 - bucket.tokens) / rate)
            raise APIError(429, f"Rate limit reached for this API key ({rate:g} requests per second, bursts of "
                                f"{burst}); retry after {wait} s.", code="rate_limit_exceeded",
                           headers={"Retry-After": str(wait)})
        bucket.tokens -= 1.0
