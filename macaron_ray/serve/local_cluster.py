"""A Ray cluster on this machine, for `macaron serve`, the serve tests and `macaron bench pd`.

`LocalRayCluster` runs `ray start` for the node groups of a cluster definition
(`cluster/local-cpu.yaml`: the head, and a worker for the two-node tests), each
node with the flags the definition renders (its node-type resource
`macaron_node_<type>` among them) plus this machine's ports on loopback, and
kills its session's processes when it closes. Applications go on it the way they go on a real
cluster: `serve deploy <profile.yaml>` through the dashboard's REST API. All
nodes share one session directory (`session_dir`), which names the processes
the memory figures count.

Ray's CPU count is a scheduling budget, not cores: engines are pinned to cores
by the profile (`cpu_cores`), and the head advertises enough logical CPUs for
Serve's actors and the engines' placement groups to fit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import yaml

from macaron_ray.cluster import ClusterSpec, NodeGroup
from macaron_ray.engine.local_server import free_port

RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # Every port of a local cluster is bound to loopback; token auth would only make each
    # `serve` and `ray` call here carry a token file.
    "RAY_AUTH_MODE": "disabled",
    # Idle Ray workers keep whatever they imported (torch, vLLM: ~0.7 GB each); let them go.
    "RAY_num_workers_soft_limit": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
}
RAY_START_TIMEOUT_S = 180
"""A `ray start` that has not returned by then has failed (a port taken, a stuck raylet)."""


@dataclass
class LocalRayCluster:
    nodes: list[NodeGroup] = field(default_factory=lambda: [ClusterSpec.named("local-cpu").head])
    """Node groups from a cluster definition; the first is the head. Each group starts `replicas` nodes."""
    temp_dir: Path | None = None
    gcs_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    log_path: Path | None = None
    metrics_ports: list[int] = field(default_factory=list, init=False)
    """Each node's metrics export port (the head's first), filled by `start()`."""
    session_dir: Path | None = field(default=None, init=False)
    """This cluster's Ray session directory, set once the head has started."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _ray(self, *args: str) -> None:
        ray_bin = str(Path(sys.executable).with_name("ray"))
        env = {**os.environ, **RAY_ENV}
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            # A session of its own: Ctrl-C in the terminal reaches this process group only, so
            # `stop()` still finds the cluster's processes (engines included) alive and whole.
            proc = subprocess.run([ray_bin, *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=RAY_START_TIMEOUT_S, start_new_session=True)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        if proc.returncode != 0:
            raise RuntimeError(f"`ray {args[0]}` failed with {proc.returncode}"
                               + (f"; see {self.log_path}" if self.log_path else ""))

    def _start_args(self, group: NodeGroup, *, head: bool, metrics_port: int) -> list[str]:
        """The definition's own `ray start` flags, with this machine's ports and loopback."""
        args = [a for a in group.ray_start_args(head_address=None if head else self.address)
                if not a.startswith("--port=")]
        args += ["--node-ip-address", "127.0.0.1", "--metrics-export-port", str(metrics_port)]
        if head:
            args += ["--port", str(self.gcs_port), "--dashboard-host", "127.0.0.1",
                     "--dashboard-port", str(self.dashboard_port), "--disable-usage-stats"]
            if self.temp_dir:
                args += ["--temp-dir", str(self.temp_dir)]
        return args

    def start(self) -> "LocalRayCluster":
        """Start every node; if any step fails, stop what started."""
        head, *workers = self.nodes
        latest = (self.temp_dir or Path("/tmp/ray")) / "session_latest"
        began = time.time()
        try:
            self._ray("start", *self._start_args(head, head=True, metrics_port=self.metrics_port))
        except BaseException:
            # A head that failed half-way may have left daemons of a new session behind.
            if latest.is_symlink() and latest.lstat().st_mtime >= began:
                self.session_dir = latest.resolve()
                self.stop()
            raise
        # Pinned now: a later cluster would move `session_latest`.
        self.session_dir = latest.resolve()
        try:
            self.metrics_ports = [self.metrics_port]
            for group in workers:
                for _ in range(group.replicas):
                    self.metrics_ports.append(free_port())
                    self._ray("start", *self._start_args(group, head=False, metrics_port=self.metrics_ports[-1]))
            self._wait_dashboard()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_dashboard(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.dashboard_url}/api/version", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError("the Ray dashboard did not come up")

    def metrics_text(self) -> str:
        """Every node's Prometheus exposition (each node exports its own processes' metrics)."""
        return "\n".join(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                         for port in self.metrics_ports)

    def stop(self) -> None:
        """End every process of this cluster (see `end_session`); returns once they are gone."""
        if self.session_dir is not None:
            end_session(self.session_dir.name)

    def __enter__(self) -> "LocalRayCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- Serve -------------------------------------------------------------------------------

    def serve_deploy(self, config: Path) -> None:
        """`serve deploy config` against this cluster (returns once the config is accepted)."""
        serve_bin = str(Path(sys.executable).with_name("serve"))
        proc = subprocess.run([serve_bin, "deploy", str(config), "-a", self.dashboard_url],
                              env={**os.environ, **RAY_ENV}, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"serve deploy failed: {proc.stderr[-2000:]}")

    def serve_status(self) -> dict:
        resp = httpx.get(f"{self.dashboard_url}/api/serve/applications/", timeout=10)
        resp.raise_for_status()
        return resp.json()

    def wait_running(self, app: str, deployments: set[str] | None = None, timeout_s: float = 600) -> dict:
        """Block until `app` is RUNNING with every deployment HEALTHY (and, if given, exactly
        `deployments`, so a redeploy is not mistaken for the config it replaces); fail fast on
        DEPLOY_FAILED."""
        deadline = time.monotonic() + timeout_s
        status: dict = {}
        while time.monotonic() < deadline:
            status = self.serve_status().get("applications", {}).get(app, {})
            if status.get("status") == "DEPLOY_FAILED":
                raise RuntimeError(f"{app} failed to deploy: {status.get('message', '')[-3000:]}")
            current = status.get("deployments") or {}
            if (status.get("status") == "RUNNING" and all(d["status"] == "HEALTHY" for d in current.values())
                    and (deployments is None or set(current) == deployments)):
                return status
            time.sleep(2)
        raise TimeoutError(f"{app} not RUNNING after {timeout_s:.0f} s: {str(status)[-2000:]}")

    def serve_shutdown(self) -> None:
        httpx.delete(f"{self.dashboard_url}/api/serve/applications/", timeout=60).raise_for_status()


def end_session(session_name: str, timeout_s: float = 30) -> None:
    """SIGKILL every process of one Ray session, as `ray stop --force` does, and return once
    they are gone.

    The set is taken before anything dies: vLLM's engine processes are children of Serve
    replicas and would be orphaned, out of reach, once their parents are gone. Only this
    session's processes are touched (another Ray cluster on the machine is left alone), and
    the `ray` CLI is not needed: on a machine whose cores are busy it can take minutes just
    to import itself.
    """
    from macaron_ray.bench.memory import session_processes

    procs = session_processes(session_name)
    groups = set()
    for proc in procs:
        try:
            groups.add(os.getpgid(proc.pid))
        except OSError:
            pass  # already gone
    groups.discard(os.getpgrp())
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    for group in groups:  # anything a replica forked after the list was taken
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + timeout_s
    alive = procs
    while alive and time.monotonic() < deadline:
        _, alive = psutil.wait_procs(alive, timeout=0.5)
        # An orphan that has exited waits for init to reap it: it holds nothing.
        alive = [p for p in alive if _status(p) not in (psutil.STATUS_ZOMBIE, None)]
    if alive:
        raise RuntimeError(f"processes of {session_name} outlived SIGKILL: {[p.pid for p in alive]}")


def _status(proc: psutil.Process) -> str | None:
    try:
        return proc.status()
    except psutil.Error:
        return None


def serve_config_with(path: Path, out: Path, *, port: int | None = None,
                      role_updates: dict[str, dict] | None = None, args_updates: dict | None = None) -> Path:
    """A copy of the `serve deploy` file at `path` with another HTTP port, some top-level args
    replaced (`args_updates`, e.g. another store) and some engine roles' fields replaced (roles
    the profile does not have are skipped)."""
    doc = yaml.safe_load(Path(path).read_text())
    if port is not None:
        doc.setdefault("http_options", {})["port"] = port
    args = doc["applications"][0]["args"]
    args.update(args_updates or {})
    for role, fields in (role_updates or {}).items():
        if args.get(role) is not None:
            args[role].update(fields)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out
