"""`macaron cluster up --containers` reads the rendered chart as KubeRay and the kubelet would:
the ray start command from rayStartParams, KubeRay's env, GCS fault tolerance, Secrets, fieldRefs,
`$(VAR)` in args, memory, CPU and /dev/shm. No Docker here: the plan only."""

from __future__ import annotations

import pytest

from macaron_ray.cluster import containers
from macaron_ray.cluster.containers import Plan, convert_params, render_plan


@pytest.fixture(scope="module")
def plan() -> Plan:
    return render_plan([containers.DEFAULT_VALUES], ["redis.auth.existingSecret="], image="img:1",
                       redis_image="img:1")


def test_ray_start_flags_are_built_as_kuberay_builds_them():
    assert convert_params({"num-cpus": "4", "block": "true", "dashboard-host": "0.0.0.0", "no-monitor": "false",
                           "include-dashboard": "false"}) == \
        "--block --dashboard-host=0.0.0.0 --include-dashboard=false --num-cpus=4"


def test_the_pods_of_values_cpu(plan):
    assert [(p.name, p.group) for p in plan.pods] == [
        ("macaron-redis-0", "redis"), ("macaron-head", "head"), ("macaron-api-0", "api"), ("macaron-api-1", "api"),
        ("macaron-prefill-0", "prefill"), ("macaron-decode-0", "decode")]
    assert len({p.ip for p in plan.pods}) == len(plan.pods)
    head, api = plan.head, plan.group("api")[0]
    assert head.aliases == ["macaron-head-svc"]
    assert head.command[:3] == ["/bin/bash", "-lc", "--"]
    assert head.command[-1].startswith("ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; ray start --head --block ")
    assert "--num-cpus=0" in head.command[-1] and "--redis-password=$REDIS_PASSWORD" in head.command[-1]
    assert "--address=macaron-head-svc:6379" in api.command[-1]
    assert api.command[-1].startswith("until ray health-check --address macaron-head-svc:6379")  # wait-gcs-ready
    assert head.memory == str(3 * 2**30) and head.cpus == "1" and head.shm == str(2**30)


def test_env_resolves_secrets_field_refs_and_what_kuberay_adds(plan):
    redis, head, decode = plan.group("redis")[0], plan.head, plan.group("decode")[0]
    password = redis.env["REDISCLI_AUTH"]
    assert len(password) >= 16
    assert decode.env["MACARON_STORE_URL"] == f"redis://:{password}@macaron-redis:6379/0"
    assert decode.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == decode.ip
    assert decode.env["RAY_gcs_rpc_server_reconnect_timeout_s"] == "600" and "RAY_REDIS_ADDRESS" not in decode.env
    assert head.env["RAY_REDIS_ADDRESS"] == "macaron-redis:6379" and head.env["REDIS_PASSWORD"] == password
    assert head.env["RAY_external_storage_namespace"] == "macaron"
    # Kubernetes expands $(VAR) in args: the password reaches redis-server's --requirepass.
    assert redis.command[redis.command.index("--requirepass") + 1] == password
    assert redis.user == "999:999" and redis.read_only and redis.volumes == {"macaron-redis-0-data": "/data"}
    assert set(redis.aliases) == {"macaron-redis", "macaron-redis-headless"}


def test_what_this_runner_cannot_resolve_is_refused_by_name(plan):
    with pytest.raises(containers.ClusterError, match="fieldRef spec.nodeName"):
        plan._env({"env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}, "1.2.3.4", "p")
    with pytest.raises(containers.ClusterError, match="secretKeyRef mine/url"):
        plan._env({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "mine", "key": "url"}}}]},
                  "1.2.3.4", "p")


def test_run_args_carry_the_pod_spec(plan):
    args = plan.group("decode")[0].run_args("macaron")
    assert args[args.index("--ip") + 1] == plan.group("decode")[0].ip
    assert args[args.index("--memory") + 1] == str(4 * 2**30) and args[args.index("--cpus") + 1] == "2"
    assert args[args.index("--restart") + 1] == "unless-stopped"
    assert f"{containers.LABEL}=macaron" in args
    assert args[-6:-1] == ["--entrypoint", "/bin/bash", "img:1", "-lc", "--"]
