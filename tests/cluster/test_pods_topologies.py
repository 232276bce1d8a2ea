"""PD across containers against the aggregated topology: greedy answers of the base and every
adapter, token for token (or a numerical tie), first through the prefill pod, NIXL over the network
and the decode pod, then from one engine after the aggregated Serve config is submitted to the same
cluster the way KubeRay submits a changed serveConfigV2. Last in the tier: it replaces the PD app."""

from __future__ import annotations

import copy
import json

from macaron_ray.serve.args import AppArgs
from tests.cluster.conftest import docker
from tests.e2e.test_serve_topology import DRIVER, PROMPT, assert_greedy_equal

MODELS = ("base", "L0", "L1", "L2", "L3")


def _greedy(pods, args: AppArgs) -> dict:
    """Greedy answers from the answer deployment's Serve handle, driven from inside an api pod."""
    engine_models = {"base": args.base.served_name, **{a.label: a.adapter_id for a in args.adapter_list()}}
    spec = {"op": "greedy", "address": "auto", "deployment": args.deployment_name(args.answer_role()),
            "prompt": PROMPT, "models": {name: engine_models[name] for name in MODELS}}
    out = docker("exec", "-i", pods.plan.group("api")[0].name, "python", "-", json.dumps(spec),
                 input_text=DRIVER, timeout_s=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _aggregated_config(config: dict) -> dict:
    """The rendered Serve config with one engine on the decode pod and the router on the prefill pod
    (deployments/local-cpu-aggregated.yaml's engines, on this cluster's nodes)."""
    config = copy.deepcopy(config)
    args = config["applications"][0]["args"]
    for key in ("prefill", "decode", "kv_connector", "kv_buffer_device"):
        args.pop(key, None)
    args.update(disaggregated=False, profile="local-cpu-cluster-aggregated",
                router={"cpu_cores": "0", "kv_cache_gib": 0.125, "node_type": "prefill"},
                answer={"cpu_cores": "1", "kv_cache_gib": 0.375, "node_type": "decode",
                        "engine_kwargs": {"enforce_eager": True}})
    return config


def test_pd_across_containers_equals_the_aggregated_topology(pods, report):
    pd_args = AppArgs.model_validate(pods.plan.serve_config["applications"][0]["args"])
    pd = _greedy(pods, pd_args)
    config = _aggregated_config(pods.plan.serve_config)
    pods.plan.serve_config = config
    pods.deploy()
    pods.wait_all_running(timeout_s=600)
    agg_args = AppArgs.model_validate(config["applications"][0]["args"])
    assert set(pods.applications()["macaron"]["deployments"]) == {"MoLIngress", "Router:base", "Answer:base"}
    aggregated = _greedy(pods, agg_args)
    verdicts = {name: assert_greedy_equal(pd[name], aggregated[name]) for name in MODELS}
    print("PD across containers vs aggregated:", verdicts)
    report["pd_vs_aggregated"] = verdicts
    report["write"]()
    assert all("".join(t for t, _ in pd[name]).strip() for name in MODELS)
    assert sum(v == "equal" for v in verdicts.values()) >= 4, verdicts
