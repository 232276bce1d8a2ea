"""`make serve`'s command: the local-cpu profile on a local Ray cluster, answering until stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from macaron_ray.engine.local_server import free_port
from macaron_ray.serve.local_cluster import end_session

ROOT = Path(__file__).resolve().parents[2]


def test_macaron_serve_answers_then_stops_cleanly(tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    cmd = [str(Path(sys.executable).with_name("macaron")), "serve", "--port", str(port)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while "curl" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-4000:]
            time.sleep(2)
        banner = log.read_text()
        assert f"http://127.0.0.1:{port}/v1" in banner, banner[-4000:]
        # The printed curl example, run as printed.
        curl = re.search(r"curl .*?\}'", banner.replace("\\\n", ""), re.S).group(0)
        out = subprocess.run(["bash", "-c", curl + " --silent --show-error --max-time 300"],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert '"model":"Macaron-V1-Venti"' in out.stdout.replace(" ", ""), out.stdout
        assert '"content":' in out.stdout
        # The printed metrics URL (Ray's export port) shows that turn within a few export intervals.
        metrics_url = re.search(r"metrics \(Prometheus[^)]*\): (\S+)", log.read_text()).group(1)
        deadline = time.monotonic() + 90
        while "ray_macaron_turn_seconds_count" not in httpx.get(metrics_url, timeout=10).text:
            assert time.monotonic() < deadline, "the served turn never reached Ray's metrics port"
            time.sleep(3)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(180)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            end_session(Path("/tmp/ray/session_latest").resolve().name)  # what it left running
            raise
    assert proc.returncode == 0, log.read_text()[-4000:]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    # Exited processes whose parent died wait for init to reap them: they do not count.
    engines = [p.pid for p in psutil.process_iter(["name", "status"])
               if (p.info["name"] or "").startswith("VLLM::") and p.info["status"] != psutil.STATUS_ZOMBIE]
    assert not engines, f"engine processes outlived `macaron serve`: {engines}"
