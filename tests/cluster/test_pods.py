"""The chart's pods as containers (`macaron cluster up --containers` on values-cpu.yaml): each pod
runs as rendered, the Serve replicas land where the profile places them, the three surfaces answer
through the official SDKs on every proxy, and the KV cache crosses the network between the prefill
and the decode container over NIXL. Faults: test_pods_faults.py; PD vs aggregated:
test_pods_topologies.py."""

from __future__ import annotations

import json
import re
import time

import anthropic
import httpx
import openai

from tests.cluster.conftest import docker

PUBLIC = "Macaron-V1-Venti"


def test_each_pod_runs_as_the_chart_renders_it(pods):
    for pod in pods.plan.pods:
        config = json.loads(docker("inspect", pod.name).stdout)[0]
        host = config["HostConfig"]
        assert host["Memory"] == int(pod.memory), pod.name
        if pod.shm:
            assert host["ShmSize"] == int(pod.shm), pod.name
        env = dict(e.split("=", 1) for e in config["Config"]["Env"])
        assert all(env[k] == v for k, v in pod.env.items()), pod.name
        if pod.group != "redis":
            # KubeRay's own command, and the NIXL side channel on the pod's address (fieldRef status.podIP).
            assert pod.command[-1].endswith(env["KUBERAY_GEN_RAY_START_CMD"].split("; ", 1)[-1].split("done; ")[-1])
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == pod.ip == \
                config["NetworkSettings"]["Networks"]["macaron-cluster"]["IPAddress"]
    redis = pods.plan.group("redis")[0]
    assert json.loads(docker("inspect", redis.name).stdout)[0]["Config"]["User"] == "999:999"
    # The head runs GCS fault tolerance on the chart's Redis.
    head_env = pods.plan.head.env
    assert head_env["RAY_REDIS_ADDRESS"] == "macaron-redis:6379" and "--redis-password=$REDIS_PASSWORD" in \
        pods.plan.head.command[-1]


def test_the_head_service_reaches_the_dashboard_through_kuberays_selector(pods):
    """KubeRay keeps `<RayService>-head-svc` pointed at the serving cluster's head with the
    selector of common/service.go `BuildHeadServiceForRayService` -> `BuildServiceForHeadPod`, over
    the labels common/pod.go `labelPod` gives the pods from the chart's templates (modelled in
    macaron_ray.k8s). The runner has no Services: the pod that selector picks from the chart as
    rendered must be the head, and Ray's dashboard must answer there on the Service's port."""
    from macaron_ray import k8s
    from macaron_ray.cluster import containers

    rendered = k8s.render(k8s.load_values([containers.DEFAULT_VALUES]))
    rayservice = next(m.obj for m in rendered if m.kind == "RayService")
    cluster = f"{rayservice['metadata']['name']}-x7k2q"
    service = k8s.kuberay_head_service(rayservice, cluster=cluster)
    spec = rayservice["spec"]["rayClusterConfig"]
    groups = [("head", spec["headGroupSpec"], True)] + [(g["groupName"], g, False) for g in spec["workerGroupSpecs"]]
    selected = [name for name, group, head in groups
                if k8s.selects(service["spec"]["selector"], k8s.kuberay_pod_labels(group, cluster=cluster, head=head))]
    assert selected == ["head"], (service["spec"]["selector"], selected)
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "dashboard")
    [head] = pods.plan.group("head")
    version = httpx.get(f"http://{head.ip}:{port}/api/version", timeout=10)
    assert version.status_code == 200 and version.json()["ray_version"], version.text


def test_the_replicas_land_on_the_pods_the_profile_places_them_on(pods):
    apps = pods.applications()
    deployments = apps["macaron"]["deployments"]
    ips = {group: {p.ip for p in pods.plan.group(group)} for group in ("api", "prefill", "decode")}
    placed = {name: {r["node_ip"] for r in d["replicas"] if r["state"] == "RUNNING"} for name, d in deployments.items()}
    print(placed)
    assert placed == {"MoLIngress": ips["api"], "Prefill:base": ips["prefill"], "Decode:base": ips["decode"]}
    assert len(ips["api"]) == 2


def test_every_proxy_serves_the_three_surfaces_through_the_sdks(pods, report):
    timings = []
    for url in pods.serve_urls():
        with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0,
                           _strict_response_validation=True) as client:
            assert [m.id for m in client.models.list()] == [PUBLIC]
            raw = client.chat.completions.with_raw_response.create(model=PUBLIC, max_tokens=16, messages=[
                {"role": "user", "content": "Write a Python function that reverses a string."}])
            chat = raw.parse()
            assert chat.choices[0].message.content.strip() and chat.model == PUBLIC
            timings.append(raw.headers["server-timing"])
            response = client.responses.create(model=PUBLIC, input="Hi! How are you today?", max_output_tokens=16)
            assert response.output_text.strip()
        with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as claude:
            with claude.messages.stream(model=PUBLIC, max_tokens=16,
                                        messages=[{"role": "user", "content": "Say hello to Ana."}]) as stream:
                assert "".join(stream.text_stream).strip()
    print("Server-Timing:", timings)
    report["server_timing"] = timings
    report["write"]()
    for header in timings:  # each hop, timed where the ingress ran it
        hops = dict(re.findall(r"(\w+);dur=([0-9.]+)", header))
        assert {"route", "ttft", "answer", "total"} <= set(hops), header


def _nixl_bytes(pods) -> float:
    """vLLM's NIXL byte counter, as the decode node exports it (the side that pulls the KV)."""
    text = httpx.get(f"http://{pods.plan.group('decode')[0].ip}:8080/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ray_vllm_nixl_bytes_transferred_sum"))


def _sent_bytes(pods, group: str) -> int:
    """Bytes the pod's network interface has sent (the prefill side of the KV transfer)."""
    out = docker("exec", pods.plan.group(group)[0].name, "cat", "/sys/class/net/eth0/statistics/tx_bytes")
    return int(out.stdout)


def test_the_kv_cache_crosses_the_network_over_nixl(pods, report):
    """Both sides count the hand-over: the decode engine's NIXL counter and the prefill pod's
    interface. A long prompt's KV (23,040 bytes a token for this base) dwarfs the rest of the
    traffic the prefill pod sends for it (its one-token answer and the tokens of the route hop)."""
    time.sleep(15)  # earlier transfers reach Ray's exporter first (it reports every 10 s)
    before, sent_before = _nixl_bytes(pods), _sent_bytes(pods, "prefill")
    prompt = " ".join(f"Item {i}: a line of notes about the week's plans." for i in range(60))
    with openai.OpenAI(base_url=pods.serve_urls()[0] + "/v1", api_key="k", max_retries=0) as client:
        resp = client.chat.completions.create(model=PUBLIC, max_tokens=8, messages=[
            {"role": "user", "content": prompt + f" ({time.time_ns()}) Summarize these notes."}])
    tokens = resp.usage.prompt_tokens
    deadline = time.monotonic() + 90
    while (moved := _nixl_bytes(pods) - before) < 0.8 * tokens * 23040 and time.monotonic() < deadline:
        time.sleep(3)
    sent = _sent_bytes(pods, "prefill") - sent_before
    print(f"{tokens} prompt tokens: NIXL moved {moved:.0f} bytes (decode's counter); the prefill pod sent {sent} bytes")
    report["nixl"] = {"prompt_tokens": tokens, "nixl_bytes": moved, "prefill_sent_bytes": sent}
    report["write"]()
    assert moved >= 0.8 * tokens * 23040, (moved, tokens)
    assert sent >= moved, (sent, moved)
    failed = [line for line in httpx.get(f"http://{pods.plan.group('decode')[0].ip}:8080/metrics").text.splitlines()
              if line.startswith("ray_vllm_nixl_num_failed_transfers") and not line.endswith(" 0.0")]
    assert not failed, failed
