"""Canonical specialist labels. Public-safe: these may reach clients."""

LABELS: tuple[str, ...] = ("L0", "L1", "L2", "L3")

ROLES: dict[str, str] = {
    "L0": "chat",
    "L1": "personal agent",
    "L2": "coding",
    "L3": "generative UI",
}

# The embedded specialists' answer-hop sampling (`AnswerSampling`). At temperature 0 the 135M base
# and its chat adapter fall into repetition loops on some requests (4 and 17 % of quality.yaml's
# chat items); these penalties stop them for both and keep the most relevance of the settings
# tried (README, "Quality benchmark"). Code, tool calls, UI blocks and the route and summary hops
# repeat tokens by design and keep the engine's defaults.
EMBEDDED_ANSWER_SAMPLING: dict[str, dict[str, float]] = {
    "L0": {"repetition_penalty": 1.1, "frequency_penalty": 0.3},
}
