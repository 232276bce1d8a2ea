"""The manifest of the built adapters: what each one is and what it was built from.

`built/manifest.json` is written by `macaron adapters train` and read by every
profile that serves the adapters. It is validated strictly: a manifest that
does not describe exactly the canonical specialists, or whose weights do not
match their checksums, is rejected before any engine starts.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from macaron_ray.paths import PACKAGE_DIR
from macaron_ray.specialists.labels import LABELS

BUILT_DIR = PACKAGE_DIR / "adapters" / "built"
RECIPE_VERSION = 5
MAX_RANK = 16


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BaseInfo(_Strict):
    name: str
    """Public-safe name of the prepared base (never a path)."""
    gguf_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """sha256 of the prepared base's model.safetensors the adapters were trained on."""


class AdapterEntry(_Strict):
    label: str
    adapter_id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    """Private engine-side name of the adapter; never sent to clients."""
    path: str
    """Directory relative to the manifest."""
    rank: int = Field(ge=1, le=MAX_RANK)
    alpha: int = Field(ge=1)
    target_modules: list[str] = Field(min_length=1)
    data_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    examples: int = Field(ge=1)
    steps: int = Field(ge=1)

    @model_validator(mode="after")
    def _label_is_canonical(self) -> "AdapterEntry":
        if self.label not in LABELS:
            raise ValueError(f"label {self.label!r} is not one of {list(LABELS)}")
        if Path(self.path).is_absolute() or ".." in Path(self.path).parts:
            raise ValueError(f"adapter path {self.path!r} must be relative to the manifest")
        return self


class Manifest(_Strict):
    recipe_version: int = Field(ge=1)
    seed: int
    base: BaseInfo
    adapters: list[AdapterEntry]

    @model_validator(mode="after")
    def _one_adapter_per_label(self) -> "Manifest":
        labels = [a.label for a in self.adapters]
        if sorted(labels) != sorted(set(labels)):
            raise ValueError(f"duplicate labels in manifest: {labels}")
        if set(labels) != set(LABELS):
            raise ValueError(f"manifest must cover exactly {list(LABELS)}, has {labels}")
        ids = [a.adapter_id for a in self.adapters]
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate adapter ids in manifest: {ids}")
        return self

    @classmethod
    def load(cls, directory: Path = BUILT_DIR) -> "Manifest":
        return cls.model_validate_json((Path(directory) / "manifest.json").read_text())

    def write(self, directory: Path) -> None:
        (Path(directory) / "manifest.json").write_text(
            json.dumps(self.model_dump(), indent=2, sort_keys=True) + "\n")

    def target_modules(self) -> tuple[str, ...]:
        """Every module some adapter trains (peft's names, e.g. q_proj), sorted."""
        return tuple(sorted({m for a in self.adapters for m in a.target_modules}))

    def adapter(self, label: str) -> AdapterEntry:
        return next(a for a in self.adapters if a.label == label)

    def verify_weights(self, directory: Path = BUILT_DIR) -> None:
        """Raise if any adapter's weights differ from the recorded checksum."""
        for a in self.adapters:
            weights = Path(directory) / a.path / "adapter_model.safetensors"
            if not weights.is_file():
                raise FileNotFoundError(f"adapter {a.label}: missing weights file {a.path}/adapter_model.safetensors")
            actual = file_sha256(weights)
            if actual != a.weights_sha256:
                raise ValueError(f"adapter {a.label}: checksum mismatch (expected {a.weights_sha256}, got {actual})")
