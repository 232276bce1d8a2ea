"""The vLLM plugin that turns NIXL's progress thread off for CPU engines, and only for them."""

from __future__ import annotations

import pytest

from macaron_ray.engine import vllm_plugin


@pytest.fixture
def nixl_utils(monkeypatch):
    from vllm.distributed import nixl_utils

    if nixl_utils.nixl_agent_config is None:
        pytest.fail("nixl is installed by `make install`; vLLM could not import it")
    monkeypatch.setattr(nixl_utils, "nixl_agent_config", nixl_utils.nixl_agent_config)  # restored afterwards
    return nixl_utils


def test_progress_thread_stays_on_without_the_variable(nixl_utils, monkeypatch):
    monkeypatch.delenv("MACARON_NIXL_PROGRESS_THREAD", raising=False)
    vllm_plugin.register()
    assert nixl_utils.nixl_agent_config(num_threads=4).enable_pthread is True


def test_the_variable_turns_the_progress_thread_off_once(nixl_utils, monkeypatch):
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    monkeypatch.setattr(base_worker, "nixl_agent_config", base_worker.nixl_agent_config)
    monkeypatch.setenv("MACARON_NIXL_PROGRESS_THREAD", "0")
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM may load plugins more than once in a process
    config = nixl_utils.nixl_agent_config(num_threads=4, capture_telemetry=True)
    assert config.enable_pthread is False and config.num_threads == 4
    # vLLM's NIXL worker took its own reference at import: that one is replaced too.
    assert base_worker.nixl_agent_config(num_threads=1).enable_pthread is False
