"""The conversation traces the load test and the benchmarks replay (`data/traces.yaml`)."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from macaron_ray.specialists.labels import LABELS

TRACES = Path(__file__).resolve().parent / "data" / "traces.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TraceTurn(_Strict):
    user: str = Field(min_length=1)
    expect: str
    """The specialist the turn should reach (reported, never enforced)."""
    tools: bool = False
    """Offer the trace's tools on this turn."""
    tool_result: str | None = None
    """Sent back as the result when the answer is a tool call."""

    def model_post_init(self, _) -> None:
        if self.expect not in LABELS:
            raise ValueError(f"expect must be one of {list(LABELS)}, not {self.expect!r}")
        if self.tool_result is not None and not self.tools:
            raise ValueError("a tool_result needs tools: true")


class Conversation(_Strict):
    name: str
    turns: tuple[TraceTurn, ...] = Field(min_length=1)


class Traces(_Strict):
    tools: tuple[dict, ...]
    conversations: tuple[Conversation, ...] = Field(min_length=1)

    @property
    def requests(self) -> int:
        """User turns in all conversations (tool results not counted)."""
        return sum(len(c.turns) for c in self.conversations)


def load_traces(path: Path = TRACES) -> Traces:
    return Traces.model_validate(yaml.safe_load(Path(path).read_text(encoding="utf-8")))
