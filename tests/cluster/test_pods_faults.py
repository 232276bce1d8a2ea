"""Node, network, head and Redis failures of the container cluster, one at a time, under 8
concurrent multi-turn conversations through the official SDKs (`macaron_ray.cluster.faults`, on
the fault tier's bookkeeping); then the cluster's memory under that load and a real Prometheus,
fed by Ray's service discovery, reading every dashboard query with the engines on their own nodes."""

from __future__ import annotations

import json
import time

import pytest

from macaron_ray.cluster import faults
from tests.cluster.conftest import docker

TIMINGS = faults.Timings(quiet_s=3.0, settle_s=5.0, timeout_s=240.0, partition_s=30.0)
"""The partition outlasts Serve's health checks (3 misses of 10 s): the partitioned replica is replaced."""


@pytest.fixture(scope="module")
def prometheus(pods, tmp_path_factory):
    """A real Prometheus on this machine, its targets from the head's service discovery file."""
    from tests.prometheus import PrometheusServer

    workdir = tmp_path_factory.mktemp("prometheus")
    sd = workdir / "ray_sd.json"
    # A link into the session's directory: read through it.
    sd.write_text(docker("exec", pods.plan.head.name, "cat", "/tmp/ray/prom_metrics_service_discovery.json").stdout)
    with PrometheusServer([], workdir, file_sd=sd) as prom:
        yield prom


@pytest.fixture(scope="module")
def rig(pods, prometheus):
    with faults.ContainerRig(pods, conversations=8, max_tokens=16, timings=TIMINGS) as running:
        yield running


@pytest.mark.parametrize("fault", faults.FAULTS)
def test_nothing_is_lost_when_a_pod_fails(rig, report, fault):
    result = rig.phase(fault)
    print(json.dumps(result))
    report["faults"].append(result)
    report["write"]()
    assert result["lost"] == 0 and result["changed"] == 0, result
    assert result["undelivered"] == 0, result
    assert result["leaks"] == [], result
    assert result["unclear"] == 0, result["unclear_examples"]
    # The clients' proxies (the api pods) never went away: Serve answered for every request.
    assert result["proxy_500"] == 0 and result["stream_cut"] == 0, result
    assert result["recovery_s"] is not None, f"no turn delivered within {TIMINGS.timeout_s} s: {result}"
    assert result["delivered"] > 0, result


def test_memory_of_the_cluster_idle_and_under_load(pods, rig, report):
    load = rig.start_load()
    time.sleep(10)
    under = pods.memory()
    idle = pods.idle_memory
    gib = lambda d: {k: round(v / 2**30, 2) for k, v in d.items()}  # noqa: E731
    print("memory idle (GiB):", gib(idle), "total", round(sum(idle.values()) / 2**30, 2))
    print("memory under load (GiB):", gib(under), "total", round(sum(under.values()) / 2**30, 2))
    report["memory_gib"] = {"idle": gib(idle), "under_load": gib(under), "idle_total": round(sum(idle.values()) / 2**30, 2),
                            "under_load_total": round(sum(under.values()) / 2**30, 2)}
    report["write"]()
    assert load.streaming() or any(c.attempts for c in load.clients)
    for pod in pods.plan.pods:  # within each pod's limit, with room to spare
        assert under[pod.name] < 0.9 * int(pod.memory), (pod.name, under[pod.name], pod.memory)


def test_prometheus_reads_every_dashboard_query_across_the_nodes(pods, prometheus, rig):
    from tests.prometheus import evaluate_every_panel

    rig.start_load()
    nodes = {p.ip for p in pods.plan.pods if p.group != "redis"}
    engines = {pods.plan.group("prefill")[0].ip, pods.plan.group("decode")[0].ip}
    # Every node scraped, and the engines' series from their own nodes: an engine replaced by an
    # earlier fault exports its series only once it has run and been scraped again.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        up = {r["metric"]["instance"].split(":")[0] for r in prometheus.query('up{job="ray"} == 1')}
        engine_nodes = {r["metric"].get("NodeAddress")
                        for r in prometheus.query("ray_vllm_num_requests_running")}
        if nodes <= up and engines <= engine_nodes:
            break
        time.sleep(2)
    assert nodes <= up, (nodes, up)
    assert engines <= engine_nodes, engine_nodes
    missing = evaluate_every_panel(prometheus, "5m")
    assert not missing, missing
