"""Where the ingress finds the conversation store: `store.url`, or `store.url_env` (an env var, which
the Helm chart fills from a Secret), against a real redis-server that requires a password."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from redis.exceptions import AuthenticationError

from macaron_ray.core.conversation import TurnMeta
from macaron_ray.paths import PACKAGE_DIR
from macaron_ray.serve.app import _open_store, _redis_url
from macaron_ray.serve.args import AppArgs, StoreArgs, load_profile
from macaron_ray.store.base import tenant_id
from macaron_ray.store.redis import RedisStore
from tests.redis_server import redis_server

ENV = "MACARON_TEST_STORE_URL"
PASSWORD = "Zq7mW2xK9pL4vN8rT1sY6uB3cD5eF0gH"
"""Shaped like the chart's generated password (randAlphaNum 32)."""


@pytest.mark.parametrize("store", [
    {"kind": "sqlite"},
    {"kind": "sqlite", "path": "/tmp/state.db"},
    {"kind": "redis", "url": "redis://cache:6379/0"},
    {"kind": "redis", "url_env": "MACARON_STORE_URL"},
])
def test_store_args_accept_one_place_for_the_store(store):
    assert StoreArgs.model_validate(store).model_dump(exclude_unset=True) == store


@pytest.mark.parametrize("store, message", [
    ({"kind": "redis"}, "store.kind 'redis' needs store.url or store.url_env"),
    ({"kind": "redis", "url": "redis://cache:6379/0", "url_env": "MACARON_STORE_URL"},
     "store.url and store.url_env: set one, not both"),
    ({"kind": "sqlite", "url": "redis://cache:6379/0"}, "store.url is for redis; sqlite takes store.path"),
    ({"kind": "sqlite", "url_env": "MACARON_STORE_URL"}, "store.url_env is for redis; sqlite takes store.path"),
    ({"kind": "redis", "url_env": "MACARON-STORE-URL"}, "url_env\n  String should match pattern"),
    ({"kind": "redis", "url_env": "MACARON_STORE_URL", "urlenv": "X"}, "urlenv\n  Extra inputs are not permitted"),
])
def test_store_args_refuse_no_place_or_two(store, message):
    with pytest.raises(ValidationError) as exc:
        StoreArgs.model_validate(store)
    assert message in str(exc.value), str(exc.value)


def test_a_literal_url_is_used_as_it_is(monkeypatch):
    monkeypatch.setenv(ENV, "redis://elsewhere:6379/0")
    assert _redis_url(StoreArgs(kind="redis", url="redis://cache:6379/0")) == "redis://cache:6379/0"


def test_url_env_is_read_from_the_environment(monkeypatch):
    # A Secret made from a file (kubectl create secret --from-file) usually ends in a newline.
    monkeypatch.setenv(ENV, f"redis://:{PASSWORD}@cache:6379/0\n")
    assert _redis_url(StoreArgs(kind="redis", url_env=ENV)) == f"redis://:{PASSWORD}@cache:6379/0"


@pytest.mark.parametrize("value", [None, "", " \n"])
def test_an_unset_or_empty_url_env_fails_naming_the_variable(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    with pytest.raises(RuntimeError, match=f"the env var {ENV} is unset or empty"):
        _redis_url(StoreArgs(kind="redis", url_env=ENV))


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory):
    """A redis-server on loopback that requires PASSWORD, as the chart's internal Redis does; its port."""
    with redis_server(tmp_path_factory.mktemp("redis-auth"), "--requirepass", PASSWORD) as port:
        yield port


def _args_with_store(store: dict) -> AppArgs:
    args = load_profile(PACKAGE_DIR.parent / "deployments" / "local-cpu.yaml").model_dump(mode="json")
    return AppArgs.model_validate({**args, "store": store})


def test_open_store_connects_with_the_url_in_the_env_var(monkeypatch, redis_with_password):
    # The URL form the Helm chart puts in its Secret: redis://:PASSWORD@host:port/0.
    monkeypatch.setenv(ENV, f"redis://:{PASSWORD}@127.0.0.1:{redis_with_password}/0")
    args = _args_with_store({"kind": "redis", "url_env": ENV})

    async def scenario():
        store = _open_store(args)
        assert isinstance(store, RedisStore)
        t = tenant_id("key")
        assert await store.put_turn(t, "k1", TurnMeta(label="L2"))
        assert await store.get_turn(t, "k1") == TurnMeta(label="L2")
        await store.close()
        # The server really requires the password the env var carried.
        without = RedisStore(f"redis://127.0.0.1:{redis_with_password}/0")
        with pytest.raises(AuthenticationError):
            await without.get_turn(t, "k1")
        await without.close()
    asyncio.run(scenario())


def test_open_store_fails_before_connecting_when_the_env_var_is_missing(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(RuntimeError, match=f"store.url_env: the env var {ENV} is unset or empty"):
        _open_store(_args_with_store({"kind": "redis", "url_env": ENV}))
