"""Checked-in prompts: the scaffold of the route and summary hops. They never enter an own-view."""

from __future__ import annotations

from functools import cache

from macaron_ray.paths import PACKAGE_DIR


@cache
def load(name: str) -> str:
    """The prompt `name` ("routing" or "summary"), without its trailing newline."""
    return (PACKAGE_DIR / "prompts" / f"{name}.txt").read_text(encoding="utf-8").rstrip("\n")
