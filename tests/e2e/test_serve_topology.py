"""The local-cpu profile on a real two-node Ray cluster: `ray start` + `serve deploy`, real vLLM engines, NIXL.

One cluster for the module, as `cluster/local-cpu.yaml` defines it: a head of
node type `cpu` (ingress, router) and a worker of node type `cpu-worker`
(prefill, decode), both on this machine. The
tests run in file order on one deployment: placement, the API over HTTP, PD
outputs and NIXL transfers, a decode replica killed and restored, and last the
aggregated profile deployed on the same cluster, whose outputs must equal PD's.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import yaml

from macaron_ray.core.engine_client import EngineRequest
from macaron_ray.engine.local_server import free_port
from macaron_ray.serve.args import AppArgs, load_profile, node_type_resource
from macaron_ray.cluster import ClusterSpec
from macaron_ray.serve.local_cluster import RAY_ENV, LocalRayCluster

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = "Macaron-V1-Venti"
PROMPT = [{"role": "user", "content": "Write a function that adds two numbers."}]


def _config(src: str, out: Path, port: int) -> tuple[Path, AppArgs]:
    """The committed profile, with prefill/decode (or the answer engine) on the worker's node type."""
    doc = yaml.safe_load((ROOT / "deployments" / src).read_text())
    doc["http_options"]["port"] = port
    args = doc["applications"][0]["args"]
    for role in ("prefill", "decode", "answer"):
        if role in args:
            args[role]["node_type"] = "cpu-worker"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out, AppArgs.model_validate(args)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import os

    import ray

    tmp = tmp_path_factory.mktemp("cluster")
    with LocalRayCluster(nodes=ClusterSpec.named("local-cpu").groups(), log_path=tmp / "ray.log") as running:
        os.environ.update(RAY_ENV)
        ray.init(address=running.address, log_to_driver=False, logging_level="ERROR")
        try:
            yield running
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def pd(cluster, tmp_path_factory):
    """The local-cpu profile, deployed with `serve deploy`."""
    port = free_port()
    config, args = _config("local-cpu.yaml", tmp_path_factory.mktemp("pd") / "local-cpu.yaml", port)
    cluster.serve_deploy(config)
    cluster.wait_running("macaron", args.deployment_names(), timeout_s=900)
    return args, f"http://127.0.0.1:{port}"


def _greedy_outputs(args: AppArgs) -> dict[str, str]:
    """Greedy answers of the base and each adapter through the answer deployment's handle (the
    production EngineClient over Serve)."""
    import asyncio

    from ray import serve

    from macaron_ray.serve.handle_engine import ServeHandleEngine

    engine = ServeHandleEngine(serve.get_deployment_handle(args.deployment_name(args.answer_role()), "macaron"))

    async def one(model: str) -> str:
        parts = [d.text async for d in engine.stream(EngineRequest(adapter=model, messages=PROMPT, max_tokens=32))]
        return "".join(parts)

    models = {"base": args.base.served_name, **{a.label: a.adapter_id for a in args.adapter_list()}}
    return {name: asyncio.run(one(model)) for name, model in models.items()}


@pytest.fixture(scope="module")
def pd_outputs(pd):
    return _greedy_outputs(pd[0])


def _replica_nodes(cluster) -> dict[str, set[str]]:
    """Deployment -> the node types its live replicas run on."""
    from ray.util.state import list_actors, list_nodes

    node_types = {}
    for node in list_nodes(address=cluster.dashboard_url, detail=True):
        types = {k for k in node.resources_total if k.startswith("macaron_node_")}
        node_types[node.node_id] = types
    placed: dict[str, set[str]] = {}
    for actor in list_actors(address=cluster.dashboard_url, filters=[("state", "=", "ALIVE")], limit=1000):
        match = re.fullmatch(r"ServeReplica:macaron:(.+)", actor.class_name)
        if match:
            placed.setdefault(match.group(1), set()).update(node_types[actor.node_id])
    return placed


def test_deployments_land_on_the_node_types_the_profile_asks_for(cluster, pd):
    args, _ = pd
    placed = _replica_nodes(cluster)
    head, worker = node_type_resource("cpu"), node_type_resource("cpu-worker")
    assert placed["MoLIngress"] == {head}
    assert placed[args.deployment_name("router")] == {head}
    assert placed[args.deployment_name("prefill")] == {worker}
    assert placed[args.deployment_name("decode")] == {worker}


def test_the_deployed_profile_serves_the_api(pd):
    _, url = pd
    client = openai.OpenAI(base_url=url + "/v1", api_key="k", _strict_response_validation=True, max_retries=0)
    assert [m.id for m in client.models.list()] == [PUBLIC]
    resp = client.chat.completions.create(model=PUBLIC, max_tokens=24, messages=[
        {"role": "user", "content": "Write a Python function that reverses a string."}])
    assert resp.model == PUBLIC
    assert resp.choices[0].message.content.strip()
    assert resp.usage.prompt_tokens > 0
    # A streamed turn through the Anthropic surface, on the same topology.
    msg = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0).messages.create(
        model=PUBLIC, max_tokens=16, messages=[{"role": "user", "content": "Say hello to my friend Ana."}])
    assert msg.content and msg.content[0].text.strip()


def test_every_adapter_is_applied_through_prefill_and_decode(pd_outputs):
    assert all(text.strip() for text in pd_outputs.values()), pd_outputs
    assert pd_outputs["L2"] != pd_outputs["base"]


def _metric_sum(text: str, name: str) -> float | None:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    return sum(values) if values else None


def test_nixl_reports_successful_transfers(cluster, pd_outputs):
    # Ray exports the engines' metrics on an interval: wait for the transfers above to show.
    deadline = time.monotonic() + 90
    transfers = failed = None
    while time.monotonic() < deadline:
        text = httpx.get(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10).text
        transfers = _metric_sum(text, "ray_vllm_nixl_xfer_time_seconds_count")
        failed = _metric_sum(text, "ray_vllm_nixl_num_failed_transfers_total")
        if transfers and transfers >= len(pd_outputs):
            break
        time.sleep(3)
    assert transfers is not None and transfers >= len(pd_outputs), transfers
    assert not failed


def _deployment_running(cluster, name: str) -> int:
    app = cluster.serve_status()["applications"]["macaron"]
    return app["deployments"][name]["replica_states"].get("RUNNING", 0) if "deployments" in app else 0


def test_a_dead_decode_replica_gets_503_then_is_restarted(cluster, pd):
    import ray
    from ray.util.state import list_actors

    args, url = pd
    decode = args.deployment_name("decode")
    replica = next(a for a in list_actors(address=cluster.dashboard_url, filters=[("state", "=", "ALIVE")])
                   if a.class_name == f"ServeReplica:macaron:{decode}")
    ray.kill(ray.get_actor(replica.name, namespace="serve"), no_restart=True)

    deadline = time.monotonic() + 60
    while _deployment_running(cluster, decode) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _deployment_running(cluster, decode) == 0
    time.sleep(2)  # the ingress refreshes its view of Serve every 0.5 s

    body = {"model": PUBLIC, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello there"}]}
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert resp.status_code == 503, resp.text
    assert resp.headers["retry-after"]
    assert resp.json()["error"]["type"] == "server_error"
    resp = httpx.post(url + "/v1/messages", json={**body, "messages": body["messages"]}, timeout=30,
                      headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert resp.status_code == 503 and resp.headers["retry-after"]
    assert resp.json()["error"]["type"] == "overloaded_error"
    assert decode not in resp.text and "base" not in resp.json()["error"]["message"]

    # Serve replaces the replica; the same turn then goes through.
    cluster.wait_running("macaron", args.deployment_names(), timeout_s=600)
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text


def test_pd_output_equals_the_aggregated_topology_token_for_token(cluster, pd, pd_outputs, tmp_path):
    config, args = _config("local-cpu-aggregated.yaml", tmp_path / "aggregated.yaml", free_port())
    cluster.serve_deploy(config)
    cluster.wait_running("macaron", args.deployment_names(), timeout_s=900)
    assert _replica_nodes(cluster)[args.deployment_name("answer")] == {node_type_resource("cpu-worker")}
    assert _greedy_outputs(args) == pd_outputs
