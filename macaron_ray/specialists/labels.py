"""Canonical specialist labels. Public-safe: these may reach clients."""

LABELS: tuple[str, ...] = ("L0", "L1", "L2", "L3")

ROLES: dict[str, str] = {
    "L0": "chat",
    "L1": "personal agent",
    "L2": "coding",
    "L3": "generative UI",
}
