"""A real Prometheus (Debian's `prometheus`, installed by `make install`) on loopback, for the tests
that check the metrics and every dashboard query against it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from macaron_ray.engine.local_server import free_port
from macaron_ray.observability.dashboards import RATE, all_dashboards

SCRAPE_INTERVAL_S = 1


class PrometheusServer:
    """Scrapes `targets` (host:port, path /metrics) every second, or the targets of a service
    discovery file (`file_sd`: Ray's prom_metrics_service_discovery.json); stopped on exit."""

    def __init__(self, targets: list[str], workdir: Path, file_sd: Path | None = None):
        self.targets, self.file_sd = targets, file_sd
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "PrometheusServer":
        binary = shutil.which("prometheus")
        assert binary, "prometheus is installed by `make install` (Debian package prometheus)"
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": "5s"},
            "scrape_configs": [{"job_name": "macaron", "static_configs": [{"targets": self.targets}]}
                               if self.file_sd is None else
                               {"job_name": "ray", "file_sd_configs": [{"files": [str(self.file_sd)],
                                                                        "refresh_interval": "5s"}]}],
        }))
        log = open(self.workdir / "prometheus.log", "wb")
        self._proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={self.workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self._proc.poll() is None, (self.workdir / "prometheus.log").read_text()[-3000:]
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise TimeoutError("prometheus did not become ready")

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def query(self, expr: str) -> list[dict]:
        """An instant query; raises on a PromQL error."""
        resp = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=30)
        body = resp.json()
        assert body.get("status") == "success", (expr, body)
        return body["data"]["result"]

    def scalar(self, expr: str) -> float:
        """A one-series query's value (0 when it has no series)."""
        result = self.query(expr)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else 0.0

    def wait_for(self, expr: str, want: float, timeout_s: float) -> float:
        """Poll `expr` until it reaches `want` (Ray exports on an interval); returns the last value."""
        deadline = time.monotonic() + timeout_s
        value = self.scalar(expr)
        while value < want and time.monotonic() < deadline:
            time.sleep(1)
            value = self.scalar(expr)
        return value

    def targets_up(self) -> bool:
        active = httpx.get(self.url + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)


def panel_queries(uids: tuple[str, ...] | None = None):
    """(dashboard uid, panel title, Query) for every query of every dashboard (or of `uids`)."""
    for spec in all_dashboards():
        if uids is None or spec.uid in uids:
            for panel in spec.panels():
                for query in panel.queries:
                    yield spec.uid, panel.title, query


def evaluate_every_panel(prom: PrometheusServer, window: str, uids: tuple[str, ...] | None = None) -> list[str]:
    """Run every panel query (Grafana's rate window replaced by `window`); returns what failed: a
    query with no series, or a non-rare query whose own expression has none (`or vector(0)`
    must not hide a metric that is missing)."""
    missing = []
    for uid, title, query in panel_queries(uids):
        if not prom.query(query.promql.replace(RATE, window)):
            missing.append(f"{uid} / {title}: {query.promql}")
        elif not query.rare and not prom.query(query.expr.replace(RATE, window)):
            missing.append(f"{uid} / {title} (no series of its own): {query.expr}")
    return missing
