"""One fault at a time under load: nothing committed is lost or changed, nothing undelivered is
stored, every failure is a clear retryable error, nothing private leaks, and the service recovers
by itself within the phase's bound (`TIMINGS.timeout_s`)."""

from __future__ import annotations

import pytest

from macaron_ray import chaos
from tests.fault.conftest import TIMINGS


def test_a_prefill_engine_killed_after_its_prefill_still_yields_the_same_answer(rig):
    """The decode engine was stopped before the request and resumed after the prefill engine's
    SIGKILL: it pulled the KV from a dead engine (or recomputed it) and still answers token-equal."""
    kv = rig.kv_loss
    print(kv)
    assert kv["undisturbed"].strip(), kv
    assert kv["equal"], kv
    assert kv["recomputed"] >= 1, "the decode engine did not log vLLM's recovery from a failed KV load"


@pytest.mark.parametrize("fault", chaos.FAULTS)
def test_nothing_is_lost_under_the_fault(rig, fault):
    result = rig.phase(fault)
    print(result)
    assert result["lost"] == 0 and result["changed"] == 0, result
    assert result["undelivered"] == 0, result
    assert result["leaks"] == [], result
    assert result["unclear"] == 0, result["unclear_examples"]
    if fault != "ingress_kill":  # only a dead ingress replica leaves Serve's proxy to answer for it
        assert all(result[kind] == 0 for kind in chaos.INGRESS_DEATH), result
    assert result["recovery_s"] is not None, f"no turn delivered within {TIMINGS.timeout_s} s of the fault: {result}"
