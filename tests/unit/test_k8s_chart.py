"""The KubeRay Helm chart (k8s/macaron), rendered by Helm's own engine (helm-python-sdk: Helm v4's Go
SDK in its wheel) and checked against what consumes each object: KubeRay v1.7.0's CRDs (their
openAPIV3Schema, strict) and the admission rules KubeRay's operator applies, Kubernetes' OpenAPI
schemas (kubernetes-validate, strict), prometheus-operator's CRD models, and for the Serve config Ray
Serve's ServeDeploySchema and AppArgs. Nothing is installed: there is no cluster here.

Each check has a negative test below proving it can fail.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from macaron_ray import k8s
from macaron_ray.api.keys import KeyRing, hash_line
from macaron_ray.cluster.spec import ClusterSpec, ContainerResources, NodeGroup
from macaron_ray.serve.args import AppArgs, node_type_resource
from macaron_ray.serve.validate import IMPORT_PATH, engine_world_size

ROOT = Path(__file__).resolve().parents[2]
CHART = k8s.CHART_DIR
KUBERAY_CRDS = ROOT / "tests" / "schemas" / "kuberay-v1.7.0"
"""KubeRay's published CRDs, vendored (their README says from where)."""
VALUES_FILES = sorted(CHART.glob("values-*.yaml"))
KUBE_VERSIONS = ("1.29.0", "1.37.0")
"""The chart's oldest Kubernetes (Chart.yaml kubeVersion) and the newest kubernetes-validate ships."""
SERVE_PORT = 8000
REDIS_PORT = 6379
STORE_URL_ENV = "MACARON_STORE_URL"
"""The env var the chart gives every Ray container the conversation store's URL in (args.store.url_env)."""

KEY_LINES = [hash_line("acme", "a" * 32), hash_line("bravo", "b" * 32)]
"""A keys file's lines (salted hashes), as `macaron keys new` prints them."""


# -- rendering ----------------------------------------------------------------------------------


def values_of(name: str) -> dict:
    return yaml.safe_load((CHART / name).read_text())


@cache
def _render(values_json: str, release: str) -> tuple[k8s.Manifest, ...]:
    return tuple(k8s.render(json.loads(values_json), release=release, namespace="llm"))


def render(values: dict, release: str = "macaron") -> list[k8s.Manifest]:
    """The chart's objects for these values (rendered once per distinct values; each caller gets its own copy)."""
    return copy.deepcopy(list(_render(json.dumps(values, sort_keys=True), release)))


def with_values(values: dict, **paths) -> dict:
    """A copy of values with `a__b__c=value` set at a.b.c."""
    out = copy.deepcopy(values)
    for path, value in paths.items():
        *parents, leaf = path.split("__")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def one(manifests: list[k8s.Manifest], kind: str) -> dict:
    found = [m.obj for m in manifests if m.kind == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def kinds(manifests: list[k8s.Manifest]) -> list[str]:
    return sorted(m.kind for m in manifests)


def serve_config(manifests: list[k8s.Manifest]) -> dict:
    return yaml.safe_load(one(manifests, "RayService")["spec"]["serveConfigV2"])


def macaron_args(config: dict) -> dict:
    return next(app["args"] for app in config["applications"] if app["import_path"] == IMPORT_PATH)


def ray_groups(rayservice: dict) -> dict[str, dict]:
    """Group name -> group spec, the head group under "<head>"."""
    spec = rayservice["spec"]["rayClusterConfig"]
    head = dict(spec["headGroupSpec"], groupName=None)
    return {"<head>": head, **{g["groupName"]: g for g in spec.get("workerGroupSpecs", [])}}


def ray_containers(rayservice: dict) -> list[dict]:
    return [g["template"]["spec"]["containers"][0] for g in ray_groups(rayservice).values()]


def profile_doc(values: dict) -> dict:
    return yaml.safe_load((ROOT / "deployments" / f"{values['profile']}.yaml").read_text())


def test_there_is_a_values_file_per_target_and_each_names_its_profile():
    assert {p.name: values_of(p.name)["profile"] for p in VALUES_FILES} == {
        "values-cpu.yaml": "local-cpu-cluster", "values-tall-h20.yaml": "tall-h20", "values-venti-b300.yaml": "venti-b300"}


def test_the_chart_reads_the_project_files_through_links_not_copies():
    # A copy could drift from the profile the project validates; a link cannot.
    for link, target in (("profiles", "deployments"), ("clusters", "cluster"), ("dashboards", "dashboards")):
        path = CHART / link
        assert path.is_symlink() and path.resolve() == (ROOT / target).resolve(), link


def test_the_packaged_chart_carries_the_linked_files_and_renders_the_same(tmp_path):
    import tarfile

    import helm_python as helm

    archive = helm.package(CHART, destination=tmp_path)
    members = {m.name: m for m in tarfile.open(archive).getmembers()}
    for name, source in (("profiles/venti-b300.yaml", "deployments/venti-b300.yaml"),
                         ("clusters/b300.yaml", "cluster/b300.yaml"),
                         ("dashboards/alerts.yaml", "dashboards/alerts.yaml")):
        member = members[f"macaron/{name}"]
        assert member.isfile() and tarfile.open(archive).extractfile(member).read() == (ROOT / source).read_bytes()
    assert not [n for n in members if "provisioning" in n or n.endswith("alerts_test.yaml")]  # .helmignore
    # A Redis password of the Secret's own: a generated one differs from render to render.
    values = with_values(values_of("values-venti-b300.yaml"), redis__auth__existingSecret="macaron-redis-auth")
    assert k8s.render(values, chart_dir=Path(archive)) == k8s.render(values)


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_helm_lint_strict_passes(path):
    messages = k8s.lint(values_of(path.name))
    assert k8s.lint_failures(messages) == []


def test_helm_lint_fails_on_what_helm_refuses():
    failures = k8s.lint_failures(k8s.lint(with_values(values_of("values-cpu.yaml"), api__replcas=2)))
    assert any("replcas" in m.message for m in failures), failures


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_every_object_is_named_once_and_labelled(path):
    manifests = render(values_of(path.name))
    keys = [(m.kind, m.name) for m in manifests]
    assert len(keys) == len(set(keys)), keys
    for m in manifests:
        labels = m.obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/instance") == "macaron", (m.kind, m.name)
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", (m.kind, m.name)


# -- KubeRay's CRDs and admission rules -----------------------------------------------------------


def _strict(schema):
    """An openAPIV3Schema that refuses unknown fields (the API server would prune them silently),
    as kubeconform's strict mode does: every object that lists properties allows no others."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def crd_validator(plural: str):
    import jsonschema

    path = KUBERAY_CRDS / f"ray.io_{plural}.yaml"
    assert path.exists(), f"the KubeRay v1.7.0 CRDs are vendored in {KUBERAY_CRDS}"
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def crd_problems(obj: dict, plural: str) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in crd_validator(plural).iter_errors(obj)]


QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def kuberay_admission_problems(rayservice: dict) -> list[str]:
    """What KubeRay v1.7's operator refuses beyond the CRD schema (utils/validation.go:
    ValidateRayServiceMetadata, ValidateRayServiceSpec, ValidateRayClusterSpec)."""
    problems = []
    name = rayservice["metadata"]["name"]
    if len(name) > 47 or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        problems.append(f"RayService name {name!r}: a DNS-1035 label of at most 47 characters")
    spec = rayservice["spec"]
    cluster = spec["rayClusterConfig"]
    groups = [("Head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster.get("workerGroupSpecs", [])]
    for group_name, group in groups:
        params = group.get("rayStartParams", {})
        if not group["template"]["spec"].get("containers"):
            problems.append(f"{group_name}: no container")
        if any(params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")) and group.get("resources"):
            problems.append(f"{group_name}: resources in both rayStartParams and Resources")
        if "labels" in params:
            problems.append(f"{group_name}: rayStartParams['labels'] is not supported")
        for key, value in group.get("labels", {}).items():
            if len(key.split("/")[-1]) > 63 or not QUALIFIED_NAME.match(key):
                problems.append(f"{group_name}: label key {key!r}")
            if len(value) > 63 or not LABEL_VALUE.match(value):
                problems.append(f"{group_name}: label value {value!r}")
    if cluster["headGroupSpec"].get("headService", {}).get("metadata", {}).get("name"):
        problems.append("headService.metadata.name must not be set")
    upgrade = spec.get("upgradeStrategy", {}).get("type")
    if upgrade not in (None, "NewCluster", "NewClusterWithIncrementalUpgrade", "None"):
        problems.append(f"upgradeStrategy.type {upgrade!r}")
    if upgrade == "NewClusterWithIncrementalUpgrade":
        options = spec["upgradeStrategy"].get("clusterUpgradeOptions")
        if not cluster.get("enableInTreeAutoscaling"):
            problems.append("NewClusterWithIncrementalUpgrade needs the Ray autoscaler")
        if not options or not options.get("gatewayClassName") or not 0 <= options.get("stepSizePercent", -1) <= 100 \
                or options.get("intervalSeconds", 0) <= 0 or not 0 <= options.get("maxSurgePercent", 100) <= 100:
            problems.append("clusterUpgradeOptions incomplete")
    if spec.get("rayClusterDeletionDelaySeconds", 0) < 0:
        problems.append("rayClusterDeletionDelaySeconds < 0")
    return problems


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_rayservice_and_its_cluster_pass_kuberays_crds_and_admission(path):
    rayservice = one(render(values_of(path.name)), "RayService")
    assert crd_problems(rayservice, "rayservices") == []
    raycluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "macaron-abcde"},
                  "spec": rayservice["spec"]["rayClusterConfig"]}
    assert crd_problems(raycluster, "rayclusters") == []
    assert kuberay_admission_problems(rayservice) == []


def test_the_crd_and_admission_checks_can_fail():
    rayservice = one(render(values_of("values-venti-b300.yaml")), "RayService")
    broken = copy.deepcopy(rayservice)
    broken["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["rayStartParam"] = {}  # typo: pruned by the API server
    broken["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = 8
    problems = crd_problems(broken, "rayservices")
    assert any("rayStartParam'" in p for p in problems) and any("limits" in p for p in problems), problems
    broken = copy.deepcopy(rayservice)
    group = broken["spec"]["rayClusterConfig"]["workerGroupSpecs"][1]
    group["resources"] = {"macaron_node_b300_router": "1"}
    group["rayStartParams"]["labels"] = "ray.io/accelerator-type=B300"
    broken["metadata"]["name"] = "9" + "x" * 50
    assert len(kuberay_admission_problems(broken)) == 3


# -- Kubernetes' own schemas ----------------------------------------------------------------------


def kubernetes_problems(obj: dict) -> list[str]:
    import kubernetes_validate

    problems = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{obj['kind']}/{obj['metadata']['name']} ({version}): "
                            f"{'.'.join(map(str, exc.path))}: {exc.message}")
    return problems


def pod_templates(rayservice: dict) -> list[dict]:
    """Each Ray group's pod template as a Kubernetes PodTemplate, for the core schemas."""
    return [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"group-{i}"}, "template": g["template"]}
            for i, g in enumerate(ray_groups(rayservice).values())]


STANDARD_GROUPS = re.compile(r"^(v1|(apps|networking\.k8s\.io|policy|batch|rbac\.authorization\.k8s\.io)/v1)$")


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_standard_objects_and_ray_pod_templates_pass_kubernetes_schemas(path):
    values = with_values(values_of(path.name),
                         api__ingress={"enabled": True, "host": "llm.internal", "className": "nginx"},
                         api__keys={"inline": KEY_LINES, "secretKey": "keys"})
    manifests = render(values)
    standard = [m.obj for m in manifests if STANDARD_GROUPS.match(m.obj["apiVersion"])]
    assert {o["kind"] for o in standard} >= {"Service", "StatefulSet", "NetworkPolicy", "Secret", "Ingress"}
    others = {m.kind for m in manifests} - {o["kind"] for o in standard}
    assert others <= {"RayService", "PodMonitor", "PrometheusRule"}, others
    problems = [p for obj in standard + pod_templates(one(manifests, "RayService")) for p in kubernetes_problems(obj)]
    assert problems == []


def test_the_kubernetes_schema_check_can_fail():
    redis = next(m.obj for m in render(values_of("values-cpu.yaml")) if m.kind == "StatefulSet")
    broken = copy.deepcopy(redis)
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    assert kubernetes_problems(broken)


# -- prometheus-operator's CRDs -------------------------------------------------------------------


def monitoring_problems(obj: dict) -> list[str]:
    """prometheus-operator's CRD models (cloudcoil, generated from them): types and enums checked by
    pydantic; a field the models drop on the way back is one the CRD does not have."""
    import pydantic
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, obj["kind"])
    try:
        parsed = model.model_validate(obj)
    except pydantic.ValidationError as exc:
        return [str(exc)]
    back = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return [] if back == obj else [f"{obj['kind']}: fields the CRD does not have: {_diff(obj, back)}"]


def _diff(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a for d in (_diff(a[k], b.get(k), f"{path}.{k}") if k in b else [f"{path}.{k}"])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def pod_selected(selector: dict, labels: dict) -> bool:
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        ok = ok and labels.get(expr["key"]) in expr["values"]
    return ok


@pytest.mark.parametrize("path", [p for p in VALUES_FILES if values_of(p.name)["monitoring"]["podMonitors"]["enabled"]],
                         ids=lambda p: p.name)
def test_monitoring_objects_pass_prometheus_operators_crds_and_select_the_ray_pods(path):
    manifests = render(values_of(path.name))
    monitors = [m.obj for m in manifests if m.kind == "PodMonitor"]
    rule = one(manifests, "PrometheusRule")
    assert [p for obj in [*monitors, rule] for p in monitoring_problems(obj)] == []
    rayservice = one(manifests, "RayService")
    # Each Ray group is scraped by exactly one monitor, on ports its container declares.
    for group in ray_groups(rayservice).values():
        labels = group["template"]["metadata"]["labels"]
        ports = {p["name"] for p in group["template"]["spec"]["containers"][0]["ports"]}
        scraping = [m for m in monitors if pod_selected(m["spec"]["selector"], labels)]
        assert len(scraping) == 1, labels
        assert {e["port"] for e in scraping[0]["spec"]["podMetricsEndpoints"]} <= ports
        assert "metrics" in ports
    # The label the values give is what a Prometheus selects monitors and rules by.
    selector = values_of(path.name)["monitoring"]["podMonitors"]["labels"]
    assert all(m["metadata"]["labels"].items() >= selector.items() for m in [*monitors, rule])


def test_the_monitoring_check_can_fail():
    monitor = next(m.obj for m in render(values_of("values-tall-h20.yaml")) if m.kind == "PodMonitor")
    broken = copy.deepcopy(monitor)
    broken["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    assert monitoring_problems(broken)
    broken = copy.deepcopy(monitor)
    broken["spec"]["podMetricsEndpoints"][0]["scheme"] = "gopher"
    assert monitoring_problems(broken)


def test_alert_rules_and_dashboards_are_the_projects_files():
    manifests = render(values_of("values-venti-b300.yaml"))
    rule = one(manifests, "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / "dashboards" / "alerts.yaml").read_text())["groups"]
    boards = {m.name: m.obj for m in manifests if m.kind == "ConfigMap"}
    files = sorted((ROOT / "dashboards").glob("*.json"))
    assert len(boards) == len(files) > 0
    for path in files:
        board = boards[f"macaron-dashboard-{path.stem}"]
        assert board["data"] == {path.name: path.read_text()}  # byte for byte
        assert board["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.mark.parametrize("switch, kind, count", [
    ("podMonitors", "PodMonitor", 2), ("prometheusRule", "PrometheusRule", 1),
    ("dashboards", "ConfigMap", len(list((ROOT / "dashboards").glob("*.json"))))])
def test_each_monitoring_object_is_switchable(switch, kind, count):
    values = values_of("values-tall-h20.yaml")
    on = render(values)
    off = render(with_values(values, **{f"monitoring__{switch}__enabled": False}))
    assert kinds(on).count(kind) == count and kinds(off).count(kind) == 0
    assert sorted(k for k in kinds(on) if k != kind) == sorted(k for k in kinds(off) if k != kind)


# -- the Serve config is the profile --------------------------------------------------------------


def expected_serve_config(values: dict) -> dict:
    """The profile file with exactly the changes the chart documents (macaron.serveConfig)."""
    doc = profile_doc(values)
    doc["http_options"] = {**doc.get("http_options", {}), "host": "0.0.0.0", "port": SERVE_PORT}
    store = values.get("store", {"mode": "internal"})
    keys = values.get("api", {}).get("keys", {})
    for app in doc["applications"]:
        if app["import_path"] != IMPORT_PATH:
            continue
        args = app["args"]
        if store["mode"] in ("internal", "external"):
            args["store"] = {"kind": "redis", "url_env": STORE_URL_ENV}
        ingress = args.setdefault("ingress", {})
        if values.get("api", {}).get("replicas") is not None:
            ingress["num_replicas"] = values["api"]["replicas"]
        if keys.get("existingSecret") or keys.get("inline"):
            ingress.setdefault("api_keys_env", "MACARON_API_KEYS")
        if not ingress:
            del args["ingress"]
    return doc


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_serve_config_is_the_profile_with_the_documented_changes(path):
    values = values_of(path.name)
    config = serve_config(render(values))
    assert config == expected_serve_config(values)
    # And the changes are only those: the profile's applications apart from store and ingress.
    profile_apps = profile_doc(values)["applications"]
    strip = lambda apps: [{**a, "args": {k: v for k, v in a["args"].items() if k not in ("store", "ingress")}}
                          for a in apps]
    assert strip(config["applications"]) == strip(profile_apps)


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_serve_config_passes_ray_serve_and_appargs(path):
    from ray.serve.schema import ServeDeploySchema

    config = serve_config(render(values_of(path.name)))
    schema = ServeDeploySchema.model_validate(config)
    assert [app.import_path for app in schema.applications] == [IMPORT_PATH]
    AppArgs.model_validate(macaron_args(config))


def test_serve_config_follows_the_values_and_the_release():
    values = with_values(values_of("values-tall-h20.yaml"), api__replicas=6)
    manifests = render(values, release="prod")
    config = serve_config(manifests)
    assert config == expected_serve_config(values)
    args = AppArgs.model_validate(macaron_args(config))
    assert args.ingress.num_replicas == 6 and args.store.url_env == STORE_URL_ENV
    assert re.fullmatch(rf"redis://:\w{{32}}@prod-macaron-redis:{REDIS_PORT}/0", store_url(manifests))
    # null keeps the profile's replicas
    kept = with_values(values, api__replicas=None)
    assert macaron_args(serve_config(render(kept)))["ingress"]["num_replicas"] == 2


def test_the_serve_config_checks_can_fail():
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    values = values_of("values-cpu.yaml")
    config = serve_config(render(values))
    assert serve_config(render(with_values(values, api__replicas=3))) != expected_serve_config(values)
    broken = copy.deepcopy(config)
    broken["proxy_location"] = "Everywhere"
    with pytest.raises(ValidationError):
        ServeDeploySchema.model_validate(broken)
    macaron_args(broken)["ingress"]["num_replica"] = 2
    with pytest.raises(ValidationError):
        AppArgs.model_validate(macaron_args(broken))


# -- the Ray cluster is the cluster file ----------------------------------------------------------


def _resources(params: dict) -> dict:
    return json.loads(params["resources"].strip("'")) if "resources" in params else {}


def _gib(quantity: str) -> int:
    assert quantity.endswith("Gi"), quantity
    return int(quantity[:-2])


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_ray_groups_are_the_cluster_files_groups(path):
    values = values_of(path.name)
    rayservice = one(render(values), "RayService")
    args = AppArgs.model_validate(macaron_args(serve_config(render(values))))
    cluster = ClusterSpec.named(args.cluster)
    groups = ray_groups(rayservice)
    assert set(groups) == {"<head>", *(g.name for g in cluster.workers)}
    for spec in cluster.groups():
        group = groups["<head>" if spec is cluster.head else spec.name]
        params, template = group["rayStartParams"], group["template"]
        container = template["spec"]["containers"][0]
        limits = container["resources"]["limits"]
        assert container["resources"]["requests"] == limits
        shm = next(v for v in template["spec"]["volumes"] if v["name"] == "shared-mem")
        assert {"name": "shared-mem", "mountPath": "/dev/shm"} in container["volumeMounts"]
        # The numbers `ray start` gets are the cluster file's (NodeGroup.ray_start_args()).
        assert params["num-cpus"] == str(spec.num_cpus) and params["num-gpus"] == str(spec.num_gpus)
        assert int(params["object-store-memory"]) == spec.object_store_memory_bytes
        assert _resources(params) == spec.resources
        assert group.get("labels", {}) == spec.labels
        assert int(limits.get("nvidia.com/gpu", 0)) == spec.num_gpus
        assert template["metadata"]["labels"]["macaron.ai/node-type"] == spec.node_type
        # Replicas and the pod's size as rendered still pass the project's own rules for a group.
        overrides = values.get("nodeGroups", {}).get(spec.name, {})
        NodeGroup.model_validate({
            **spec.model_dump(),
            "replicas": group.get("replicas", 1), "min_replicas": group.get("minReplicas", 1),
            "max_replicas": max(group.get("maxReplicas", 1), 1),
            "container": ContainerResources(cpu=int(limits["cpu"]), memory_gib=_gib(limits["memory"]),
                                            shared_memory_gib=_gib(shm["emptyDir"]["sizeLimit"]),
                                            nvidia_gpus=spec.num_gpus).model_dump()})
        if spec.container and "container" not in overrides:
            assert (int(limits["cpu"]), _gib(limits["memory"]), _gib(shm["emptyDir"]["sizeLimit"])) == (
                spec.container.cpu, spec.container.memory_gib, spec.container.shared_memory_gib)
        if spec.num_gpus:
            assert template["spec"]["nodeSelector"]["nvidia.com/gpu.product"].startswith(
                f"NVIDIA-{spec.accelerator_type}")
            gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            assert gpu_taint in template["spec"]["tolerations"]
    # KubeRay sends serve traffic to the head only where it runs replicas.
    assert rayservice["spec"]["excludeHeadPodFromServeSvc"] is (cluster.head.num_cpus == 0)


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_every_deployment_has_nodes_that_fit_it(path):
    values = values_of(path.name)
    manifests = render(values)
    rayservice = one(manifests, "RayService")
    args = AppArgs.model_validate(macaron_args(serve_config(manifests)))
    by_resource = {}
    for group in ray_groups(rayservice).values():
        for resource in _resources(group["rayStartParams"]):
            by_resource[resource] = group
    kv_gib: dict[str, float] = {}
    for role, spec in args.roles().items():
        group = by_resource[node_type_resource(spec.node_type)]
        assert group.get("replicas", 1) >= 1, f"{role}: no {spec.node_type} node starts"
        world = engine_world_size(args.engine_kwargs_for(role))
        if args.accelerator == "gpu":
            assert int(group["rayStartParams"]["num-gpus"]) >= world, role
        else:
            # A CPU engine's cores (VLLM_CPU_OMP_THREADS_BIND) must be within the pod's CPUs.
            limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
            cores = [int(c) for part in spec.cpu_cores.split(",") for c in part.split("-")]
            assert max(cores) < int(limits["cpu"]), role
            kv_gib[spec.node_type] = kv_gib.get(spec.node_type, 0) + spec.kv_cache_gib
    # CPU engines keep their KV cache in the pod's memory, beside the object store's /dev/shm.
    for node_type, gib in kv_gib.items():
        group = by_resource[node_type_resource(node_type)]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        shm = next(v for v in group["template"]["spec"]["volumes"] if v["name"] == "shared-mem")
        assert gib + _gib(shm["emptyDir"]["sizeLimit"]) < _gib(limits["memory"]), node_type
    ingress_group = by_resource[node_type_resource(args.ingress.node_type)]
    capacity = int(ingress_group["rayStartParams"]["num-cpus"]) * ingress_group.get("replicas", 1)
    assert args.ingress.num_replicas * args.ingress.num_cpus <= capacity
    # Whatever the profile reads from a mounted path lies on the models volume.
    paths = [a.path for a in args.adapter_list()] if args.adapters != "embedded" else []
    speculative = args.decode.engine_kwargs.get("speculative_config", {}) if args.decode else {}
    paths += [speculative["model"]] if "model" in speculative else []
    models = {**values_of("values.yaml")["models"], **values.get("models", {})}
    for p in paths:
        assert p.startswith(models["mountPath"] + "/") and models["volume"], p
    for container in ray_containers(rayservice):
        if paths:
            assert {"name": "models", "mountPath": models["mountPath"], "readOnly": True} in container["volumeMounts"]


def test_group_overrides_reach_the_pods_and_are_checked():
    values = with_values(values_of("values-tall-h20.yaml"),
                         nodeGroups__cpu={"replicas": 4, "maxReplicas": 8, "extraResources": {"rdma/ib": 1},
                                          "container": {"cpu": 12, "memoryGiB": 48, "sharedMemoryGiB": 12}})
    cpu = ray_groups(one(render(values), "RayService"))["cpu"]
    assert cpu["replicas"] == 4
    limits = cpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "12", "memory": "48Gi", "rdma/ib": "1"}
    with pytest.raises(k8s.ChartError, match=r"minReplicas \(1\) <= replicas \(9\) <= maxReplicas \(8\)"):
        render(with_values(values, nodeGroups__cpu__replicas=9))
    with pytest.raises(k8s.ChartError, match="does not fit in /dev/shm"):
        render(with_values(values, nodeGroups__cpu__container={"cpu": 12, "memoryGiB": 48, "sharedMemoryGiB": 4}))
    with pytest.raises(k8s.ChartError, match="no container resources; set nodeGroups.head.container"):
        # cluster/local-cpu.yaml describes this machine's processes, not pods: it has no container sizes.
        render(with_values(values_of("values-cpu.yaml"), profile="local-cpu", nodeGroups={}))


# -- conversation store and API keys --------------------------------------------------------------


def secret_data(manifests: list[k8s.Manifest], name: str) -> dict[str, str]:
    """The decoded data of the chart's Secret `name`."""
    import base64

    secret = next(m.obj for m in manifests if m.kind == "Secret" and m.name == name)
    return {**{k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()},
            **secret.get("stringData", {})}


def store_url_refs(manifests: list[k8s.Manifest]) -> list[dict]:
    """The secretKeyRef of MACARON_STORE_URL on each Ray container (None where it is not set)."""
    envs = [_key_env(c, STORE_URL_ENV) for c in ray_containers(one(manifests, "RayService"))]
    return [e and e["valueFrom"]["secretKeyRef"] for e in envs]


def store_url(manifests: list[k8s.Manifest]) -> str:
    """The URL the Ray containers get, read from the chart's Secret."""
    [ref] = {json.dumps(r, sort_keys=True) for r in store_url_refs(manifests)}
    ref = json.loads(ref)
    return secret_data(manifests, ref["name"])[ref["key"]]


def test_internal_redis_is_a_statefulset_with_a_volume_behind_the_url_the_app_gets():
    values = values_of("values-tall-h20.yaml")
    manifests = render(values)
    assert AppArgs.model_validate(macaron_args(serve_config(manifests))).store.url_env == STORE_URL_ENV
    password, host, port = re.fullmatch(r"redis://:(\w+)@([^:/]+):(\d+)/0", store_url(manifests)).groups()
    service = next(m.obj for m in manifests if m.kind == "Service" and m.name == host)
    assert [p["port"] for p in service["spec"]["ports"]] == [int(port)] == [REDIS_PORT]
    redis = one(manifests, "StatefulSet")
    pod_labels = redis["spec"]["template"]["metadata"]["labels"]
    assert pod_selected({"matchLabels": service["spec"]["selector"]}, pod_labels)
    claim = redis["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == values["redis"]["persistence"]["size"]
    container = redis["spec"]["template"]["spec"]["containers"][0]
    assert {"name": claim["metadata"]["name"], "mountPath": "/data"} in container["volumeMounts"]
    # Redis requires the password in the URL, from the same Secret; redis-cli (the probe) sends it.
    assert len(password) == 32 and secret_data(manifests, "macaron-redis-auth")["password"] == password
    assert _key_env(container, "REDISCLI_AUTH") == {
        "name": "REDISCLI_AUTH", "valueFrom": {"secretKeyRef": {"name": "macaron-redis-auth", "key": "password"}}}
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDISCLI_AUTH)" and "--protected-mode" not in args
    # Only this release's Ray pods may connect.
    policy = one(manifests, "NetworkPolicy")
    assert pod_selected(policy["spec"]["podSelector"], pod_labels)
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]
    for group in ray_groups(one(manifests, "RayService")).values():
        assert pod_selected(allowed, group["template"]["metadata"]["labels"])
    assert not pod_selected(allowed, pod_labels)


def test_internal_redis_with_an_existing_secret_uses_it_and_makes_none():
    manifests = render(with_values(values_of("values-tall-h20.yaml"), redis__auth__existingSecret="redis-auth"))
    assert not [m for m in manifests if m.kind == "Secret" and "redis" in m.name]
    assert store_url_refs(manifests) == [{"name": "redis-auth", "key": "url"}] * len(store_url_refs(manifests))
    redis = one(manifests, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    assert _key_env(redis, "REDISCLI_AUTH")["valueFrom"]["secretKeyRef"] == {"name": "redis-auth", "key": "password"}


def test_external_redis_takes_the_url_from_a_secret_and_runs_nothing():
    values = with_values(values_of("values-tall-h20.yaml"),
                         store={"mode": "external", "existingSecret": {"name": "llm-cache", "key": "redis-url"}})
    manifests = render(values)
    assert not [m for m in manifests if "redis" in m.name or m.kind == "Secret"]
    assert macaron_args(serve_config(manifests))["store"] == {"kind": "redis", "url_env": STORE_URL_ENV}
    refs = store_url_refs(manifests)
    assert len(refs) > 1 and refs == [{"name": "llm-cache", "key": "redis-url"}] * len(refs)
    # Or the URL in the values, put in a Secret by the chart.
    inline = render(with_values(values, store={"mode": "external", "externalUrl": "redis://:pw@cache.llm:6379/2"}))
    assert not [m for m in inline if "redis" in m.name]
    assert store_url_refs(inline)[0] == {"name": "macaron-store", "key": "url"}
    assert store_url(inline) == "redis://:pw@cache.llm:6379/2"
    with pytest.raises(k8s.ChartError, match="store.mode external needs store.existingSecret.name"):
        render(with_values(values, store={"mode": "external"}))
    with pytest.raises(k8s.ChartError, match="set existingSecret.name or externalUrl, not both"):
        render(with_values(values, store__externalUrl="redis://cache.llm:6379/2"))
    # `profile` keeps the profile's own store, and no Ray container gets a URL.
    kept = render(with_values(values_of("values-cpu.yaml"), profile="local-cpu", store={"mode": "profile"},
                              nodeGroups={"head": {"container": {"cpu": 2, "memoryGiB": 10, "sharedMemoryGiB": 1}},
                                          "cpu-worker": {"replicas": 0, "minReplicas": 0,
                                                         "container": {"cpu": 1, "memoryGiB": 2, "sharedMemoryGiB": 1}}}))
    assert macaron_args(serve_config(kept))["store"] == {"kind": "sqlite"}
    assert set(store_url_refs(kept)) == {None} and not [m for m in kept if m.kind == "Secret"]


@pytest.mark.parametrize("store", [
    {"mode": "internal"},
    {"mode": "external", "existingSecret": {"name": "llm-cache", "key": "url"}},
    {"mode": "external", "externalUrl": "redis://:s3cret@cache.llm:6379/2"}],
    ids=["internal", "external-secret", "external-url"])
@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_no_redis_url_or_password_is_written_into_the_rayservice(path, store):
    manifests = render(with_values(values_of(path.name), store=store))
    rayservice = next(m for m in manifests if m.kind == "RayService")
    assert "redis://" not in rayservice.text and "url:" not in rayservice.obj["spec"]["serveConfigV2"]
    assert AppArgs.model_validate(macaron_args(serve_config(manifests))).store.url is None
    if store["mode"] == "internal":
        assert secret_data(manifests, "macaron-redis-auth")["password"] not in rayservice.text
    elif "externalUrl" in store:
        assert "s3cret" not in rayservice.text and "cache.llm" not in rayservice.text


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_the_store_url_reaches_every_ray_container_from_the_secret(path):
    manifests = render(values_of(path.name))
    containers = ray_containers(one(manifests, "RayService"))
    assert len(containers) >= 2  # the head and the worker groups: the ingress may run on any of them
    for container in containers:
        assert _key_env(container, STORE_URL_ENV) == {
            "name": STORE_URL_ENV, "valueFrom": {"secretKeyRef": {"name": "macaron-redis-auth", "key": "url"}}}
    assert store_url(manifests).startswith("redis://:")


def _key_env(container: dict, name: str) -> dict | None:
    return next((e for e in container.get("env", []) if e["name"] == name), None)


@pytest.mark.parametrize("keys, secret_name", [
    ({"existingSecret": "macaron-api-keys", "secretKey": "keys"}, "macaron-api-keys"),
    ({"inline": KEY_LINES, "secretKey": "keys"}, "macaron-api-keys")])
def test_api_keys_reach_every_ray_container_from_a_secret(keys, secret_name):
    values = with_values(values_of("values-venti-b300.yaml"), api__keys=keys)
    manifests = render(values)
    env_name = AppArgs.model_validate(macaron_args(serve_config(manifests))).ingress.api_keys_env
    assert env_name == "MACARON_API_KEYS"  # the profile's own
    for container in ray_containers(one(manifests, "RayService")):
        assert _key_env(container, env_name) == {
            "name": env_name, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": "keys"}}}
    secrets = [m.obj for m in manifests if m.kind == "Secret" and m.name == secret_name]
    if "inline" in keys:
        assert [s["stringData"] for s in secrets] == [{"keys": "\n".join(KEY_LINES)}]
        assert KeyRing.parse(secrets[0]["stringData"]["keys"]).tenant_of("b" * 32) == "bravo"  # what the app reads
    else:
        assert secrets == []


def test_api_keys_for_a_profile_without_them_set_the_env_var_in_the_args():
    manifests = render(with_values(values_of("values-cpu.yaml"), api__keys={"inline": KEY_LINES[:1], "secretKey": "keys"}))
    assert macaron_args(serve_config(manifests))["ingress"]["api_keys_env"] == "MACARON_API_KEYS"
    open_api = render(values_of("values-cpu.yaml"))
    assert "api_keys_env" not in macaron_args(serve_config(open_api))["ingress"]
    assert all(_key_env(c, "MACARON_API_KEYS") is None for c in ray_containers(one(open_api, "RayService")))


# -- upgrade strategy ---------------------------------------------------------------------------


def test_upgrade_strategy_is_rendered_and_checked():
    values = values_of("values-tall-h20.yaml")
    assert one(render(values), "RayService")["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    incremental = with_values(values, rayService__upgradeStrategy="NewClusterWithIncrementalUpgrade",
                              rayService__autoscaling=True, rayService__incrementalUpgrade__gatewayClassName="istio")
    rayservice = one(render(incremental), "RayService")
    assert rayservice["spec"]["upgradeStrategy"]["clusterUpgradeOptions"]["gatewayClassName"] == "istio"
    assert crd_problems(rayservice, "rayservices") == [] and kuberay_admission_problems(rayservice) == []
    with pytest.raises(k8s.ChartError, match="gatewayClassName is required"):
        render(with_values(incremental, rayService__incrementalUpgrade__gatewayClassName=""))
    # What KubeRay refuses, the render refuses (test_k8s_operator.py); the admission check still sees it.
    with pytest.raises(k8s.ChartError, match="needs rayService.autoscaling: true"):
        render(with_values(incremental, rayService__autoscaling=False))
    no_autoscaler = copy.deepcopy(rayservice)
    no_autoscaler["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] = False
    assert kuberay_admission_problems(no_autoscaler) == ["NewClusterWithIncrementalUpgrade needs the Ray autoscaler"]


# -- values that are wrong fail with a message that says where ----------------------------------


@pytest.mark.parametrize("mutate, message", [
    (lambda v: v.update(replicaz=3), "at '': additional properties 'replicaz' not allowed"),
    (lambda v: v["api"].update(replcas=3), "at '/api': additional properties 'replcas' not allowed"),
    (lambda v: v["redis"].update(persistance={"size": "1Gi"}),
     "at '/redis': additional properties 'persistance' not allowed"),
    (lambda v: v.update(nodeGroups={"head": {"nodeselector": {}}}),
     "at '/nodeGroups/head': additional properties 'nodeselector' not allowed"),
    (lambda v: v["api"].update(replicas="four"), "at '/api/replicas': got string, want null or integer"),
    (lambda v: v.update(nodeGroups={"head": {"container": {"cpu": "2", "memoryGiB": 3, "sharedMemoryGiB": 1}}}),
     "at '/nodeGroups/head/container/cpu': got string, want integer"),
    (lambda v: v["redis"]["persistence"].update(size=10), "at '/redis/persistence/size': got number, want string"),
    (lambda v: v["rayService"].update(upgradeStrategy="BlueGreen"), "at '/rayService/upgradeStrategy'"),
    (lambda v: v["store"].update(mode="memcached"), "at '/store/mode'"),
    (lambda v: v["store"].update(existingSecrets={"name": "x"}),
     "at '/store': additional properties 'existingSecrets' not allowed"),
    (lambda v: v["store"].update(existingSecret={"name": "x", "kye": "url"}),
     "at '/store/existingSecret': additional properties 'kye' not allowed"),
    (lambda v: v["store"].update(url="redis://cache:6379/0"), "at '/store': additional properties 'url' not allowed"),
    (lambda v: v["redis"].update(auth={"existingSecret": "x", "password": "p"}),
     "at '/redis/auth': additional properties 'password' not allowed"),
    (lambda v: v["monitoring"]["dashboards"].update(enabled="yes"),
     "at '/monitoring/dashboards/enabled': got string, want boolean"),
])
def test_a_typo_or_a_wrong_type_fails_with_where_it_is(mutate, message):
    values = values_of("values-cpu.yaml")
    mutate(values)
    with pytest.raises(k8s.ChartError) as exc:
        render(values)
    assert message in str(exc.value), str(exc.value)


@pytest.mark.parametrize("change, message", [
    ({"profile": "venti"}, 'profile "venti": no deployments/venti.yaml; the profiles are '),
    ({"profile": ""}, "set profile to one of"),
    ({"nodeGroups__b300-routr": {}}, 'cluster b300 has no group "b300-routr"'),
    ({"api__keys": {"secretKey": "keys"}},
     "profile venti-b300 reads API keys from MACARON_API_KEYS: set api.keys.existingSecret"),
    ({"api__keys__inline": KEY_LINES[:1]}, "api.keys: set existingSecret or inline, not both"),
    ({"image__repository": ""}, "image.repository is required"),
])
def test_values_the_templates_refuse_say_what_to_set(change, message):
    values = with_values(values_of("values-venti-b300.yaml"), **change)
    with pytest.raises(k8s.ChartError) as exc:
        render(values)
    assert message in str(exc.value), str(exc.value)


def test_a_release_name_kuberay_refuses_is_refused_here():
    with pytest.raises(k8s.ChartError, match="not a DNS-1035 label"):
        render(values_of("values-cpu.yaml"), release="1st")
    long = one(render(values_of("values-cpu.yaml"), release="a" * 50), "RayService")
    assert len(long["metadata"]["name"]) <= 47 and kuberay_admission_problems(long) == []


def test_notes_say_how_to_reach_the_api_and_the_dashboard():
    gpu = k8s.notes(values_of("values-venti-b300.yaml"), namespace="llm")
    assert "kubectl -n llm port-forward svc/macaron-serve-svc 8000:8000" in gpu
    assert "svc/macaron-head-svc 8265:8265" in gpu and 'Authorization: Bearer $KEY' in gpu
    assert "Authorization" not in k8s.notes(values_of("values-cpu.yaml"))


# -- macaron k8s render ---------------------------------------------------------------------------


def test_macaron_k8s_render_prints_what_helm_renders(capsys):
    from macaron_ray.cli import main

    path = CHART / "values-tall-h20.yaml"
    # A Redis password of the Secret's own: a generated one differs from render to render.
    assert main(["k8s", "render", "--values", str(path), "--set", "api.replicas=3",
                 "--set", "redis.auth.existingSecret=redis-auth", "-n", "llm"]) == 0
    out = capsys.readouterr().out
    expected = k8s.render(with_values(values_of(path.name), api__replicas=3, redis__auth__existingSecret="redis-auth"),
                          namespace="llm")
    assert out == k8s.format_manifests(expected)
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["kind"] for d in docs] == [m.kind for m in expected]
    assert macaron_args(yaml.safe_load(docs[-1]["spec"]["serveConfigV2"]))["ingress"]["num_replicas"] == 3


def test_macaron_k8s_render_reports_bad_values(capsys, tmp_path):
    from macaron_ray.cli import main

    bad = tmp_path / "values.yaml"
    bad.write_text("profile: local-cpu\napi: {replcas: 2}\n")
    assert main(["k8s", "render", "-f", str(CHART / "values-cpu.yaml"), "-f", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "additional properties 'replcas' not allowed" in captured.err


# -- what the container cluster taught (issue 32) -------------------------------------------------


def test_gcs_fault_tolerance_is_on_with_the_charts_redis_and_off_without_it():
    manifests = render(values_of("values-cpu.yaml"))
    ft = one(manifests, "RayService")["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert ft == {"redisAddress": "macaron-redis:6379",
                  "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "macaron-redis-auth", "key": "password"}}}}
    # No namespace of the chart's: KubeRay gives each RayCluster its own (its UID), so the two
    # clusters of a NewCluster upgrade never share GCS state.
    assert "externalStorageNamespace" not in ft
    external = render(with_values(values_of("values-cpu.yaml"),
                                  store={"mode": "external", "externalUrl": "redis://cache:6379/0"}))
    assert "gcsFaultToleranceOptions" not in one(external, "RayService")["spec"]["rayClusterConfig"]
    off = render(with_values(values_of("values-cpu.yaml"), rayService__gcsFaultTolerance=False))
    assert "gcsFaultToleranceOptions" not in one(off, "RayService")["spec"]["rayClusterConfig"]
    with pytest.raises(k8s.ChartError, match="gcsFaultTolerance needs store.mode internal"):
        render(with_values(values_of("values-cpu.yaml"), rayService__gcsFaultTolerance=True,
                           store={"mode": "external", "externalUrl": "redis://cache:6379/0"}))


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_every_ray_container_advertises_its_own_address_to_nixl(path):
    """The decode engine pulls KV from the address the prefill engine advertises: the pod's IP,
    not vLLM's default (localhost), which on another pod is the wrong machine."""
    for container in ray_containers(one(render(values_of(path.name)), "RayService")):
        env = {e["name"]: e for e in container["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert {"name": "nixl", "containerPort": 5600} in container["ports"]


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_each_group_that_runs_engines_has_a_disruption_budget(path):
    manifests = render(values_of(path.name))
    args = AppArgs.model_validate(macaron_args(serve_config(manifests)))
    engine_types = {spec.node_type for spec in args.roles().values()}
    budgets = {m.obj["spec"]["selector"]["matchLabels"]["macaron.ai/node-type"]: m.obj
               for m in manifests if m.kind == "PodDisruptionBudget"}
    assert set(budgets) == engine_types, (set(budgets), engine_types)
    for budget in budgets.values():
        assert budget["spec"]["maxUnavailable"] == 1
    # The selector matches the engine pods' own labels.
    for group in ray_groups(one(manifests, "RayService")).values():
        labels = group["template"]["metadata"]["labels"]
        if labels["macaron.ai/node-type"] in budgets:
            selector = budgets[labels["macaron.ai/node-type"]]["spec"]["selector"]["matchLabels"]
            assert selector.items() <= labels.items()
    off = render(with_values(values_of(path.name), disruptionBudgets__enabled=False))
    assert not [m for m in off if m.kind == "PodDisruptionBudget"]
