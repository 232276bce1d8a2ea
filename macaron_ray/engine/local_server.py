"""A vLLM OpenAI-compatible server on this machine: the base plus the built adapters.

Used by `make serve` (until the MoL application takes over), by the routing
benchmark and by the end-to-end tests. The server runs as a subprocess pinned
to the cores it is given (`VLLM_CPU_OMP_THREADS_BIND`): unpinned CPU engines
spin threads on every core and run many times slower. It is started with
`python -m vllm.entrypoints.openai.api_server` because the `vllm` console script
does not resolve under the `vllm-cpu` distribution.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from macaron_ray.adapters.manifest import BUILT_DIR, Manifest
from macaron_ray.model.chat_template import CHAT_TEMPLATE_PATH

TOOL_CALL_PARSER = "pythonic"
"""SmolLM2 has no single tool-call token, so a plain-text format (ENGINE_NOTES)."""


@dataclass(frozen=True)
class LocalEngineSpec:
    model_dir: Path
    adapters: dict[str, Path]
    """Engine-side adapter id -> adapter directory."""
    port: int
    host: str = "127.0.0.1"
    cores: str = "0"
    """CPU ids for the engine's OpenMP threads, e.g. "0" or "0-1"."""
    kv_cache_gib: int = 1
    block_size: int = 32
    """Small blocks let the prefix cache hold all but the last partial block of a view."""
    max_model_len: int = 4096
    max_lora_rank: int = 8
    """The engine sizes its LoRA kernels for this rank: keep it at the adapters' rank (on CPU a
    rank-16 engine serving rank-8 adapters made the route hop 1.6x slower)."""
    lora_target_modules: tuple[str, ...] = ()
    """The modules the adapters train; the engine puts LoRA on those only. Empty: on every module
    vLLM supports, the MLP's included (twice the LoRA work: route hop p50 0.21 vs 0.11 s on CPU)."""
    served_model_name: str = "base"
    extra_args: tuple[str, ...] = field(default=())

    @classmethod
    def from_manifest(cls, model_dir: Path, port: int, built_dir: Path = BUILT_DIR, **kw) -> "LocalEngineSpec":
        manifest = Manifest.load(built_dir)
        manifest.verify_weights(built_dir)
        adapters = {a.adapter_id: Path(built_dir) / a.path for a in manifest.adapters}
        kw.setdefault("max_lora_rank", max(a.rank for a in manifest.adapters))
        kw.setdefault("lora_target_modules", manifest.target_modules())
        return cls(model_dir=Path(model_dir), adapters=adapters, port=port, **kw)

    def command(self) -> list[str]:
        lora_modules = [json.dumps({"name": name, "path": str(path)}) for name, path in self.adapters.items()]
        args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_model_name,
            "--host", self.host, "--port", str(self.port),
            "--dtype", "bfloat16",
            "--max-model-len", str(self.max_model_len),
            "--block-size", str(self.block_size),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--chat-template", str(CHAT_TEMPLATE_PATH),
            "--enable-auto-tool-choice", "--tool-call-parser", TOOL_CALL_PARSER,
            "--disable-uvicorn-access-log",
        ]
        if self.adapters:
            args += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank),
                     "--max-loras", str(len(self.adapters)), "--lora-modules", *lora_modules]
            if self.lora_target_modules:
                args += ["--lora-target-modules", *self.lora_target_modules]
        return args + list(self.extra_args)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "VLLM_CPU_OMP_THREADS_BIND": self.cores,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        })
        return env

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalVLLMServer:
    """Owns one engine subprocess. `start()` returns once the server answers /health.

    The subprocess gets its own process group so that `stop()` also ends the
    engine-core child vLLM spawns.
    """

    def __init__(self, spec: LocalEngineSpec, log_path: Path | None = None):
        self.spec = spec
        self.log_path = log_path
        self._proc: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout_s: float = 300.0) -> "LocalVLLMServer":
        # Another server on the port would answer the health check below for this one (whose own
        # bind fails while it loads): refuse before starting.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            if probe.connect_ex((self.spec.host, self.spec.port)) == 0:
                raise RuntimeError(f"{self.spec.host}:{self.spec.port} is already in use by another process")
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self._proc = subprocess.Popen(self.spec.command(), env=self.spec.env(), stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self._proc.returncode} during start"
                                   + (f"; see {self.log_path}" if self.log_path else ""))
            try:
                if httpx.get(self.spec.base_url + "/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vLLM server did not become healthy within {timeout_s:.0f} s")

    def stop(self, grace_s: float = 20.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        self._log = None

    def wait(self) -> int:
        assert self._proc is not None
        return self._proc.wait()

    def __enter__(self) -> "LocalVLLMServer":
        return self.start() if self._proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
