"""The specialist registry: canonical labels -> private adapters, and the one public model name.

New specialists are added here by configuration, not by code. Labels are public;
adapter ids are private and are only ever sent to engines.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from macaron_ray.specialists.labels import EMBEDDED_ANSWER_SAMPLING, ROLES

DEFAULT_PUBLIC_MODEL = "Macaron-V1-Venti"


class AnswerSampling(BaseModel):
    """A specialist's sampling for its answers (None: the engine's default). The route and
    summary hops never use it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)


class Specialist(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    label: str = Field(pattern=r"^L[0-9]+$")
    adapter_id: str = Field(min_length=1)
    """Private: the engine-side adapter name."""
    description: str = Field(min_length=1)
    answer_sampling: AnswerSampling = AnswerSampling()


class SpecialistRegistry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    public_model: str = DEFAULT_PUBLIC_MODEL
    """The one model name clients see."""
    entry_label: str = "L0"
    """The chat specialist: it routes, summarizes, and is the routing fallback."""
    tool_label: str | None = "L1"
    """The specialist that answers a tool result whose call this deployment never stored (a history
    the client wrote, or another deployment served): the one trained on tool results, since the
    request's words alone may read as chat. None, or a label not registered while left at its
    default: route the request's words as for a new turn."""
    specialists: tuple[Specialist, ...]

    @model_validator(mode="after")
    def _consistent(self) -> "SpecialistRegistry":
        labels = [s.label for s in self.specialists]
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate specialist labels: {labels}")
        if self.entry_label not in labels:
            raise ValueError(f"entry label {self.entry_label!r} is not registered (have {labels})")
        if "tool_label" in self.model_fields_set and self.tool_label not in (None, *labels):
            raise ValueError(f"tool label {self.tool_label!r} is not registered (have {labels})")
        ids = [s.adapter_id for s in self.specialists]
        if len(set(ids)) != len(ids):
            raise ValueError("two specialists share an adapter id")
        return self

    @property
    def tool_result_label(self) -> str | None:
        """`tool_label` where it is registered."""
        return self.tool_label if self.tool_label in self.labels else None

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(s.label for s in self.specialists)

    def get(self, label: str) -> Specialist:
        for s in self.specialists:
            if s.label == label:
                return s
        raise KeyError(label)

    def adapter(self, label: str) -> str:
        return self.get(label).adapter_id

    @classmethod
    def from_manifest(cls, public_model: str = DEFAULT_PUBLIC_MODEL) -> "SpecialistRegistry":
        """The embedded default: the four committed adapters."""
        from macaron_ray.adapters.manifest import Manifest

        manifest = Manifest.load()
        return cls(public_model=public_model, specialists=tuple(
            Specialist(label=a.label, adapter_id=a.adapter_id, description=ROLES[a.label],
                       answer_sampling=AnswerSampling(**EMBEDDED_ANSWER_SAMPLING.get(a.label, {})))
            for a in manifest.adapters))
