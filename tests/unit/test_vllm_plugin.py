"""The vLLM plugin that gives NIXL's progress thread a delay: a real NIXL agent (UCX backend),
created the way vLLM's NIXL worker creates it, with and without the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from macaron_ray.engine import vllm_plugin

# Creates one agent as vLLM does, then prints the share of one core the process used while idle.
PROBE = """
import time
from macaron_ray.engine import vllm_plugin
vllm_plugin.register()
vllm_plugin.register()  # vLLM may load plugins more than once in a process
from vllm.distributed import nixl_utils
agent = nixl_utils.NixlWrapper("probe", nixl_utils.nixl_agent_config(backends=["UCX"]))
time.sleep(0.3)
cpu, wall = time.process_time(), time.monotonic()
time.sleep(2.0)
print((time.process_time() - cpu) / (time.monotonic() - wall))
"""


def _idle_cpu_share(delay_us: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != vllm_plugin.ENV}
    if delay_us is not None:
        env[vllm_plugin.ENV] = delay_us
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return float(out.stdout.strip().splitlines()[-1])


def test_an_idle_agent_spins_without_the_delay_and_sleeps_with_it():
    spinning = _idle_cpu_share(None)
    sleeping = _idle_cpu_share("1000")
    # NIXL's own default polls with a zero timeout: about one core, doing nothing.
    assert spinning > 0.5, spinning
    assert sleeping < spinning / 4, (sleeping, spinning)


def test_a_bad_delay_is_refused(monkeypatch):
    monkeypatch.setenv(vllm_plugin.ENV, "0")
    with pytest.raises(ValueError, match="positive number of microseconds"):
        vllm_plugin.register()


def test_replicas_keep_vllm_off_their_logging_and_its_lines_keep_a_handler(monkeypatch):
    """vLLM's dictConfig closed Serve's log handler in each replica; a restarted Serve controller
    then replaced every replica (found on the container cluster, issue 32)."""
    import logging

    from macaron_ray.serve.app import ingress_deployment
    from macaron_ray.serve.args import REPLICA_ENV, load_profile
    from macaron_ray.paths import PACKAGE_DIR
    from macaron_ray.engine import vllm_plugin

    args = load_profile(PACKAGE_DIR.parent / "deployments" / "local-cpu.yaml")
    assert REPLICA_ENV == {"VLLM_CONFIGURE_LOGGING": "0"}
    for role in args.roles():
        assert args.llm_config(role).runtime_env["env_vars"]["VLLM_CONFIGURE_LOGGING"] == "0"
    assert ingress_deployment(args).ray_actor_options["runtime_env"]["env_vars"] == REPLICA_ENV
    logger = logging.getLogger("vllm")
    saved = list(logger.handlers), logger.propagate, logger.level
    try:
        logger.handlers = []
        monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "1")
        vllm_plugin.register()
        assert logger.handlers == []  # vLLM configures itself
        monkeypatch.setenv("VLLM_CONFIGURE_LOGGING", "0")
        vllm_plugin.register()
        vllm_plugin.register()
        assert len(logger.handlers) == 1 and not logger.propagate
    finally:
        logger.handlers, logger.propagate = saved[0], saved[1]
        logger.setLevel(saved[2])
