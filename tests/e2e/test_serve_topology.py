"""The local-cpu profile on a real two-node Ray cluster: `ray start` + `serve deploy`, real vLLM engines, NIXL.

One cluster for the module, as `cluster/local-cpu.yaml` defines it: a head of
node type `cpu` (ingress) and a worker of node type `cpu-worker`
(prefill, which also runs the route and summary hops, and decode), both on this machine. The
tests run in file order on one deployment: placement, the API over HTTP, PD
outputs and NIXL transfers, a decode replica killed and restored, a real
Prometheus reading every dashboard query under a mixed load, and last the
aggregated profile deployed on the same cluster, whose outputs must equal PD's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import anthropic
import httpx
import openai
import pytest

from macaron_ray.engine.local_server import free_port
from macaron_ray.serve.args import AppArgs, load_profile, node_type_resource
from macaron_ray.cluster import ClusterSpec
from macaron_ray.serve.local_cluster import RAY_ENV, LocalRayCluster, serve_config_with

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = "Macaron-V1-Venti"
PROMPT = [{"role": "user", "content": "Write a function that adds two numbers."}]


def _config(src: str, out: Path, port: int) -> tuple[Path, AppArgs]:
    """The committed profile, with prefill/decode (or the answer engine) on the worker's node type
    and a conversation store of its own (the default file outlives the test session: turns it
    already holds would not be committed, nor summarized, again)."""
    worker = {"node_type": "cpu-worker"}
    serve_config_with(ROOT / "deployments" / src, out, port=port,
                      role_updates={"prefill": worker, "decode": worker, "answer": worker},
                      args_updates={"store": {"kind": "sqlite", "path": str(out.with_suffix(".db"))}})
    return out, load_profile(out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    with (LocalRayCluster(nodes=ClusterSpec.named("local-cpu").groups(), log_path=tmp / "ray.log") as running,
          mock.patch.dict(os.environ, RAY_ENV)):
        yield running


# What needs a Ray driver (a Serve handle, an actor) runs in a child process: a driver's io and
# gRPC threads outlive `ray.shutdown()`, and in the test process they raced the interpreter's exit
# (a segfault after every test had passed). The child prints its result, shuts Ray down and leaves
# with os._exit, as multiprocessing's children do, before that teardown.
DRIVER = """
import asyncio, json, os, sys

import ray

spec = json.loads(sys.argv[1])
ray.init(address=spec["address"], log_to_driver=False, logging_level="ERROR")


def greedy(deployment, models):
    from ray import serve
    from ray.serve.llm.openai_api_models import ChatCompletionRequest

    from macaron_ray.serve.handle_engine import sse_payloads

    handle = serve.get_deployment_handle(deployment, "macaron").options(stream=True)

    async def one(model):
        body = ChatCompletionRequest(model=model, messages=spec["prompt"], max_tokens=32, temperature=0.0,
                                     stream=True, logprobs=True, top_logprobs=5)
        tokens = []
        async for item in handle.chat.remote(body):
            for data in sse_payloads(item):
                if data == "[DONE]":
                    continue
                for choice in json.loads(data).get("choices") or ():
                    for entry in (choice.get("logprobs") or {}).get("content") or ():
                        tokens.append((entry["token"], {t["token"]: t["logprob"] for t in entry["top_logprobs"]}))
        return tokens

    return {name: asyncio.run(one(model)) for name, model in models.items()}


def usage(deployment, model, prompt, salt):
    # One streamed chat on the deployment, under `salt`: its usage chunk.
    from ray import serve
    from ray.serve.llm.openai_api_models import ChatCompletionRequest

    from macaron_ray.serve.handle_engine import sse_payloads

    handle = serve.get_deployment_handle(deployment, "macaron").options(stream=True)

    async def one():
        body = ChatCompletionRequest(model=model, messages=prompt, max_tokens=4, temperature=0.0, stream=True,
                                     stream_options={"include_usage": True}, cache_salt=salt)
        found = None
        async for item in handle.chat.remote(body):
            for data in sse_payloads(item):
                if data != "[DONE]" and json.loads(data).get("usage"):
                    found = json.loads(data)["usage"]
        return found

    return asyncio.run(one())


if spec["op"] == "greedy":
    result = greedy(spec["deployment"], spec["models"])
elif spec["op"] == "usage":
    result = usage(spec["deployment"], spec["model"], spec["prompt"], spec["salt"])
else:
    ray.kill(ray.get_actor(spec["actor"], namespace="serve"), no_restart=True)
    result = None
print(json.dumps(result), flush=True)
ray.shutdown()
os._exit(0)
"""


def _driver(cluster, op: str, timeout_s: float = 600, **spec):
    """Run DRIVER's `op` against the cluster in a child Python; its JSON result."""
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps({"op": op, "address": cluster.address, **spec})],
                         capture_output=True, text=True, timeout=timeout_s)  # RAY_ENV: `cluster` set it
    assert out.returncode == 0, out.stderr[-5000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pd(cluster, tmp_path_factory):
    """The local-cpu profile, deployed with `serve deploy`."""
    port = free_port()
    config, args = _config("local-cpu.yaml", tmp_path_factory.mktemp("pd") / "local-cpu.yaml", port)
    cluster.serve_deploy(config)
    cluster.wait_running("macaron", args.deployment_names(), timeout_s=900)
    return args, f"http://127.0.0.1:{port}"


Greedy = list[tuple[str, dict[str, float]]]
"""A greedy answer, token by token: each token with the engine's top-5 alternatives there."""


def _greedy(cluster, args: AppArgs, models: tuple[str, ...] = ("base", "L0", "L1", "L2", "L3")) -> dict[str, Greedy]:
    """Greedy answers of the base and each adapter from the answer deployment (Decode: through
    prefill, NIXL and decode; Answer: one engine), called through its Serve handle."""
    engine_models = {"base": args.base.served_name, **{a.label: a.adapter_id for a in args.adapter_list()}}
    return _driver(cluster, "greedy", deployment=args.deployment_name(args.answer_role()), prompt=PROMPT,
                   models={name: engine_models[name] for name in models})


def _text(tokens: Greedy) -> str:
    return "".join(token for token, _ in tokens)


@pytest.fixture(scope="module")
def pd_outputs(cluster, pd) -> dict[str, Greedy]:
    return _greedy(cluster, pd[0])


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
    assert args.deployment_name("router") not in placed  # its hops run on the prefill engine
    assert placed[args.deployment_name("prefill")] == {worker}
    assert placed[args.deployment_name("decode")] == {worker}


def test_the_deployed_profile_serves_the_api(pd):
    _, url = pd
    with openai.OpenAI(base_url=url + "/v1", api_key="k", _strict_response_validation=True,
                       max_retries=0) as client:
        assert [m.id for m in client.models.list()] == [PUBLIC]
        resp = client.chat.completions.create(model=PUBLIC, max_tokens=24, messages=[
            {"role": "user", "content": "Write a Python function that reverses a string."}])
    assert resp.model == PUBLIC
    assert resp.choices[0].message.content.strip()
    assert resp.usage.prompt_tokens > 0
    # A streamed turn through the Anthropic surface, on the same topology.
    with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as claude:
        msg = claude.messages.create(model=PUBLIC, max_tokens=16,
                                     messages=[{"role": "user", "content": "Say hello to my friend Ana."}])
    assert msg.content and msg.content[0].text.strip()


def test_every_adapter_is_applied_through_prefill_and_decode(pd_outputs):
    texts = {name: _text(tokens) for name, tokens in pd_outputs.items()}
    assert all(text.strip() for text in texts.values()), texts
    for label in ("L0", "L1", "L2", "L3"):
        assert texts[label] != texts["base"], f"{label} answered like the base through PD"


def _metric_sum(text: str, name: str) -> float | None:
    """Sum of a metric's samples over every label set (a counter may carry `_total`); None if absent."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if re.match(re.escape(name) + r"(_total)?[{ ]", line)]
    return sum(values) if values else None


def test_nixl_reports_successful_transfers(cluster, pd):
    # Ray exports each node's metrics on an interval: count, answer two requests, and wait for
    # the count to rise by at least two (one KV hand-over per request).
    def counts() -> tuple[float, float | None]:
        text = cluster.metrics_text()
        return (_metric_sum(text, "ray_vllm_nixl_xfer_time_seconds_count") or 0.0,
                _metric_sum(text, "ray_vllm_nixl_num_failed_transfers"))  # absent until one fails

    time.sleep(15)  # let earlier transfers reach the exporter first
    before, _ = counts()
    args, _ = pd
    _greedy(cluster, args, models=("L1", "L3"))
    deadline = time.monotonic() + 90
    after, failed = counts()
    while after < before + 2 and time.monotonic() < deadline:
        time.sleep(3)
        after, failed = counts()
    assert after >= before + 2, (before, after)
    assert not failed, failed


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Each sample of metric `name` (a counter with or without `_total`): its labels and value."""
    out = []
    for line in text.splitlines():
        match = re.match(re.escape(name) + r"(?:_total)?\{(.*)\} (\S+)$", line)
        if match:
            out.append((dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1))), float(match.group(2))))
    return out


def _engine_sum(cluster, deployment: str, metric: str) -> float:
    """`metric` of the vLLM engines of one Serve deployment, summed over its replicas (vLLM's series
    carry the replica's id; Serve's health gauge maps replica ids to deployments)."""
    text = cluster.metrics_text()
    replicas = {labels["replica"] for labels, _ in _samples(text, "ray_serve_deployment_replica_healthy")
                if labels.get("deployment") == deployment}
    return sum(value for labels, value in _samples(text, metric) if labels.get("ReplicaId") in replicas)


def _settled_sum(cluster, deployment: str, metric: str, quiet_s: float = 12, timeout_s: float = 120) -> float:
    """`_engine_sum` once it has not changed for `quiet_s` (Ray exports every few seconds)."""
    deadline = time.monotonic() + timeout_s
    value, since = _engine_sum(cluster, deployment, metric), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(2)
        now = _engine_sum(cluster, deployment, metric)
        if now != value:
            value, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return value
    raise TimeoutError(f"{metric} of {deployment} kept changing: {value}")


def test_cached_tokens_are_the_prefill_engines_prefix_cache_hits(cluster, pd):
    """Found by hand on 2026-12-07: the decode engine counted the KV that NIXL brought as cached,
    so a prompt never sent before reported all its tokens cached. Each answer's `cached_tokens` is
    now the prefill engine's own prefix-cache hits, read from its counter; a tenant's repeat hits,
    and another tenant's copy of the same prompt (another cache salt) hits nothing."""
    args, _ = pd
    prefill, decode = args.deployment_name("prefill"), args.deployment_name("decode")
    model = next(a.adapter_id for a in args.adapter_list() if a.label == "L2")
    prompt = [{"role": "user", "content": f"Write a Python function that sorts a list of {time.time_ns()} "
                                          "names by their length, then alphabetically, and explain it briefly."}]
    hits = _settled_sum(cluster, prefill, "ray_vllm_prefix_cache_hits")
    seen = []
    for salt in ("tenant-a", "tenant-a", "tenant-b"):
        usage = _driver(cluster, "usage", deployment=decode, model=model, prompt=prompt, salt=salt)
        now = _settled_sum(cluster, prefill, "ray_vllm_prefix_cache_hits")
        seen.append((usage["prompt_tokens_details"]["cached_tokens"], now - hits, usage["prompt_tokens"]))
        hits = now
    print("cached_tokens, prefill hits, prompt tokens:", seen)
    for cached, prefill_hits, _ in seen:
        assert cached == prefill_hits
    (first, _, prompt_tokens), (repeat, _, _), (other, _, _) = seen
    assert first == 0 and other == 0
    block = args.engine_kwargs_for("prefill")["block_size"]
    assert prompt_tokens - block <= repeat < prompt_tokens  # every whole block but the last token's


def _abandon(url: str, words: int = 3) -> None:
    """A streamed chat turn with a long answer, left after its first few words."""
    body = {"model": PUBLIC, "max_tokens": 400, "stream": True, "temperature": 0.7,
            "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and a storm."}]}
    seen = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as resp:
        for line in resp.iter_lines():
            if '"content":"' in line.replace(" ", "") and '"content":""' not in line.replace(" ", ""):
                seen += 1
                if seen >= words:
                    break


def assert_abandoned_answers_stop_decoding(cluster, url: str, deployment: str) -> None:
    """A client that walks away: its engine request is aborted, not decoded to `max_tokens`. The
    engine's own counters: no request left running, and far fewer tokens generated than the
    answer would have taken (400 at most; the few delivered plus about a second's worth)."""
    generated = _settled_sum(cluster, deployment, "ray_vllm_generation_tokens")
    _abandon(url)
    assert _settled_sum(cluster, deployment, "ray_vllm_num_requests_running") == 0
    after = _settled_sum(cluster, deployment, "ray_vllm_generation_tokens")
    print(f"{deployment}: {after - generated:.0f} tokens generated for an answer abandoned after 3 words")
    assert after - generated < 200, (generated, after)  # half the answer's budget, on these CPU engines


def test_an_abandoned_answer_frees_the_decode_engine(cluster, pd):
    args, url = pd
    assert_abandoned_answers_stop_decoding(cluster, url, args.deployment_name("decode"))


def test_a_forced_call_then_its_result_is_answered_through_serve(pd):
    """The tool round trip of the standalone tier, through PD and the Serve handles."""
    _, url = pd
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    msgs = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        first = client.chat.completions.create(model=PUBLIC, messages=msgs, tools=[weather], tool_choice="required",
                                               max_tokens=64)
        calls = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls" and len(calls) == 1
        msgs += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temp_c": 22, "sky": "sunny"}'}]
        second = client.chat.completions.create(model=PUBLIC, messages=msgs, tools=[weather], max_tokens=48)
    message = second.choices[0].message
    assert (message.content or "").strip() or message.tool_calls, second


def _deployment_running(cluster, name: str) -> int:
    deployment = cluster.serve_status()["applications"]["macaron"]["deployments"][name]
    return sum(r["state"] == "RUNNING" for r in deployment["replicas"])


def test_a_dead_decode_replica_gets_503_then_is_restarted(cluster, pd):
    from ray.util.state import list_actors

    args, url = pd
    decode = args.deployment_name("decode")
    replica = next(a for a in list_actors(address=cluster.dashboard_url, filters=[("state", "=", "ALIVE")])
                   if a.class_name == f"ServeReplica:macaron:{decode}")
    _driver(cluster, "kill", actor=replica.name)

    deadline = time.monotonic() + 60
    while _deployment_running(cluster, decode) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _deployment_running(cluster, decode) == 0
    time.sleep(2)  # the ingress refreshes its view of Serve every 0.5 s

    private = [decode, *(a.adapter_id for a in args.adapter_list()), args.base_source(), "Decode", "base"]
    body = {"model": PUBLIC, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello there"}]}
    openai_resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert openai_resp.status_code == 503, openai_resp.text
    assert openai_resp.headers["retry-after"]
    assert openai_resp.json()["error"]["type"] == "server_error"
    anthropic_resp = httpx.post(url + "/v1/messages", json=body, timeout=30,
                                headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    assert anthropic_resp.status_code == 503 and anthropic_resp.headers["retry-after"]
    assert anthropic_resp.json()["error"]["type"] == "overloaded_error"
    for resp in (openai_resp, anthropic_resp):
        for name in private:
            assert name not in resp.text and name not in str(resp.headers), name

    # Serve replaces the replica; the same turn then goes through.
    cluster.wait_running("macaron", args.deployment_names(), timeout_s=600)
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text


def _settled(prom, expr: str, quiet_s: float = 12, timeout_s: float = 90) -> float:
    """The value of `expr` once it has not changed for `quiet_s` (Ray exports every few seconds)."""
    deadline = time.monotonic() + timeout_s
    value, since = prom.scalar(expr), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(2)
        now = prom.scalar(expr)
        if now != value:
            value, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return value
    raise TimeoutError(f"{expr} kept changing: {value}")


CONVERSATIONS = {
    "chat": ("Write a Python function that reverses a string.", "Now make it ignore spaces.",
             "Book a table for two at 8 tonight."),
    "responses": ("Why is the sky blue?", "Draw a bar chart card of my weekly steps.", "Thanks, that helps!"),
    "messages": ("Send a message to Ana that I am late.", "Also remind me to call her at 6.",
                 "Write a SQL query that counts users by country."),
}


def _converse(url: str, surface: str, timings: list[dict]) -> int:
    """One multi-turn conversation through one surface's SDK; returns the turns delivered."""
    turns = CONVERSATIONS[surface]
    if surface == "messages":
        with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as claude:
            history = []
            for text in turns:
                history.append({"role": "user", "content": text})
                raw = claude.messages.with_raw_response.create(model=PUBLIC, max_tokens=12, messages=history)
                timings.append(dict(raw.headers))
                history.append({"role": "assistant", "content": raw.parse().content[0].text})
        return len(turns)
    with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        if surface == "chat":
            history = []
            for text in turns:
                history.append({"role": "user", "content": text})
                raw = client.chat.completions.with_raw_response.create(model=PUBLIC, max_tokens=12,
                                                                        messages=history)
                timings.append(dict(raw.headers))
                history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        else:
            previous = None
            for text in turns:
                raw = client.responses.with_raw_response.create(model=PUBLIC, input=text, max_output_tokens=12,
                                                                previous_response_id=previous)
                timings.append(dict(raw.headers))
                previous = raw.parse().id
    return len(turns)


def test_prometheus_reads_every_dashboard_query_under_a_mixed_load(cluster, pd, tmp_path):
    """A real Prometheus scrapes every node's Ray metrics port while three conversations (one per
    surface) run at once and one client abandons a stream: the hop histograms count exactly the
    turns sent, and every query of every dashboard returns a series."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.prometheus import PrometheusServer, evaluate_every_panel

    _, url = pd
    count = "sum(ray_macaron_{}_count)".format
    with PrometheusServer([f"127.0.0.1:{port}" for port in cluster.metrics_ports], tmp_path) as prom:
        # Every turn ends delivered (counted in turn_seconds) or rolled back (here only by disconnect).
        ended = f'{count("turn_seconds")} + (sum(ray_macaron_rollbacks_total{{cause="client_disconnect"}}) or vector(0))'
        before = {hop: _settled(prom, count(hop)) for hop in ("turn_seconds", "route_hop_seconds")}
        ended_before = _settled(prom, ended)
        timings: list[dict] = []
        with ThreadPoolExecutor(3) as pool:
            delivered = sum(pool.map(lambda surface: _converse(url, surface, timings), CONVERSATIONS))
        # A client that walks away after the first words of a long answer: a rollback.
        body = {"model": PUBLIC, "max_tokens": 400, "stream": True,
                "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as resp:
            assert "route" in resp.headers["server-timing"]
            next(line for line in resp.iter_lines() if '"content":"' in line.replace(" ", "")
                 and '"content":""' not in line.replace(" ", ""))
        assert delivered == 9 and len(timings) == delivered
        for headers in timings:
            assert {"route", "ttft", "answer", "total"} <= set(re.findall(r"([a-z]+);dur=", headers["server-timing"]))
            assert "x-macaron-specialist" not in headers
        # The abandoned turn is rolled back when Serve's proxy passes the disconnect on to the ingress
        # before the answer ends; if the answer ended first, it was delivered and committed. Either
        # way it is counted exactly once, and every turn sent was routed exactly once.
        assert prom.wait_for(ended, ended_before + delivered + 1, timeout_s=240) >= ended_before + delivered + 1
        assert _settled(prom, ended) == ended_before + delivered + 1
        assert prom.scalar(count("turn_seconds")) - before["turn_seconds"] in (delivered, delivered + 1)
        assert prom.scalar(count("route_hop_seconds")) == before["route_hop_seconds"] + delivered + 1
        assert prom.targets_up()
        # Idle engines: Ray's agent drops a gauge ~20 s after its last record (vLLM records on engine
        # steps only); the dashboards read a gauge's last report in the window, so they still have data.
        time.sleep(45)
        missing = evaluate_every_panel(prom, "10m")
        if missing:  # what the engine panels join, to tell a missing metric from a missing join key
            from macaron_ray.observability.dashboards import REPLICA_DEPLOYMENT
            seen = {expr: [r["metric"] for r in prom.query(expr)]
                    for expr in ("ray_vllm_num_requests_running", REPLICA_DEPLOYMENT)}
            pytest.fail(f"panels without data: {missing}; series: {json.dumps(seen)[:4000]}")


def assert_greedy_equal(pd: Greedy, aggregated: Greedy, *, tie_nats: float = 0.25) -> str:
    """Equal token for token, or, at the first difference, a numerical tie: both tokens within
    `tie_nats` of each other in both engines' logprobs. bf16 logits near 16 are 0.0625 apart, and
    a prompt computed in another GEMM shape (decode recomputes the tail that NIXL does not carry)
    rounds differently; an adapter missing on one side moves logprobs by whole nats. After such a tie the texts differ, so the
    comparison stops there. Returns "equal" or the position of the tie."""
    for i, ((pd_token, pd_top), (agg_token, agg_top)) in enumerate(zip(pd, aggregated)):
        if pd_token == agg_token:
            continue
        for top in (pd_top, agg_top):
            assert pd_token in top and agg_token in top, (i, pd_token, agg_token, pd_top, agg_top)
            assert abs(top[pd_token] - top[agg_token]) <= tie_nats, (i, pd_token, agg_token, top)
        return f"tie at token {i}"
    assert len(pd) == len(aggregated)
    return "equal"


@pytest.fixture(scope="module")
def aggregated(cluster, pd, pd_outputs, tmp_path_factory):
    """The aggregated profile, deployed on the same cluster in place of PD (after PD's tests). Serve's
    HTTP proxy keeps the port it started with: the application answers on PD's URL."""
    _, url = pd
    config, args = _config("local-cpu-aggregated.yaml", tmp_path_factory.mktemp("agg") / "aggregated.yaml",
                           int(url.rsplit(":", 1)[1]))
    cluster.serve_deploy(config)
    cluster.wait_running("macaron", args.deployment_names(), timeout_s=900)
    return args, url


def test_pd_output_equals_the_aggregated_topology_token_for_token(cluster, pd_outputs, aggregated):
    args, _ = aggregated
    assert _replica_nodes(cluster)[args.deployment_name("answer")] == {node_type_resource("cpu-worker")}
    aggregated = _greedy(cluster, args)
    verdicts = {name: assert_greedy_equal(pd_outputs[name], aggregated[name]) for name in pd_outputs}
    print("PD vs aggregated:", verdicts)
    # Ties are rare: most answers must match to the last token.
    assert sum(v == "equal" for v in verdicts.values()) >= 4, verdicts


def test_an_abandoned_answer_frees_the_aggregated_engine(cluster, aggregated):
    args, url = aggregated
    assert_abandoned_answers_stop_decoding(cluster, url, args.deployment_name("answer"))
