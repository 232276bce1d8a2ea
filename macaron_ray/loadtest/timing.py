"""Reading the ingress's `Server-Timing` (header, and the `: server-timing` comment that ends a stream)."""

from __future__ import annotations

import re

SSE_PREFIX = ": server-timing "
_METRIC = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*(?:;(.*))?$")


def parse_server_timing(value: str | None) -> dict[str, float]:
    """`route;dur=12.5, wait;dur=0.0` -> {"route": 0.0125, "wait": 0.0} (seconds). Metrics without
    a duration, or with one that is not a number, are left out; a repeated name keeps the first."""
    out: dict[str, float] = {}
    for part in (value or "").split(","):
        match = _METRIC.match(part)
        if not match:
            continue
        name, params = match.group(1), match.group(2) or ""
        for param in params.split(";"):
            key, _, raw = param.partition("=")
            if key.strip().lower() == "dur":
                try:
                    out.setdefault(name, float(raw.strip().strip('"')) / 1000.0)
                except ValueError:
                    pass
    return out


def parse_sse_timing(line: str) -> dict[str, float] | None:
    """The timing of a stream's last frame (`: server-timing ...`), or None for any other line."""
    if not line.startswith(SSE_PREFIX):
        return None
    return parse_server_timing(line[len(SSE_PREFIX):])
