"""The CPU image: it holds what it says and keeps no package source. That it serves, as the chart's
pods, is test_pods.py's."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cluster.conftest import docker


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

