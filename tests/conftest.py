"""Shared fixtures: a real redis-server on loopback, started per session."""

from __future__ import annotations

import pytest

from tests.redis_server import redis_server


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    with redis_server(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"
