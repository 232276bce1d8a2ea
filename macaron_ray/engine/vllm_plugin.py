"""A vLLM general plugin (entry point `vllm.general_plugins`), run by vLLM in each engine process.

NIXL's agent starts a progress thread that polls its backends with no pause
(`pthrDelay = 0` in NIXL's Python API, which vLLM's NIXL worker uses as is).
The thread inherits the worker's core pinning, so on a CPU engine it takes about
half of the one core the engine computes on: decode steps through PD ran at
less than half their speed. vLLM's NIXL worker already checks its transfers and
notifications on every engine step, so CPU profiles run without that thread:
`MACARON_NIXL_PROGRESS_THREAD=0` in the engine's environment turns it off.
Nothing changes for processes without that variable (GPU profiles).
"""

from __future__ import annotations

import functools
import os
import sys

NIXL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"


def register() -> None:
    """Called by vLLM in every process that loads plugins; safe to call more than once."""
    if os.environ.get("MACARON_NIXL_PROGRESS_THREAD", "1") != "0":
        return
    from vllm.distributed import nixl_utils

    config = nixl_utils.nixl_agent_config
    if config is None or isinstance(config, functools.partial):
        return  # NIXL is not installed, or already done
    without_thread = functools.partial(config, enable_prog_thread=False)
    nixl_utils.nixl_agent_config = without_thread
    worker = sys.modules.get(NIXL_WORKER_MODULE)  # imported before the plugin ran: it holds its own name
    if worker is not None:
        worker.nixl_agent_config = without_thread
