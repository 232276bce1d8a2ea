"""The CPU image as a user runs it: it holds what it says, keeps no package source, and serves."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import anthropic
import httpx
import openai

from macaron_ray.engine.local_server import free_port
from tests.cluster.conftest import docker

PUBLIC = "Macaron-V1-Venti"


def test_the_image_runs_as_a_user_with_the_pinned_stack_and_the_base_prepared(image):
    config = json.loads(docker("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "ray" and "HF_HUB_OFFLINE=1" in config["Env"]
    probe = ("import json, vllm, ray, nixl, torch, macaron_ray; from macaron_ray.model.prepare import "
             "base_model_dir, is_prepared; print(json.dumps([vllm.__version__, ray.__version__, torch.__version__, "
             "is_prepared(base_model_dir())]))")
    out = docker("run", "--rm", image, "python", "-c", probe, timeout_s=300).stdout
    assert json.loads(out.strip().splitlines()[-1]) == ["0.29.0", "2.60.0", "2.13.0+cpu", True]


def test_no_package_source_of_the_build_host_is_in_the_image(image):
    """The build host's pip index, find-links and certificate went in as build secrets only."""
    host = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    values = [line.split("=", 1)[1].strip("'\"") for line in host.splitlines() if "=" in line]
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    inspect = docker("image", "inspect", image).stdout
    listing = docker("run", "--rm", image, "sh", "-c", "ls /etc/pip.conf /run/secrets 2>&1; cat /etc/apt/sources.list "
                     "/etc/apt/sources.list.d/* 2>&1", timeout_s=120, check=False).stdout
    for value in values:
        if "://" in value or value.startswith("/opt/"):
            assert value not in history and value not in inspect and value not in listing, value
    assert "No such file" in listing and "deb " not in listing


def test_the_image_serves_the_three_surfaces(image):
    """`macaron serve --standalone` in a container: its engine and API on the embedded base, the
    official SDKs from the host."""
    port, name = free_port(), f"macaron-serve-{free_port()}"
    docker("run", "-d", "--name", name, "--shm-size=1g", "-p", f"127.0.0.1:{port}:8000", image,
           "macaron", "serve", "--standalone", "--host", "0.0.0.0", "--port", "8000", "--cores", "0-1")
    try:
        url, started = f"http://127.0.0.1:{port}", time.monotonic()
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() - started < 300, docker("logs", name, check=False).stdout[-3000:]
            time.sleep(1)
        print(f"serving {time.monotonic() - started:.0f} s after docker run")
        with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
            chat = client.chat.completions.create(model=PUBLIC, max_tokens=16, messages=[
                {"role": "user", "content": "Write a Python function that reverses a string."}])
            assert chat.choices[0].message.content.strip() and chat.model == PUBLIC
            response = client.responses.create(model=PUBLIC, input="Hi! How are you today?", max_output_tokens=16)
            assert response.output_text.strip()
        with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as claude:
            message = claude.messages.create(model=PUBLIC, max_tokens=16,
                                             messages=[{"role": "user", "content": "Say hello to Ana."}])
            assert message.content[0].text.strip()
    finally:
        docker("rm", "-f", name, check=False)
    assert name not in docker("ps", "-a", "--format", "{{.Names}}").stdout
