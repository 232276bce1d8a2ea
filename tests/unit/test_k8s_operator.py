"""The chart as KubeRay's operator treats it (issue 36): what KubeRay v1.7.0 builds from the
rendered RayService and what it does on `helm upgrade`, which its CRD schema cannot show.

No cluster runs here: each test renders the chart with Helm's engine and applies the operator's
rule as `macaron_ray.k8s` models it from KubeRay's source (tag v1.7.0, ray-operator/controllers/ray/);
each docstring names the file and function. Kubernetes' and the transports' own rules are cited
where they, not KubeRay, decide.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from functools import cache

import pytest
import yaml

from macaron_ray import k8s
from macaron_ray.api.keys import KeyRing, hash_line

CHART = k8s.CHART_DIR
CLUSTER = "macaron-x7k2q"
"""The RayCluster the RayService made (`<RayService>-<5 random>`, utils.GenerateRayClusterName)."""
FIXED_PASSWORD = {"redis": {"auth": {"existingSecret": "macaron-redis-auth"}}}
"""A Redis password of the user's Secret: a generated one (and its checksum) differs per render."""


def merged(base: dict, *overlays: dict) -> dict:
    """`base` with each overlay merged over it as Helm merges `-f` files (maps key by key)."""
    out = copy.deepcopy(base)
    for overlay in overlays:
        for key, value in overlay.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
                else copy.deepcopy(value)
    return out


def values_of(name: str, *overlays: dict) -> dict:
    return merged(yaml.safe_load((CHART / name).read_text()), *overlays)


@cache
def _render(values_json: str) -> tuple[k8s.Manifest, ...]:
    return tuple(k8s.render(json.loads(values_json), namespace="llm"))


def render(values: dict) -> list[k8s.Manifest]:
    return copy.deepcopy(list(_render(json.dumps(values, sort_keys=True))))


def objs(manifests: list[k8s.Manifest], kind: str) -> list[dict]:
    return [m.obj for m in manifests if m.kind == kind]


def rayservice_of(manifests: list[k8s.Manifest]) -> dict:
    [rayservice] = objs(manifests, "RayService")
    return rayservice


def groups(rayservice: dict) -> list[tuple[dict, bool]]:
    """Each Ray group with whether it is the head."""
    spec = rayservice["spec"]["rayClusterConfig"]
    return [(spec["headGroupSpec"], True)] + [(g, False) for g in spec.get("workerGroupSpecs", [])]


def pod_labels(rayservice: dict) -> list[dict[str, str]]:
    """The labels of each group's pods as KubeRay sets them."""
    return [k8s.kuberay_pod_labels(g, cluster=CLUSTER, head=head) for g, head in groups(rayservice)]


def cluster_hash(values: dict) -> str:
    return k8s.kuberay_cluster_hash(rayservice_of(render(values))["spec"]["rayClusterConfig"])


def ray_containers(rayservice: dict) -> list[dict]:
    return [g["template"]["spec"]["containers"][0] for g, _ in groups(rayservice)]


VALUES_FILES = sorted(p.name for p in CHART.glob("values-*.yaml"))


# -- 1. the RayService's head Service has endpoints -------------------------------------------------


@pytest.mark.parametrize("name", VALUES_FILES)
def test_the_rayservice_head_service_selects_the_head_pod_and_only_it(name):
    """common/service.go `BuildHeadServiceForRayService` builds `<RayService>-head-svc` through
    `BuildServiceForHeadPod(ctx, rayCluster, nil, nil)`: its selector is `HeadServiceLabels`,
    `app.kubernetes.io/name: kuberay` included, whatever the pod template says, while
    common/pod.go `labelPod` lets the template override that label on the pods. The dashboard
    port-forward in NOTES and `ray job submit` go through this Service."""
    rayservice = rayservice_of(render(values_of(name)))
    service = k8s.kuberay_head_service(rayservice, cluster=CLUSTER)
    head, *workers = pod_labels(rayservice)
    assert k8s.selects(service["spec"]["selector"], head), (service["spec"]["selector"], head)
    assert not [w for w in workers if k8s.selects(service["spec"]["selector"], w)]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports["dashboard"] == 8265 and ports["client"] == 10001 and ports["gcs"] == 6379
    assert service["metadata"]["name"] == "macaron-head-svc"
    assert f"svc/{service['metadata']['name']} 8265:8265" in k8s.notes(values_of(name), namespace="llm")


KUBERAY_OWNED = {"app.kubernetes.io/name", "app.kubernetes.io/created-by"}


def _ray_pod_selectors(manifests: list[k8s.Manifest]) -> list[tuple[str, dict]]:
    """Every selector of the chart meant for Ray pods: PodMonitors, disruption budgets, and the
    Redis NetworkPolicy's peers."""
    found = [(f"PodMonitor/{o['metadata']['name']}", o["spec"]["selector"]) for o in objs(manifests, "PodMonitor")]
    found += [(f"PodDisruptionBudget/{o['metadata']['name']}", o["spec"]["selector"])
              for o in objs(manifests, "PodDisruptionBudget")]
    for policy in objs(manifests, "NetworkPolicy"):
        for rule in policy["spec"]["ingress"]:
            found += [(f"NetworkPolicy/{policy['metadata']['name']}", peer["podSelector"]) for peer in rule["from"]]
    return found


def _selected(selector: dict, labels: dict) -> bool:
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        ok = ok and labels.get(expr["key"]) in expr["values"]
    return ok


@pytest.mark.parametrize("name", ["values-tall-h20.yaml", "values-venti-b300.yaml"])
def test_the_charts_selectors_find_ray_pods_by_the_charts_own_label(name):
    """The labels are the pods' as common/pod.go `labelPod` sets them. The chart leaves
    `app.kubernetes.io/name` to KubeRay (item 1), so no selector of its own may rely on it or on
    another label KubeRay owns, nor on `ray.io/cluster` (a NewCluster upgrade runs two clusters)."""
    manifests = render(values_of(name))
    labels = pod_labels(rayservice_of(manifests))
    selectors = _ray_pod_selectors(manifests)
    assert {kind.split("/")[0] for kind, _ in selectors} == {"PodMonitor", "PodDisruptionBudget", "NetworkPolicy"}
    for where, selector in selectors:
        keys = set(selector.get("matchLabels", {})) | {e["key"] for e in selector.get("matchExpressions", [])}
        assert not keys & (KUBERAY_OWNED | {"ray.io/cluster"}), (where, keys)
        assert [l for l in labels if _selected(selector, l)], f"{where} selects no Ray pod"
    # The Redis NetworkPolicy admits every Ray pod, and each group is scraped by one monitor.
    [policy] = objs(manifests, "NetworkPolicy")
    peer = policy["spec"]["ingress"][0]["from"][0]["podSelector"]
    assert all(_selected(peer, l) for l in labels)
    monitors = [s for w, s in selectors if w.startswith("PodMonitor")]
    assert all(sum(_selected(m, l) for m in monitors) == 1 for l in labels)


# -- 2. `helm upgrade` of group sizes or tolerations reaches KubeRay --------------------------------


EXTRA_TOLERATION = {"key": "llm", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize("change", [
    {"nodeGroups": {"cpu": {"replicas": 3}}},
    {"nodeGroups": {"cpu": {"minReplicas": 2}}},
    {"nodeGroups": {"cpu": {"maxReplicas": 6}}},
    {"nodeGroups": {"h20": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                            EXTRA_TOLERATION]}}},
    {"nodeGroups": {"head": {"tolerations": [EXTRA_TOLERATION]}}},
], ids=["replicas", "minReplicas", "maxReplicas", "worker-tolerations", "head-tolerations"])
def test_a_change_of_group_sizes_or_tolerations_rolls_out(change):
    """rayservice_controller.go `shouldPrepareNewCluster` and `shouldUpdateCluster` act only when
    `isClusterSpecHashEqual` finds the spec changed, and the hash (utils
    `GenerateHashWithoutReplicasAndWorkersToDelete`) leaves out replicas, min/max replicas and
    tolerations. The chart puts them back into what is hashed (a checksum annotation on each pod
    template), so the change rolls out as a NewCluster upgrade instead of doing nothing."""
    base = values_of("values-tall-h20.yaml", FIXED_PASSWORD)
    changed = values_of("values-tall-h20.yaml", FIXED_PASSWORD, change)
    assert rayservice_of(render(base)) != rayservice_of(render(changed))  # the values reach the spec...
    assert cluster_hash(changed) != cluster_hash(base)  # ...and KubeRay sees it


def test_what_kuberay_applies_in_place_keeps_the_cluster():
    """The other side of the rule: a rerender of the same values and a change of the Serve config
    alone (`api.replicas`: serveConfigV2, applied in place) keep the hash, so no new cluster
    starts; with the autoscaler on, `replicas` is the autoscaler's and stays out of it."""
    base = values_of("values-tall-h20.yaml", FIXED_PASSWORD)
    assert k8s.kuberay_cluster_hash(rayservice_of(k8s.render(base))["spec"]["rayClusterConfig"]) == cluster_hash(base)
    assert cluster_hash(values_of("values-tall-h20.yaml", FIXED_PASSWORD, {"api": {"replicas": 4}})) == \
        cluster_hash(base)
    autoscaled = values_of("values-tall-h20.yaml", FIXED_PASSWORD, {"rayService": {"autoscaling": True}})
    assert cluster_hash(merged(autoscaled, {"nodeGroups": {"cpu": {"replicas": 3}}})) == cluster_hash(autoscaled)
    assert cluster_hash(merged(autoscaled, {"nodeGroups": {"cpu": {"maxReplicas": 6}}})) != \
        cluster_hash(autoscaled)


def test_the_cluster_hash_model_mutes_what_kuberay_mutes():
    """The model itself (utils `GenerateHashWithoutReplicasAndWorkersToDelete`): the muted fields
    change nothing, anything else does."""
    spec = rayservice_of(render(values_of("values-tall-h20.yaml", FIXED_PASSWORD)))["spec"]["rayClusterConfig"]
    muted = copy.deepcopy(spec)
    muted["workerGroupSpecs"][0].update(replicas=7, minReplicas=0, maxReplicas=9)
    muted["workerGroupSpecs"][1]["template"]["spec"]["tolerations"] = []
    muted["headGroupSpec"]["template"]["spec"]["schedulingGates"] = [{"name": "x"}]
    assert k8s.kuberay_cluster_hash(muted) == k8s.kuberay_cluster_hash(spec)
    seen = copy.deepcopy(spec)
    seen["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"] = "other:1"
    assert k8s.kuberay_cluster_hash(seen) != k8s.kuberay_cluster_hash(spec)


# -- 3. incremental upgrades: what KubeRay refuses, and where the API is -----------------------------


INCREMENTAL = {"rayService": {"upgradeStrategy": "NewClusterWithIncrementalUpgrade", "autoscaling": True,
                              "incrementalUpgrade": {"gatewayClassName": "istio"}}}


@pytest.mark.parametrize("change, message", [
    ({"rayService": {"autoscaling": False}}, "NewClusterWithIncrementalUpgrade needs rayService.autoscaling"),
    ({"rayService": {"incrementalUpgrade": {"stepSizePercent": 50, "maxSurgePercent": 25}}},
     "stepSizePercent (50) must not exceed maxSurgePercent (25)"),
    ({"rayService": {"incrementalUpgrade": {"gatewayClassName": ""}}}, "gatewayClassName is required"),
], ids=["no-autoscaler", "step-over-surge", "no-gateway-class"])
def test_incremental_upgrade_values_kuberay_refuses_fail_the_render(change, message):
    """utils/validation.go `ValidateRayServiceSpec` -> `ValidateClusterUpgradeOptions` refuses
    NewClusterWithIncrementalUpgrade without the Ray autoscaler, with stepSizePercent above
    maxSurgePercent, or without a gatewayClassName: the RayService would never start a cluster."""
    values = values_of("values-tall-h20.yaml", INCREMENTAL, change)
    with pytest.raises(k8s.ChartError) as exc:
        render(values)
    assert message in str(exc.value), str(exc.value)


@pytest.mark.parametrize("name", VALUES_FILES)
def test_the_ingress_and_notes_point_at_the_serve_service_kuberay_makes(name):
    """common/service.go `BuildServeService`: under NewCluster (and None) one Service,
    `<RayService>-serve-svc`, on the head container's port named `serve`."""
    values = values_of(name, {"api": {"ingress": {"enabled": True, "host": "llm.internal"}}})
    manifests = render(values)
    rayservice = rayservice_of(manifests)
    [ingress] = objs(manifests, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    head = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert backend == {"name": k8s.kuberay_serve_service_name(rayservice, cluster=CLUSTER),
                       "port": {"number": next(p["containerPort"] for p in head["ports"] if p["name"] == "serve")}}
    assert f"port-forward svc/{backend['name']} 8000:8000" in k8s.notes(values, namespace="llm")


def test_incremental_upgrade_sends_clients_to_kuberays_gateway_not_a_missing_service():
    """Under NewClusterWithIncrementalUpgrade `BuildServeService` names each serve Service after
    its RayCluster (`<RayCluster>-serve-svc`) and rayservice_controller.go `createGateway` /
    `reconcileHTTPRoute` route clients through the Gateway `<RayService>-gateway`: no Service
    `<RayService>-serve-svc` exists for an Ingress or a port-forward to reach."""
    values = values_of("values-tall-h20.yaml", INCREMENTAL)
    rayservice = rayservice_of(render(values))
    missing = "macaron-serve-svc"
    assert k8s.kuberay_serve_service_name(rayservice, cluster=CLUSTER) == f"{CLUSTER}-serve-svc" != missing
    text = k8s.notes(values, namespace="llm")
    assert f"svc/{missing}" not in text
    assert "gateway macaron-gateway" in text and "RayServiceIncrementalUpgrade" in text
    assert "activeServiceStatus.rayClusterName" in text  # how to find the serving cluster's Service
    with pytest.raises(k8s.ChartError, match="Gateway macaron-gateway"):
        render(merged(values, {"api": {"ingress": {"enabled": True}}}))


# -- 4. the ingress's tokenizer against a read-only model cache ------------------------------------


@pytest.mark.parametrize("name", VALUES_FILES)
def test_ray_containers_stay_offline_against_a_local_model_cache(name):
    """The ingress replicas load the base's tokenizer (`macaron_ray.api.tokens`,
    `AutoTokenizer.from_pretrained`) outside the engines' runtime_env, which alone sets
    HF_HUB_OFFLINE (`AppArgs.llm_config`); Ray's workers inherit the container's environment, and
    huggingface_hub reads HF_HUB_OFFLINE once at import (`huggingface_hub.constants`). With a
    mounted cache (models.hfHome) every Ray container must run offline; a value of the user's wins."""
    values = values_of(name)
    env = [{e["name"]: e.get("value") for e in c["env"]} for c in ray_containers(rayservice_of(render(values)))]
    if values.get("models", {}).get("hfHome"):
        assert all(e.get("HF_HUB_OFFLINE") == "1" and e["HF_HOME"] == values["models"]["hfHome"] for e in env)
        mine = merged(values, {"env": [{"name": "HF_HUB_OFFLINE", "value": "0"}]})
        for container in ray_containers(rayservice_of(render(mine))):
            assert [e.get("value") for e in container["env"] if e["name"] == "HF_HUB_OFFLINE"] == ["0"]
    else:
        assert all("HF_HUB_OFFLINE" not in e for e in env)  # the CPU image sets it itself


# -- 5. NIXL between nodes over GPU memory ---------------------------------------------------------


def _capabilities(container: dict) -> list[str]:
    return (container.get("securityContext") or {}).get("capabilities", {}).get("add", [])


def test_cross_node_nixl_over_gpu_memory_gets_rdma_devices_and_ipc_lock():
    """NIXL moves the KV cache with UCX; from GPU memory (kv_buffer_device: cuda) between nodes
    it needs an RDMA device in the pod and IPC_LOCK to pin (register) the memory, else UCX falls
    back to TCP through host staging or fails to register. Venti runs prefill and decode on
    different nodes: their groups get the devices and the capability, and a values file that
    drops them fails the render. Tall keeps both on one node; the CPU profile moves KV from CPU
    memory over TCP (UCX_TLS=tcp): neither needs them."""
    rayservice = rayservice_of(render(values_of("values-venti-b300.yaml")))
    by_group = {g.get("groupName", "head"): g["template"]["spec"]["containers"][0] for g, _ in groups(rayservice)}
    for group in ("b300-prefill", "b300-decode"):
        limits = by_group[group]["resources"]["limits"]
        assert set(limits) - {"cpu", "memory", "nvidia.com/gpu"}, (group, limits)
        assert "IPC_LOCK" in _capabilities(by_group[group])
    for drop in ({"extraResources": {}}, {"securityContext": {}}):
        values = values_of("values-venti-b300.yaml")
        values["nodeGroups"]["b300-decode"].update(copy.deepcopy(drop))
        with pytest.raises(k8s.ChartError, match="group b300-decode runs the decode engine"):
            render(values)
    for name in ("values-tall-h20.yaml", "values-cpu.yaml"):
        assert not [c for c in ray_containers(rayservice_of(render(values_of(name)))) if "IPC_LOCK" in _capabilities(c)]


# -- 6. a new Redis password reaches Redis and the Ray pods ----------------------------------------


def _secret_password(manifests: list[k8s.Manifest]) -> str:
    import base64

    [secret] = [o for o in objs(manifests, "Secret") if o["metadata"]["name"] == "macaron-redis-auth"]
    return base64.b64decode(secret["data"]["password"]).decode()


def test_a_new_redis_password_restarts_redis_and_rolls_the_ray_cluster():
    """Pods read a Secret when they start. The StatefulSet controller replaces Redis's pod only
    when its pod template changes, and KubeRay starts a new cluster only when the hash
    (`GenerateHashWithoutReplicasAndWorkersToDelete`, `shouldPrepareNewCluster`) changes: both
    templates carry a checksum of the password. Two renders without a cluster make two passwords
    (`helm template`), as a regenerated Secret does."""
    values = values_of("values-cpu.yaml")
    first, second = k8s.render(values), k8s.render(values)
    passwords = [_secret_password(m) for m in (first, second)]
    assert passwords[0] != passwords[1]
    for manifests, password in zip((first, second), passwords):
        checksum = hashlib.sha256(password.encode()).hexdigest()
        [redis] = objs(manifests, "StatefulSet")
        assert redis["spec"]["template"]["metadata"]["annotations"]["checksum/redis-auth"] == checksum
        for group, _ in groups(rayservice_of(manifests)):
            assert group["template"]["metadata"]["annotations"]["checksum/redis-auth"] == checksum
        assert password not in next(m.text for m in manifests if m.kind == "RayService")
    hashes = [k8s.kuberay_cluster_hash(rayservice_of(m)["spec"]["rayClusterConfig"]) for m in (first, second)]
    assert hashes[0] != hashes[1]
    # `helm uninstall` keeps the Secret beside the volume it kept; a reinstall reads it back.
    [secret] = [o for o in objs(first, "Secret") if o["metadata"]["name"] == "macaron-redis-auth"]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


# -- 7. what `helm upgrade` cannot change on the Redis StatefulSet ----------------------------------


STATEFULSET_MUTABLE = {"replicas", "ordinals", "template", "updateStrategy", "persistentVolumeClaimRetentionPolicy",
                       "minReadySeconds", "revisionHistoryLimit"}
"""Kubernetes' pkg/apis/apps/validation `ValidateStatefulSetUpdate`: any other spec field of a
StatefulSet is immutable, so an update that changes one is refused."""


@pytest.mark.parametrize("key, value", [("size", "20Gi"), ("storageClassName", "fast-ssd")])
def test_redis_persistence_changes_helm_cannot_apply_are_documented(key, value):
    """The change reaches only `volumeClaimTemplates`, which `ValidateStatefulSetUpdate` refuses
    to update: `helm upgrade` fails. The schema (what `helm install` users read) and k8s/README.md
    say so and how to apply it."""
    base = values_of("values-cpu.yaml", FIXED_PASSWORD)
    changed = values_of("values-cpu.yaml", FIXED_PASSWORD, {"redis": {"persistence": {key: value}}})
    [before], [after] = objs(render(base), "StatefulSet"), objs(render(changed), "StatefulSet")
    differing = {k for k in before["spec"].keys() | after["spec"].keys()
                 if before["spec"].get(k) != after["spec"].get(k)}
    assert differing == {"volumeClaimTemplates"} and not differing <= STATEFULSET_MUTABLE
    schema = json.loads((CHART / "values.schema.json").read_text())
    persistence = schema["properties"]["redis"]["properties"]["persistence"]
    for text in (persistence["description"], persistence["properties"][key]["description"]):
        assert "helm upgrade" in text and "immutable" in text, text
    readme = (CHART.parent / "README.md").read_text()
    assert "volumeClaimTemplates" in readme and "--cascade=orphan" in readme


# -- 8. the keys error names the keys file's format -------------------------------------------------


def test_a_missing_keys_secret_is_asked_for_in_the_keys_files_format():
    """The keys file `KeyRing.parse` reads is one `<tenant> sha256:<salt>:<hash>` line per key
    (`macaron keys new`), never comma-separated keys."""
    values = values_of("values-venti-b300.yaml", {"api": {"keys": {"existingSecret": ""}}})
    with pytest.raises(k8s.ChartError) as exc:
        render(values)
    message = str(exc.value)
    assert "comma" not in message
    form = re.search(r"one `(.+?)` line per key", message)
    assert form and form.group(1) == "<tenant> sha256:<salt>:<hash>", message
    assert "macaron keys new" in message
    assert KeyRing.parse(hash_line("acme", "k" * 32)).tenant_of("k" * 32) == "acme"
