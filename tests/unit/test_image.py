"""The image's files, without building them: what they pin agrees with the project and the chart, and
no package source is written into them (`make image` passes the host's in as build secrets)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
VERSION = PROJECT["version"]


def _pin(requirements: list[str], name: str) -> str:
    return next(r.split("==", 1)[1] for r in requirements if re.match(rf"{re.escape(name)}(\[.*\])?==", r))


def test_the_gpu_image_starts_from_ray_llm_at_the_pinned_ray_version():
    ray = _pin(PROJECT["optional-dependencies"]["gpu"], "ray")
    assert ray == _pin(PROJECT["optional-dependencies"]["cpu"], "ray")
    (base,) = re.findall(r"^FROM (\S+)", (ROOT / "image" / "gpu.Dockerfile").read_text(), re.M)
    assert re.fullmatch(rf"rayproject/ray-llm:{re.escape(ray)}-py311-cu\d+", base), base
    values = yaml.safe_load((ROOT / "k8s" / "macaron" / "values.yaml").read_text())
    assert values["rayVersion"] == ray


def test_the_cpu_image_installs_what_make_install_does():
    dockerfile = (ROOT / "image" / "cpu.Dockerfile").read_text()
    install = (ROOT / "scripts" / "install.sh").read_text()
    (torch,) = re.findall(r"^TORCH=(\S+)", install, re.M)
    assert f'"{torch}"' in dockerfile
    build = (ROOT / "image" / "build.sh").read_text()
    assert "p['dependencies'] + p['optional-dependencies']['cpu']" in build  # what make install takes
    assert 'REQUIREMENTS="$REQUIREMENTS"' in build and "ARG REQUIREMENTS" in dockerfile
    assert all(" " not in r for r in PROJECT["dependencies"] + PROJECT["optional-dependencies"]["cpu"])
    assert "uninstall -q -y torchvision torchaudio torchcodec" in dockerfile


def test_the_chart_names_the_images_make_image_builds():
    for values, flavor in (("values-cpu.yaml", "cpu"), ("values-tall-h20.yaml", "gpu"),
                           ("values-venti-b300.yaml", "gpu")):
        image = yaml.safe_load((ROOT / "k8s" / "macaron" / values).read_text())["image"]
        assert (image["repository"], image["tag"]) == ("macaron-ray", f"{VERSION}-{flavor}"), values
    build = (ROOT / "image" / "build.sh").read_text()
    assert 'IMAGE=${IMAGE:-macaron-ray:$VERSION-cpu}' in build


def test_no_package_source_is_written_into_the_image_files():
    """Sources come from the host at build time; only loopback (the build's own wheel server) is named."""
    for path in sorted((ROOT / "image").iterdir()):
        for url in re.findall(r"[a-z+]+://[^\s\"'/]+", path.read_text()):
            assert url.startswith("http://127.0.0.1"), (path.name, url)
    dockerfile = (ROOT / "image" / "cpu.Dockerfile").read_text()
    assert "COPY" not in "\n".join(line for line in dockerfile.splitlines() if "pip.conf" in line)
    assert dockerfile.count("--mount=type=secret,id=pipconf,target=/etc/pip.conf") == 2


def test_the_build_context_leaves_out_what_is_built_or_cached_here():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".bench", "tests"} <= set(ignored)
