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
