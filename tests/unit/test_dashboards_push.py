"""`macaron dashboards push` through grafana-client, against a stand-in for Grafana's HTTP API on loopback
(no Grafana package installs here; the stand-in records what a real one would receive)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from macaron_ray.cli import main
from macaron_ray.observability.dashboards import all_dashboards, render


class FakeGrafana(BaseHTTPRequestHandler):
    calls: list[tuple[str, str, dict | None, str | None]] = []

    def _reply(self, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> dict | None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.calls.append((self.command, self.path, body, self.headers.get("Authorization")))
        return body

    def do_GET(self):
        self._record()
        self._reply([] if self.path.startswith("/api/folders") else {})

    def do_POST(self):
        body = self._record()
        if self.path == "/api/folders":
            self._reply({"uid": "f1", "title": body["title"]})
        else:
            uid = body["dashboard"]["uid"]
            self._reply({"status": "success", "uid": uid, "url": f"/d/{uid}/x", "version": 1})

    def log_message(self, *args):
        pass


@pytest.fixture
def grafana():
    FakeGrafana.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeGrafana)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_push_uploads_every_dashboard_into_its_folder_with_the_token(grafana, monkeypatch, capsys):
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_test")
    assert main(["dashboards", "push", "--url", grafana, "--folder", "macaron-ray"]) == 0
    posts = [(path, body, auth) for method, path, body, auth in FakeGrafana.calls if method == "POST"]
    assert posts[0][0] == "/api/folders" and posts[0][1]["title"] == "macaron-ray"
    uploads = [body for path, body, _ in posts if path == "/api/dashboards/db"]
    assert [u["dashboard"] for u in uploads] == [render(spec) for spec in all_dashboards()]
    assert all(u["overwrite"] is True and u["folderUid"] == "f1" for u in uploads)
    assert {auth for _, _, auth in posts} == {"Bearer glsa_test"}
    assert capsys.readouterr().out.split() == [f"{grafana}/d/{s.uid}/x" for s in all_dashboards()]
