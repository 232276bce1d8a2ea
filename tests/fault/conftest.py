"""Fault tier: `macaron chaos` as tests, on one deployed topology for the tier (gone before the
next tier starts).

The local-cpu topology with two ingress replicas on a real Redis (AOF) runs 16 concurrent
conversations; each test injects one fault and checks the store and the clients' records.
The KV-loss check runs first, on the idle topology, before the load starts.
"""

from __future__ import annotations

import pytest

from macaron_ray import chaos
from macaron_ray.paths import PACKAGE_DIR

TIMINGS = chaos.Timings(quiet_s=5.0, settle_s=10.0, timeout_s=240.0, redis_down_s=30.0, stall_s=15.0,
                        disconnect_s=10.0)
"""Shorter than `macaron chaos`'s, to keep `make test` within its time: the stall still outlasts
the inter-token deadline (10 s), Redis is still down for 30 s."""


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/fault/" in str(item.fspath):
            item.add_marker(pytest.mark.fault)


@pytest.fixture(scope="package")
def rig(tmp_path_factory):
    with chaos.Rig(PACKAGE_DIR.parent / "deployments" / "local-cpu.yaml", conversations=16, max_tokens=16,
                   timings=TIMINGS, log_dir=tmp_path_factory.mktemp("chaos")) as running:
        running.kv_loss = running.prefill_lost_after_prefill()
        yield running
