"""The adapter manifest: strict validation and the committed adapters it describes."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from safetensors import safe_open

from macaron_ray.adapters.manifest import BUILT_DIR, MAX_RANK, Manifest
from macaron_ray.adapters.train import RECIPES, data_sha256, dataset
from macaron_ray.model.prepare import SMOLLM2_135M
from macaron_ray.specialists.labels import LABELS


@pytest.fixture
def raw() -> dict:
    return json.loads((BUILT_DIR / "manifest.json").read_text())


def test_committed_manifest_is_valid_and_matches_the_weights():
    manifest = Manifest.load()
    manifest.verify_weights()
    assert manifest.base.gguf_sha256 == SMOLLM2_135M.gguf_sha256
    assert [a.label for a in manifest.adapters] == list(LABELS)


def test_committed_adapters_are_small_bf16_lora(raw):
    manifest = Manifest.load()
    for a in manifest.adapters:
        assert a.rank <= MAX_RANK
        config = json.loads((BUILT_DIR / a.path / "adapter_config.json").read_text())
        assert config["r"] == a.rank and sorted(config["target_modules"]) == sorted(a.target_modules)
        assert "/" not in config["base_model_name_or_path"]  # no local path is shipped
        with safe_open(str(BUILT_DIR / a.path / "adapter_model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype.__repr__() for k in f.keys()} == {"torch.bfloat16"}


def test_manifest_records_the_current_recipe_data():
    # The committed adapters were built from exactly the data the generators make now.
    manifest = Manifest.load()
    for a in manifest.adapters:
        assert a.adapter_id == RECIPES[a.label].adapter_id
        assert a.data_sha256 == data_sha256(dataset(a.label, manifest.seed)), a.label


@pytest.mark.parametrize("mutate, message", [
    (lambda m: m["adapters"].pop(), "must cover exactly"),
    (lambda m: m["adapters"][0].update(label="L9"), "not one of"),
    (lambda m: m["adapters"][1].update(label="L0"), "duplicate labels"),
    (lambda m: m["adapters"][0].update(rank=64), "less than or equal to 16"),
    (lambda m: m["adapters"][0].update(path="/etc/passwd"), "relative"),
    (lambda m: m["adapters"][0].update(weights_sha256="nope"), "pattern"),
    (lambda m: m.update(unexpected=1), "Extra inputs"),
    (lambda m: m["adapters"][2].update(adapter_id=m["adapters"][3]["adapter_id"]), "duplicate adapter ids"),
])
def test_invalid_manifests_are_rejected(raw, mutate, message):
    mutate(raw)
    with pytest.raises(ValidationError, match=message):
        Manifest.model_validate(raw)


def test_tampered_weights_fail_verification(tmp_path):
    import shutil

    shutil.copytree(BUILT_DIR, tmp_path / "built")
    weights = tmp_path / "built" / "L2" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ValueError, match="L2: checksum mismatch"):
        Manifest.load(tmp_path / "built").verify_weights(tmp_path / "built")
