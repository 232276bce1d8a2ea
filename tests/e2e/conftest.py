"""End-to-end tier: real vLLM CPU engines on the real base model and the committed adapters."""

from __future__ import annotations

from pathlib import Path

import pytest

from macaron_ray.engine.local_server import LocalEngineSpec, LocalVLLMServer, free_port
from macaron_ray.model.prepare import prepare_base_model


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def base_model_dir() -> Path:
    return prepare_base_model()


@pytest.fixture(scope="module")
def engine(base_model_dir, tmp_path_factory) -> LocalVLLMServer:
    """One engine per module (base + L0..L3, pinned to both cores), so that it is gone before the
    Ray topology tests need the cores and the memory."""
    log = tmp_path_factory.mktemp("engine") / "vllm.log"
    spec = LocalEngineSpec.from_manifest(base_model_dir, port=free_port(), cores="0-1")
    server = LocalVLLMServer(spec, log_path=log)
    try:
        server.start()
    except Exception:
        print(log.read_text()[-5000:])
        raise
    yield server
    server.stop()
