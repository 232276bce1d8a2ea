"""Count the values a safetensors file stores from its header alone.

A safetensors file starts with an 8-byte little-endian header length, then a
JSON header naming every tensor's dtype, shape and byte range, then the tensor
data. The header is all a count needs, so a 1.5 TB checkpoint is counted by
reading a few megabytes, and a file cut off right after its header counts the
same as the whole file.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

MAX_HEADER_BYTES = 100_000_000
"""The safetensors format's own limit; a larger length means this is not a safetensors file."""


def read_header(path: str | Path) -> dict[str, dict]:
    """The tensor entries of a safetensors header, `__metadata__` left out. Reads no tensor data."""
    path = Path(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path.name}: shorter than a safetensors header length")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise ValueError(f"{path.name}: header length {length} exceeds the format's limit")
        raw = f.read(length)
    if len(raw) != length:
        raise ValueError(f"{path.name}: the header is cut short ({len(raw)} of {length} bytes)")
    header = json.loads(raw)
    header.pop("__metadata__", None)
    return header


def count_values(path: str | Path) -> int:
    """Values stored in one safetensors file: the product of each tensor's shape, summed."""
    return sum(math.prod(entry["shape"]) for entry in read_header(path).values())


def count_dir_values(directory: str | Path) -> int:
    """Values stored in every `*.safetensors` file of a model directory (sharded checkpoints)."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    return sum(count_values(f) for f in files)
