"""A vLLM general plugin (entry point `vllm.general_plugins`), run by vLLM in each engine process.

NIXL's Python API creates every agent with `pthrDelay = 0`. Its UCX backend's
progress thread then calls `poll()` with a zero timeout in a loop: a busy spin,
mostly in the kernel. On a CPU engine pinned to one core that spin starved every
other process on the core (a plain `python -c "while 1: pass"` got 0.05 s of CPU
in 10 s next to two NIXL engines, and `ray stop` could not start).

The thread cannot simply be dropped: with no progress thread an idle prefill
engine never drives UCX, and a decode engine's read of its KV cache never
completes. With a delay the same thread sleeps in `poll()` on UCX's event fds and
wakes on each event or after the delay (in NIXL's source the delay is `poll()`'s
timeout, rounded up to whole milliseconds), so transfers still progress when the
engine is idle.

`MACARON_NIXL_PROGRESS_DELAY_US=<microseconds>` in an engine's environment sets the
delay; processes without that variable (GPU profiles) are left as they are.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

ENV = "MACARON_NIXL_PROGRESS_DELAY_US"


class _BindingsWithDelay:
    """NIXL's compiled bindings, with every agent created with a progress-thread delay."""

    def __init__(self, bindings, delay_us: int):
        self._bindings = bindings
        self.delay_us = delay_us

    def __getattr__(self, name: str):
        return getattr(self._bindings, name)

    def nixlAgent(self, name, config):  # noqa: N802 - NIXL's own name
        config.pthrDelay = self.delay_us
        return self._bindings.nixlAgent(name, config)


def _log_handler() -> None:
    """vLLM's log lines, where its own logging setup is off (VLLM_CONFIGURE_LOGGING=0: its
    `dictConfig` would close the process's other handlers, Serve's among them; serve/args.py
    REPLICA_ENV): a stream handler on the `vllm` logger, added once, nothing else touched."""
    if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") != "0":
        return
    logger = logging.getLogger("vllm")
    if any(getattr(h, "macaron_vllm", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.macaron_vllm = True
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                                           "%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "INFO"))
    logger.propagate = False


def register() -> None:
    """Called by vLLM in every process that loads plugins; safe to call more than once."""
    _log_handler()
    value = os.environ.get(ENV)
    if not value:
        return
    delay_us = int(value)
    if delay_us <= 0:
        raise ValueError(f"{ENV} must be a positive number of microseconds, got {value!r}")
    try:
        api = importlib.import_module("nixl._api")
    except ImportError:
        return  # no NIXL in this environment: nothing to configure
    bindings = api.nixlBind
    if isinstance(bindings, _BindingsWithDelay):
        bindings.delay_us = delay_us
        return
    api.nixlBind = _BindingsWithDelay(bindings, delay_us)
