"""The KubeRay Helm chart (`k8s/macaron/`), rendered and linted with Helm's own engine.

`helm-python-sdk` binds Helm's Go SDK (v4) through a C library in its wheel, so
`macaron k8s render` prints the objects `helm template` renders, on a machine
without the helm binary: the same template engine, the same values coalescing,
the same `values.schema.json` check. Nothing here talks to a cluster.

The chart reads the project's own files through links (`profiles/` ->
`deployments/`, `clusters/` -> `cluster/`, `dashboards/` -> `dashboards/`),
which Helm follows, so it is rendered from a source checkout.

The `kuberay_*` functions model what KubeRay's operator builds from the rendered
RayService (the pods' labels, the head Service, the serve Service's name) and the
hash it compares on an upgrade, so the chart can be held to them without a cluster.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from macaron_ray.paths import PACKAGE_DIR

CHART_DIR = PACKAGE_DIR.parent / "k8s" / "macaron"
"""The chart, next to `deployments/` (a source checkout, not the installed package)."""
DEFAULT_RELEASE = "macaron"
KUBE_VERSION = "v1.29.0"
"""The oldest Kubernetes the chart supports (Chart.yaml `kubeVersion`); lint checks against it."""
INSTALL_ORDER = (
    "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy", "PodDisruptionBudget",
    "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
    "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
    "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
    "ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job",
    "CronJob", "IngressClass", "Ingress", "APIService", "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
)
"""Helm's install order of kinds (`helm template` prints in it); other kinds, the RayService and
the monitoring objects among them, come after these."""
_DOCUMENT_SEPARATOR = re.compile(r"^---[ \t]*$", re.MULTILINE)
LINT_SEVERITIES = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}


class ChartError(ValueError):
    """The values or the templates are wrong; the message is Helm's (it names the key or template)."""


@dataclass(frozen=True)
class Manifest:
    """One Kubernetes object as the chart renders it."""

    source: str
    """The template it came from, as Helm names it (`macaron/templates/redis.yaml`)."""
    text: str
    """The YAML document, comments included, as `helm template` prints it."""
    obj: dict[str, Any]
    """The parsed object."""

    @property
    def kind(self) -> str:
        return self.obj["kind"]

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]


def load_values(paths: list[Path], sets: list[str] = ()) -> dict[str, Any]:
    """The user values of `-f FILE ... --set k=v ...`: each file merged over the previous ones
    (maps key by key, anything else replaced), then each `--set` (Helm's own parser).
    A null stays null: Helm's coalescing then removes the chart's default for that key."""
    import helm_python as helm

    values: dict[str, Any] = {}
    for path in paths:
        doc = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(doc, dict):
            raise ChartError(f"{path}: a values file is a mapping, not {type(doc).__name__}")
        values = _merged(values, doc)
    for assignment in sets:
        try:
            values = _merged(values, helm.parse_set_string(assignment))
        except helm.HelmError as exc:
            raise ChartError(f"--set {assignment}: {exc}") from None
    return values


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render(values: dict[str, Any], *, release: str = DEFAULT_RELEASE, namespace: str = "default",
           chart_dir: Path = CHART_DIR) -> list[Manifest]:
    """Every object the chart installs with these user values, in Helm's install order.

    Raises ChartError when the values fail `values.schema.json` or a template fails (its
    `fail`/`required` messages say what to set)."""
    manifests = []
    for source, text in sorted(_rendered(values, release, namespace, chart_dir).items()):
        if source.endswith("NOTES.txt"):
            continue
        for document in _DOCUMENT_SEPARATOR.split(text):
            try:
                obj = yaml.safe_load(document)
            except yaml.YAMLError as exc:
                raise ChartError(f"{source} renders invalid YAML: {exc}") from None
            if obj is None:
                continue  # a template switched off, or only comments
            if not isinstance(obj, dict) or not {"apiVersion", "kind", "metadata"} <= obj.keys():
                raise ChartError(f"{source} renders a document that is not a Kubernetes object")
            manifests.append(Manifest(source=source, text=document.strip("\n"), obj=obj))
    order = {kind: i for i, kind in enumerate(INSTALL_ORDER)}
    return sorted(manifests, key=lambda m: (order.get(m.kind, len(order)), m.kind, m.name))


def notes(values: dict[str, Any], *, release: str = DEFAULT_RELEASE, namespace: str = "default",
          chart_dir: Path = CHART_DIR) -> str:
    """The chart's NOTES.txt as `helm install` would print it."""
    rendered = _rendered(values, release, namespace, chart_dir)
    return next((text for source, text in rendered.items() if source.endswith("NOTES.txt")), "")


def _rendered(values: dict[str, Any], release: str, namespace: str, chart_dir: Path) -> dict[str, str]:
    """Helm's rendering: template path -> text (a switched-off template renders to blank)."""
    import helm_python as helm

    try:
        with helm.Chart.load(chart_dir) as chart:
            return chart.render(values, name=release, namespace=namespace, is_install=True)
    except (helm.HelmValuesError, helm.HelmRenderError, helm.HelmChartLoadError) as exc:
        raise ChartError(str(exc).strip()) from None


def format_manifests(manifests: list[Manifest]) -> str:
    """The objects as one YAML stream, each headed by its template like `helm template` does."""
    return "".join(f"---\n# Source: {m.source}\n{m.text}\n" for m in manifests)


@dataclass(frozen=True)
class LintMessage:
    severity: str
    """INFO, WARNING or ERROR (Helm's)."""
    path: str
    message: str


def lint(values: dict[str, Any], *, chart_dir: Path = CHART_DIR, kube_version: str = KUBE_VERSION,
         namespace: str = "default") -> list[LintMessage]:
    """`helm lint --strict` with these values: Chart.yaml, values.schema.json, every template
    rendered and parsed as Kubernetes YAML. Strict: a warning is a failure as an error is."""
    import helm_python as helm

    report = helm.lint(chart_dir, values, strict=True, kube_version=kube_version, namespace=namespace)
    messages = [LintMessage(LINT_SEVERITIES.get(m["severity"], "UNKNOWN"), m["path"], m["error"])
                for m in report["messages"]]
    messages += [LintMessage("ERROR", str(chart_dir), error) for error in report["errors"]]
    return messages


def lint_failures(messages: list[LintMessage]) -> list[LintMessage]:
    """What fails a strict lint: warnings and errors."""
    return [m for m in messages if m.severity in ("WARNING", "ERROR", "UNKNOWN")]


# -- What KubeRay's operator makes of the RayService ---------------------------------------------
#
# The CRD schema says what KubeRay accepts; these say what its operator then builds from it, as
# KubeRay v1.7.0's source does (ray-operator/controllers/ray/...). There is no cluster here, so
# the chart's tests and the container tier hold the rendered objects to these rules instead.

KUBERAY_APP_NAME = "kuberay"
"""utils.ApplicationName: the `app.kubernetes.io/name` KubeRay gives its pods and selects them by."""
KUBERAY_CREATED_BY = "kuberay-operator"
"""utils.ComponentName, KubeRay's `app.kubernetes.io/created-by`."""
_UNOVERRIDABLE_POD_LABELS = ("ray.io/node-type", "ray.io/group", "ray.io/cluster")


def kuberay_pod_labels(group: dict[str, Any], *, cluster: str, head: bool) -> dict[str, str]:
    """The labels of a pod KubeRay starts for `group` (a headGroupSpec or workerGroupSpecs entry)
    of the RayCluster `cluster`: common/pod.go `labelPod` over `mergeLabels` of the template's
    labels and the group's `labels`. The template may override every default but node type, group
    and cluster, `app.kubernetes.io/name` included."""
    node_type = "head" if head else "worker"
    labels = {
        "ray.io/is-ray-node": "yes",
        "ray.io/cluster": cluster,
        "ray.io/node-type": node_type,
        "ray.io/group": "headgroup" if head else group["groupName"],
        "ray.io/identifier": f"{cluster}-{node_type}"[-63:],
        "app.kubernetes.io/name": KUBERAY_APP_NAME,
        "app.kubernetes.io/created-by": KUBERAY_CREATED_BY,
    }
    overrides = {**(group["template"].get("metadata") or {}).get("labels", {}), **group.get("labels", {})}
    labels.update({k: v for k, v in overrides.items() if k not in _UNOVERRIDABLE_POD_LABELS})
    return labels


def kuberay_head_service(rayservice: dict[str, Any], *, cluster: str) -> dict[str, Any]:
    """The Service `<RayService>-head-svc` the RayService controller keeps pointed at its serving
    cluster: common/service.go `BuildHeadServiceForRayService`, which calls `BuildServiceForHeadPod`
    with no labels, so the selector is `HeadServiceLabels` as they are (the template's
    `app.kubernetes.io/name` does not reach it, unlike the RayCluster's own head Service's), and
    the ports are the head container's named ports (`getServicePorts`)."""
    spec = rayservice["spec"]["rayClusterConfig"]
    container = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    ports = {p.get("name") or f"{p['containerPort']}-port": p["containerPort"] for p in container.get("ports", [])}
    if not ports:
        ports = {"client": 10001, "gcs-server": 6379, "dashboard": 8265, "metrics": 8080, "serve": 8000}
    ports.setdefault("metrics", 8080)
    name = rayservice["metadata"]["name"]
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{name}-head-svc"},
        "spec": {
            "selector": {
                "ray.io/cluster": cluster,
                "ray.io/node-type": "head",
                "ray.io/identifier": f"{cluster}-head"[-63:],
                "app.kubernetes.io/name": KUBERAY_APP_NAME,
                "app.kubernetes.io/created-by": KUBERAY_CREATED_BY,
            },
            "ports": [{"name": n, "port": p} for n, p in sorted(ports.items())],
        },
    }


def kuberay_serve_service_name(rayservice: dict[str, Any], *, cluster: str) -> str:
    """The serve Service KubeRay makes: common/service.go `BuildServeService` names it after the
    RayService (`<RayService>-serve-svc`, switched to each new cluster), but under
    NewClusterWithIncrementalUpgrade (`utils.IsIncrementalUpgradeEnabled`, with its feature gate)
    after each RayCluster (`<RayCluster>-serve-svc`), behind a Gateway it makes."""
    strategy = rayservice["spec"].get("upgradeStrategy", {}).get("type")
    owner = cluster if strategy == "NewClusterWithIncrementalUpgrade" else rayservice["metadata"]["name"]
    return f"{owner}-serve-svc"


def kuberay_cluster_hash(cluster_spec: dict[str, Any]) -> str:
    """What the RayService controller compares to decide whether a cluster spec changed
    (`shouldUpdateCluster`, `shouldPrepareNewCluster` via `isClusterSpecHashEqual`):
    utils `GenerateHashWithoutReplicasAndWorkersToDelete`, which mutes each worker group's
    replicas, minReplicas, maxReplicas and scaleStrategy.workersToDelete (the autoscaler's to
    change), the pods' tolerations and scheduling gates, and the spec's upgradeStrategy. Two specs
    get equal hashes here exactly when they do in KubeRay (the bytes hashed are not Go's)."""
    import hashlib
    import json

    spec = copy.deepcopy(cluster_spec)
    spec.pop("upgradeStrategy", None)
    for group in spec.get("workerGroupSpecs", []):
        for key in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(key, None)
        group.get("scaleStrategy", {}).pop("workersToDelete", None)
    for group in [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]:
        pod = group["template"].get("spec", {})
        pod.pop("tolerations", None)
        pod.pop("schedulingGates", None)
    return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a Service's (equality) selector selects a pod with these labels."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())
