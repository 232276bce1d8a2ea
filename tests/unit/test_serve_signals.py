"""`macaron serve --standalone` stops the engine it started on SIGTERM, as on Ctrl-C.

The engine is a stand-in that records its stop (a real one takes minutes to start
on CPU); uvicorn, the signal handling and the command's own code are real. Before
the fix SIGTERM ended the process inside uvicorn and the engine ran on, orphaned.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

SCRIPT = """
import sys
from pathlib import Path
from types import SimpleNamespace

from fastapi import FastAPI

from macaron_ray import cli
import macaron_ray.api.standalone as standalone

marker = Path(sys.argv[1])


class Engine:
    spec = SimpleNamespace(cores="0", base_url="http://127.0.0.1:9", model_dir=Path("."), max_model_len=4096)

    def start(self):
        marker.write_text("started")

    def stop(self):
        marker.write_text("stopped")


cli._local_server = lambda *a, **kw: Engine()
app = FastAPI()
app.get("/health")(lambda: {"status": "ok"})
standalone.build_standalone_app = lambda *a, **kw: app
sys.exit(cli._serve(cli.build_parser().parse_args(["serve", "--standalone", "--port", sys.argv[2]])))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_engine_the_standalone_server_started(tmp_path, sig):
    marker, port = tmp_path / "engine", _free_port()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(marker), str(port)],
                            cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
            time.sleep(0.1)
        assert marker.read_text() == "started"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert marker.read_text() == "stopped", out.decode()
    assert proc.returncode in (0, 130, -signal.SIGINT), out.decode()
