"""`macaron cluster up --containers`: the Helm chart's pods as containers of the project's image on
one machine, started the way the KubeRay operator and the kubelet would start them.

The chart is rendered (`macaron_ray.k8s.render`, Helm's own engine) and its objects are read as
a Kubernetes cluster would read them:

- each `Secret` becomes the values its `secretKeyRef`s resolve to;
- the Redis `StatefulSet` becomes one container with the pod's args (Kubernetes' `$(VAR)`
  expansion), env, user and read-only root, a volume for `/data`, and its Services' names;
- the `RayService`'s head and worker groups become one container per replica, each with the
  group's pod template (image, env, memory and CPU limits, `/dev/shm` from its memory emptyDir) and
  the command KubeRay generates from `rayStartParams` (`ulimit -n 65536; ray start --head --block
  ...`, flags sorted, `true` a bare flag), KubeRay's env (`RAY_ADDRESS`, `RAY_CLUSTER_NAME`, ...) and,
  with `gcsFaultToleranceOptions`, what the operator injects for GCS fault tolerance (the head's
  `RAY_REDIS_ADDRESS`, `REDIS_PASSWORD`, `--redis-password`; the workers'
  `RAY_gcs_rpc_server_reconnect_timeout_s`);
- `serveConfigV2` is submitted as the operator submits it: as JSON, `PUT
  /api/serve/applications/` on the head's dashboard port, then polled until the application is
  RUNNING.

Every container is on one docker network with a fixed address (`fieldRef: status.podIP` resolves
to it) and the names of the Services in front of it as network aliases. Containers restart like
pods with `restartPolicy: Always` (docker's `unless-stopped`); a worker waits for the head's GCS
before it starts, as KubeRay's `wait-gcs-ready` init container does.

What Kubernetes does and this does not: probes (the runner polls instead), NetworkPolicy, the
Services' load balancing (clients pick a proxy: `ContainerCluster.serve_urls`), scheduling onto
nodes (every container runs on this machine; the engines are pinned to its cores by the profile).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

DOCKER = "/usr/bin/docker"
"""Debian's docker.io client, which `make image` installs (image/build.sh)."""
NETWORK = "macaron-cluster"
SUBNET = "172.30.77.0/24"
"""The cluster network's addresses; pods get .10 upwards in the order they are started."""
LABEL = "ai.macaron.cluster"
"""Every container, volume and network this module makes carries it: `down` removes them by it."""
HEAD_PORT = 6379
DASHBOARD_PORT = 8265
SERVE_PORT = 8000
AGENT_PORT = 52365
WORKER_GCS_RECONNECT_S = "600"
"""What KubeRay gives workers of a GCS fault-tolerant cluster: they wait this long for the head."""
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class ClusterError(RuntimeError):
    """The rendered chart cannot be run, or a container did not come up: says which and why."""


def docker(*args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout_s)
    if check and out.returncode != 0:
        raise ClusterError(f"docker {' '.join(args[:2])}: {out.stderr.strip()[-2000:]}")
    return out


@dataclass
class Pod:
    """One pod as a container: what `docker run` needs."""

    name: str
    group: str
    """The Ray group (head, api, ...) or `redis`."""
    image: str
    command: list[str]
    env: dict[str, str]
    ip: str
    aliases: list[str] = field(default_factory=list)
    memory: str | None = None
    cpus: str | None = None
    shm: str | None = None
    user: str | None = None
    read_only: bool = False
    volumes: dict[str, str] = field(default_factory=dict)
    """docker volume -> mount path."""

    def run_args(self, cluster: str) -> list[str]:
        args = ["run", "-d", "--name", self.name, "--hostname", self.name, "--network", NETWORK, "--ip", self.ip,
                "--restart", "unless-stopped", "--label", f"{LABEL}={cluster}", "--label", f"{LABEL}.group={self.group}"]
        for alias in self.aliases:
            args += ["--network-alias", alias]
        for flag, value in (("--memory", self.memory), ("--cpus", self.cpus), ("--shm-size", self.shm),
                            ("--user", self.user)):
            if value:
                args += [flag, value]
        if self.read_only:
            args.append("--read-only")
        for volume, path in self.volumes.items():
            args += ["-v", f"{volume}:{path}"]
        for key, value in self.env.items():
            args += ["-e", f"{key}={value}"]
        return [*args, "--entrypoint", self.command[0], self.image, *self.command[1:]]


# -- reading the rendered chart --------------------------------------------------------------------


def _quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity (`10Gi`, `384Mi`, `1G`) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    match = re.fullmatch(r"([0-9.]+)([KMGT]i?)?", str(text))
    if not match:
        raise ClusterError(f"not a memory quantity: {text!r}")
    return int(float(match.group(1)) * units.get(match.group(2) or "", 1))


def _cpus(text: str) -> str:
    text = str(text)
    return str(int(text[:-1]) / 1000) if text.endswith("m") else text


def convert_params(params: dict[str, Any]) -> str:
    """KubeRay's `convertParamMap`: flags sorted by name; "true" a bare flag, "false" left out
    (except the few options that take a boolean value), anything else `--key=value`."""
    special = ("log-color", "include-dashboard", "include-log-monitor")
    flags = []
    for key in sorted(params):
        value = str(params[key])
        if value.lower() in ("true", "false") and key not in special:
            if value.lower() == "true":
                flags.append(f"--{key}")
        else:
            flags.append(f"--{key}={value}")
    return " ".join(flags)


class Plan:
    """The rendered chart read as pods: `pods` in start order (Redis, the head, the workers)."""

    def __init__(self, manifests: list, *, image: str | None = None, redis_image: str | None = None,
                 subnet: str = SUBNET):
        self.secrets: dict[str, dict[str, str]] = {}
        self._hosts = iter(list(ipaddress.ip_network(subnet).hosts())[9:])
        self.pods: list[Pod] = []
        self.volumes: list[str] = []
        self.release = ""
        by_kind: dict[str, list[dict]] = {}
        for manifest in manifests:
            by_kind.setdefault(manifest.kind, []).append(manifest.obj)
        for secret in by_kind.get("Secret", []):
            data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
            data.update(secret.get("stringData") or {})
            self.secrets[secret["metadata"]["name"]] = data
        services = by_kind.get("Service", [])
        for sts in by_kind.get("StatefulSet", []):
            self.pods.append(self._statefulset_pod(sts, services, redis_image))
        rayservices = by_kind.get("RayService", [])
        if len(rayservices) != 1:
            raise ClusterError(f"the chart rendered {len(rayservices)} RayServices; this runs exactly one")
        rs = rayservices[0]
        self.name = rs["metadata"]["name"]
        self.serve_config: dict = yaml.safe_load(rs["spec"]["serveConfigV2"])
        self.head_service = f"{self.name}-head-svc"
        cluster = rs["spec"]["rayClusterConfig"]
        ft = cluster.get("gcsFaultToleranceOptions")
        head = cluster["headGroupSpec"]
        self.pods.append(self._ray_pod(f"{self.name}-head", "head", head, head=True, ft=ft, image=image))
        for group in cluster.get("workerGroupSpecs", []):
            for i in range(int(group.get("replicas", 1))):
                self.pods.append(self._ray_pod(f"{self.name}-{group['groupName']}-{i}", group["groupName"], group,
                                               head=False, ft=ft, image=image))

    # The pieces of a pod spec --------------------------------------------------------------------

    def _secret(self, ref: dict) -> str:
        try:
            return self.secrets[ref["name"]][ref["key"]]
        except KeyError:
            raise ClusterError(f"secretKeyRef {ref['name']}/{ref['key']}: the chart rendered no such Secret "
                               "(an existingSecret must be given to this runner as values)") from None

    def _env(self, container: dict, ip: str, pod_name: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = _expand(str(item["value"]), env)
                continue
            source = item.get("valueFrom") or {}
            if "secretKeyRef" in source:
                env[item["name"]] = self._secret(source["secretKeyRef"])
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                fields = {"status.podIP": ip, "metadata.name": pod_name, "status.hostIP": ip}
                if path not in fields:
                    raise ClusterError(f"env {item['name']}: fieldRef {path} is not one this runner resolves")
                env[item["name"]] = fields[path]
            else:
                raise ClusterError(f"env {item['name']}: only value, secretKeyRef and fieldRef are resolved here")
        return env

    @staticmethod
    def _limits(container: dict) -> tuple[str | None, str | None]:
        limits = (container.get("resources") or {}).get("limits") or {}
        memory = limits.get("memory")
        return (str(_quantity_bytes(memory)) if memory else None), (_cpus(limits["cpu"]) if "cpu" in limits else None)

    @staticmethod
    def _shm(spec: dict, container: dict) -> str | None:
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts") or []}
        for volume in spec.get("volumes") or []:
            dir_ = volume.get("emptyDir") or {}
            if mounts.get(volume["name"]) == "/dev/shm" and dir_.get("medium") == "Memory":
                return str(_quantity_bytes(dir_.get("sizeLimit", "64Mi")))
        return None

    def _statefulset_pod(self, sts: dict, services: list[dict], redis_image: str | None) -> Pod:
        spec = sts["spec"]["template"]["spec"]
        if len(spec["containers"]) != 1:
            raise ClusterError(f"{sts['metadata']['name']}: one container per pod is what this runs")
        container = spec["containers"][0]
        name = f"{sts['metadata']['name']}-0"
        ip = str(next(self._hosts))
        env = self._env(container, ip, name)
        labels = sts["spec"]["template"]["metadata"]["labels"]
        aliases = [s["metadata"]["name"] for s in services
                   if s["spec"].get("selector") and all(labels.get(k) == v for k, v in s["spec"]["selector"].items())]
        memory, cpus = self._limits(container)
        security = spec.get("securityContext") or {}
        user = f"{security['runAsUser']}:{security.get('runAsGroup', security['runAsUser'])}" \
            if "runAsUser" in security else None
        volumes = {}
        for claim in sts["spec"].get("volumeClaimTemplates") or []:
            mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
            volume = f"{name}-{claim['metadata']['name']}"
            volumes[volume] = mount
            self.volumes.append(volume)
        command = [*(container.get("command") or []), *[_expand(a, env) for a in container.get("args") or []]]
        read_only = bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem"))
        return Pod(name, "redis", redis_image or container["image"], command, env, ip, aliases, memory, cpus,
                   user=user, read_only=read_only, volumes=volumes)

    def _ray_pod(self, name: str, group: str, group_spec: dict, *, head: bool, ft: dict | None,
                 image: str | None) -> Pod:
        spec = group_spec["template"]["spec"]
        container = spec["containers"][0]
        ip = str(next(self._hosts))
        env = self._env(container, ip, name)
        params = dict(group_spec.get("rayStartParams") or {})
        # KubeRay's setMissingRayStartParams and setContainerEnvVars.
        params.setdefault("metrics-export-port", "8080")
        params.setdefault("dashboard-agent-listen-port", str(AGENT_PORT))
        params["block"] = "true"
        env.update(RAY_CLUSTER_NAME=self.name, RAY_PORT=str(HEAD_PORT), RAY_USAGE_STATS_KUBERAY_IN_USE="1",
                   RAY_USAGE_STATS_ENABLED="0")
        if head:
            params.setdefault("dashboard-host", "0.0.0.0")
            env["RAY_ADDRESS"] = f"127.0.0.1:{HEAD_PORT}"
        else:
            params.setdefault("address", f"{self.head_service}:{HEAD_PORT}")
            env.update(RAY_ADDRESS=f"{self.head_service}:{HEAD_PORT}", RAY_IP=self.head_service,
                       FQ_RAY_IP=self.head_service)
        if ft:
            if head:
                env.setdefault("RAY_external_storage_namespace", ft.get("externalStorageNamespace") or self.name)
                env["RAY_REDIS_ADDRESS"] = ft["redisAddress"]
                password = ft.get("redisPassword") or {}
                if "value" in password:
                    env["REDIS_PASSWORD"] = password["value"]
                elif "valueFrom" in password:
                    env["REDIS_PASSWORD"] = self._secret(password["valueFrom"]["secretKeyRef"])
                if "REDIS_PASSWORD" in env:
                    params["redis-password"] = "$REDIS_PASSWORD"
            else:
                env.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", WORKER_GCS_RECONNECT_S)
        start = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; ray start {'--head ' if head else ''}" \
                + convert_params(params)
        if not head:
            # KubeRay's wait-gcs-ready init container, in front of the worker's own command.
            start = (f"until ray health-check --address {self.head_service}:{HEAD_PORT} >/dev/null 2>&1; "
                     f"do sleep 2; done; {start}")
        env["KUBERAY_GEN_RAY_START_CMD"] = start
        memory, cpus = self._limits(container)
        return Pod(name, group, image or container["image"], ["/bin/bash", "-lc", "--", start], env, ip,
                   [self.head_service] if head else [], memory, cpus, shm=self._shm(spec, container))

    # What the cluster is -------------------------------------------------------------------------

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    def group(self, group: str) -> list[Pod]:
        return [p for p in self.pods if p.group == group]

    @property
    def head(self) -> Pod:
        return self.group("head")[0]


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in args and env values (an unknown name stays as written)."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


# -- running it --------------------------------------------------------------------------------------


class ContainerCluster:
    """The plan's pods as running containers: `up()` starts them and deploys the Serve config,
    `down()` removes every container, volume and network it made (also those of an earlier run)."""

    def __init__(self, plan: Plan, *, cluster: str = "macaron", log=print):
        self.plan, self.cluster, self.log = plan, cluster, log
        self.timings: dict[str, float] = {}
        self.idle_memory: dict[str, int] = {}
        """Each container's memory once the application is RUNNING, before any request (set by the caller)."""

    # Bring-up --------------------------------------------------------------------------------------

    def up(self, timeout_s: float = 600) -> None:
        started = time.monotonic()
        self.down()
        docker("network", "create", "--subnet", SUBNET, "--label", f"{LABEL}={self.cluster}", NETWORK)
        for volume in self.plan.volumes:
            docker("volume", "create", "--label", f"{LABEL}={self.cluster}", volume)
        for pod in self.plan.group("redis"):
            self._prepare_volumes(pod)
            self.start(pod)
        for pod in self.plan.group("redis"):
            self.wait_redis(pod)
        self.start(self.plan.head)
        self.wait_gcs(timeout_s=120)
        for pod in self.plan.pods:
            if pod.group not in ("redis", "head"):
                self.start(pod)
        self.wait_nodes(len([p for p in self.plan.pods if p.group != "redis"]), timeout_s=180)
        self.timings["nodes_s"] = round(time.monotonic() - started, 1)
        self.deploy()
        self.wait_running(timeout_s=timeout_s)
        self.timings["up_s"] = round(time.monotonic() - started, 1)

    def _prepare_volumes(self, pod: Pod) -> None:
        """A new volume belongs to root; Kubernetes' fsGroup gives it to the pod's user."""
        if pod.user and pod.volumes:
            mounts = [a for v, p in pod.volumes.items() for a in ("-v", f"{v}:{p}")]
            docker("run", "--rm", "--user", "0:0", *mounts, "--entrypoint", "chown", pod.image, "-R", pod.user,
                   *pod.volumes.values())

    def start(self, pod: Pod) -> None:
        """Runs the pod's container (a new one: what the operator does for a lost pod)."""
        docker("rm", "-f", pod.name, check=False)
        docker(*pod.run_args(self.cluster))

    def kill(self, pod: Pod) -> None:
        """SIGKILL the whole container: the node is gone, as a machine that loses power."""
        docker("kill", pod.name)

    def restart(self, pod: Pod) -> None:
        """The same container again (the kubelet restarting a pod's container)."""
        docker("start", pod.name)

    def restart_container(self, pod: Pod) -> None:
        """SIGTERM, then the same container started again."""
        docker("restart", "-t", "10", pod.name, timeout_s=60)

    def disconnect(self, pod: Pod) -> None:
        docker("network", "disconnect", "--force", NETWORK, pod.name)

    def reconnect(self, pod: Pod) -> None:
        args = ["network", "connect", "--ip", pod.ip]
        for alias in pod.aliases:
            args += ["--alias", alias]
        docker(*args, NETWORK, pod.name)

    def exec(self, pod: Pod, *command: str, timeout_s: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        return docker("exec", pod.name, *command, timeout_s=timeout_s, check=check)

    def running(self, pod: Pod) -> bool:
        out = docker("inspect", "-f", "{{.State.Running}}", pod.name, check=False)
        return out.stdout.strip() == "true"

    def wait_redis(self, pod: Pod, timeout_s: float = 60) -> None:
        self._wait(lambda: self.exec(pod, "sh", "-c", f"redis-cli -a \"$REDISCLI_AUTH\" --no-auth-warning "
                                     f"-p {HEAD_PORT} ping", check=False).stdout.strip() == "PONG",
                   timeout_s, f"{pod.name} did not answer PING", pod)

    def wait_gcs(self, timeout_s: float = 120) -> None:
        head = self.plan.head
        self._wait(lambda: self.exec(head, "ray", "health-check", "--address", f"127.0.0.1:{HEAD_PORT}",
                                     check=False, timeout_s=30).returncode == 0,
                   timeout_s, "the head's GCS did not come up", head)

    def nodes(self) -> list[dict]:
        """Ray's alive nodes, from the head's dashboard."""
        r = httpx.get(f"{self.dashboard_url}/nodes?view=summary", timeout=10)
        r.raise_for_status()
        return [n for n in r.json()["data"]["summary"] if n.get("raylet", {}).get("state") == "ALIVE"]

    def wait_nodes(self, count: int, timeout_s: float = 180) -> None:
        def alive() -> bool:
            try:
                return len(self.nodes()) >= count
            except httpx.HTTPError:
                return False
        self._wait(alive, timeout_s, f"fewer than {count} Ray nodes joined", self.plan.head)

    def deploy(self) -> None:
        """serveConfigV2, as KubeRay submits it: JSON, PUT on the dashboard's Serve API."""
        r = httpx.put(f"{self.dashboard_url}/api/serve/applications/", json=self.plan.serve_config, timeout=60)
        if r.status_code >= 300:
            raise ClusterError(f"PUT /api/serve/applications/: {r.status_code} {r.text[-2000:]}")

    def applications(self) -> dict:
        r = httpx.get(f"{self.dashboard_url}/api/serve/applications/", timeout=10)
        r.raise_for_status()
        return r.json().get("applications") or {}

    def app_running(self) -> bool:
        """KubeRay's check: every application of the config RUNNING (and at least one)."""
        try:
            apps = self.applications()
        except httpx.HTTPError:
            return False
        names = [a["name"] for a in self.plan.serve_config["applications"]]
        return bool(apps) and all((apps.get(n) or {}).get("status") == "RUNNING" for n in names)

    def wait_running(self, timeout_s: float = 600) -> None:
        def running() -> bool:
            apps = {}
            try:
                apps = self.applications()
            except httpx.HTTPError:
                pass
            failed = [f"{n}: {a.get('message', '')[-1500:]}" for n, a in apps.items() if a.get("status") == "DEPLOY_FAILED"]
            if failed:
                raise ClusterError("the Serve application failed to deploy: " + "; ".join(failed))
            return self.app_running()
        self._wait(running, timeout_s, "the Serve application is not RUNNING", self.plan.head)

    def healthy(self) -> bool:
        """Every container running, the application RUNNING and each deployment HEALTHY."""
        if not all(self.running(p) for p in self.plan.pods):
            return False
        try:
            apps = self.applications()
        except httpx.HTTPError:
            return False
        return self.app_running() and all(d.get("status") == "HEALTHY" for a in apps.values()
                                           for d in (a.get("deployments") or {}).values())

    def wait_all_running(self, timeout_s: float = 600) -> None:
        self._wait(self.healthy, timeout_s, "the cluster is not healthy again", self.plan.head)

    def _wait(self, ready, timeout_s: float, what: str, pod: Pod) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                logs = docker("logs", "--tail", "40", pod.name, check=False)
                raise ClusterError(f"{what} within {timeout_s:.0f} s; {pod.name}'s log ends:\n"
                                   f"{(logs.stdout + logs.stderr)[-3000:]}")
            time.sleep(1.0)

    # Where to reach it -----------------------------------------------------------------------------

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.plan.head.ip}:{DASHBOARD_PORT}"

    def serve_urls(self) -> list[str]:
        """The Serve proxies KubeRay's serve Service would send clients to: every node that runs
        an ingress replica (the head runs none in the CPU cluster)."""
        groups = {p.group for p in self.plan.pods} - {"redis", "head"}
        api = [p for p in self.plan.pods if p.group == "api"] or [p for p in self.plan.pods if p.group in groups]
        return [f"http://{p.ip}:{SERVE_PORT}" for p in api]

    def redis_url(self) -> str:
        """The store's URL as the pods get it (the Secret's), with the Redis container's address."""
        redis = self.plan.group("redis")[0]
        password = redis.env.get("REDISCLI_AUTH", "")
        return f"redis://:{password}@{redis.ip}:{HEAD_PORT}/0"

    def memory(self) -> dict[str, int]:
        """Each container's memory use (cgroup), bytes."""
        out = docker("stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}}",
                     *[p.name for p in self.plan.pods], timeout_s=60)
        usage = {}
        for line in out.stdout.splitlines():
            name, used = line.split(" ", 1)
            usage[name] = _docker_bytes(used.split("/")[0].strip())
        return usage

    # Tear-down -----------------------------------------------------------------------------------

    def down(self) -> None:
        ids = docker("ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split()
        if ids:
            docker("rm", "-f", "-v", *ids, timeout_s=180)
        volumes = docker("volume", "ls", "-q", "--filter", f"label={LABEL}", check=False).stdout.split()
        if volumes:
            docker("volume", "rm", "-f", *volumes)
        if docker("network", "inspect", NETWORK, check=False).returncode == 0:
            docker("network", "rm", NETWORK)


def _docker_bytes(text: str) -> int:
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "kB": 10**3, "MB": 10**6, "GB": 10**9}
    match = re.fullmatch(r"([0-9.]+)\s*([A-Za-z]+)", text)
    return int(float(match.group(1)) * units[match.group(2)]) if match else 0


def render_plan(values_files: list[Path], sets: list[str] = (), *, image: str | None = None,
                redis_image: str | None = None, release: str = "macaron") -> Plan:
    """The chart rendered with `values_files` and `sets`, read as pods."""
    from macaron_ray import k8s

    values = k8s.load_values([Path(p) for p in values_files], list(sets))
    return Plan(k8s.render(values, release=release), image=image, redis_image=redis_image)


DEFAULT_VALUES = Path(__file__).resolve().parents[2] / "k8s" / "macaron" / "values-cpu.yaml"


def local_image() -> str:
    """The image `make image` builds (macaron-ray:<version>-cpu): its base holds Debian's
    redis-server, which runs the chart's Redis pod where no registry image can be pulled."""
    from importlib.metadata import version

    return f"macaron-ray:{version('macaron-ray')}-cpu"


def describe(cluster: ContainerCluster) -> str:
    lines = [f"{p.name:<22} {p.ip:<14} {p.group}" for p in cluster.plan.pods]
    lines += ["", f"up in {cluster.timings.get('up_s')} s", "serve (OpenAI and Anthropic surfaces):"]
    lines += [f"  {url}/v1" for url in cluster.serve_urls()]
    lines += [f"Ray dashboard: {cluster.dashboard_url}", "down: macaron cluster down --containers"]
    return "\n".join(lines)
