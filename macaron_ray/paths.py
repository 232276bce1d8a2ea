"""Where macaron keeps what it builds outside the source tree."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MACARON_CACHE_DIR"


def cache_dir() -> Path:
    """The cache root: `$MACARON_CACHE_DIR`, else `~/.cache/macaron`."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "macaron"


PACKAGE_DIR = Path(__file__).resolve().parent
