"""Container tier: the project's image, built by `make image` and run as containers on this machine.

Every container the tier starts is removed by it, also when a test fails; a Docker daemon the tier
had to start is stopped again at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = "/usr/bin/docker"
"""Debian's docker.io client (20.10), which `make image` installs: it builds with BuildKit in dockerd."""
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"macaron-ray:{VERSION}-cpu"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


def docker(*args: str, timeout_s: float = 120, check: bool = True, input_text: str | None = None
           ) -> subprocess.CompletedProcess:
    out = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout_s, input=input_text)
    if check and out.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])}: {out.stderr[-2000:]}")
    return out


def _daemon_up() -> bool:
    return shutil.which(DOCKER) is not None and subprocess.run(
        [DOCKER, "info"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    """`make image` (cached layers make a second run take seconds); the image's name."""
    started_daemon = not _daemon_up()
    started = time.monotonic()
    out = subprocess.run(["make", "image"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    print(f"make image: {time.monotonic() - started:.0f} s")
    try:
        yield IMAGE
    finally:
        if started_daemon and Path("/var/run/docker.pid").exists():
            os.kill(int(Path("/var/run/docker.pid").read_text()), signal.SIGTERM)


@pytest.fixture(scope="package")
def pods(image) -> Iterator:
    """The chart (values-cpu.yaml) as containers of the image: `macaron cluster up --containers`,
    shared by the pod tests; removed when this tier ends (containers, volumes, network), whatever
    happened, before the next tier starts: its engines are pinned to the cores the others use."""
    from macaron_ray.cluster import containers

    plan = containers.render_plan([containers.DEFAULT_VALUES], redis_image=image, image=image)
    cluster = containers.ContainerCluster(plan)
    try:
        cluster.up(timeout_s=600)
        print("cluster up:", cluster.timings)
        cluster.idle_memory = cluster.memory()
        yield cluster
    finally:
        cluster.down()
        left = [docker(*args, check=False).stdout.split() for args in (
            ("ps", "-aq", "--filter", f"label={containers.LABEL}"),
            ("volume", "ls", "-q", "--filter", f"label={containers.LABEL}"),
            ("network", "ls", "-q", "--filter", f"name=^{containers.NETWORK}$"))]
        assert left == [[], [], []], f"the container cluster left {left}"


@pytest.fixture(scope="package")
def report(pods) -> dict:
    """The tier's figures, written to .bench/cluster.json each time a test adds some (`write()`)."""
    figures: dict = {"up": pods.timings, "faults": []}

    def write() -> None:
        (ROOT / ".bench").mkdir(exist_ok=True)
        (ROOT / ".bench" / "cluster.json").write_text(
            json.dumps({k: v for k, v in figures.items() if k != "write"}, indent=2) + "\n")
    figures["write"] = write
    return figures
