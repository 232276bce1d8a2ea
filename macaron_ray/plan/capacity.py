"""What a profile keeps resident, and how many KV tokens its engines hold.

Residency: MoL stores one base plus N adapters; the replicated layout stores N
merged copies of the base. Counts come from safetensors headers where the files
are on this machine (the embedded base and adapters) and from the profile's
`capacity` declarations where they are not (the GPU profiles' published
figures); a declaration that disagrees with a file present here is an error.

KV capacity, per engine replica: the KV memory of one device divided by the KV
bytes one token takes on it, times the decode-context-parallel size (DCP
spreads the tokens over its ranks, so each rank holds 1/DCP of them). A CPU
engine's KV memory is its `kv_cache_memory_bytes` (the profile's
`kv_cache_gib`); a GPU engine's is its device memory x gpu_memory_utilization
less its share of the weights, assuming the weights spread evenly over the
engine's devices. It is an upper bound: activations, CUDA graphs and a
speculative draft model also take memory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from macaron_ray.plan.safetensors_header import count_dir_values, count_values
from macaron_ray.serve.args import EMBEDDED, AppArgs
from macaron_ray.serve.validate import engine_world_size

GIB = 2**30
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""vLLM 0.29's default (`CacheConfig.gpu_memory_utilization`); checked against vLLM in the tests."""
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


class PlanError(ValueError):
    """A fact the plan needs is neither readable here nor declared, or a declaration contradicts a file."""


@dataclass(frozen=True)
class Count:
    """A number of stored values and where it came from."""

    values: int
    source: str
    """`safetensors header` (read here) or `declared` (the profile's capacity)."""


@dataclass(frozen=True)
class Residency:
    """Stored values of MoL (one base + the adapters) against N merged copies of the base."""

    base: Count
    adapters: dict[str, Count]

    @property
    def mol_values(self) -> int:
        return self.base.values + sum(a.values for a in self.adapters.values())

    @property
    def replicated_values(self) -> int:
        return len(self.adapters) * self.base.values

    @property
    def fewer_pct(self) -> float:
        """How many fewer values MoL stores than the replicated layout, in percent."""
        return 100.0 * (1 - self.mol_values / self.replicated_values)


@dataclass(frozen=True)
class KVCapacity:
    """The KV tokens one replica of an engine role holds."""

    role: str
    devices: int
    """GPUs (or the one CPU engine) of the replica: tp x pp x pcp."""
    kv_bytes_per_device: int
    kv_bytes_per_token_per_device: int
    dcp: int
    kv_tokens: int
    """Logical tokens: per-device tokens x DCP."""
    kv_memory_source: str


@dataclass(frozen=True)
class ProfilePlan:
    profile: str
    public_model: str
    residency: Residency
    kv: list[KVCapacity] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        r = self.residency
        return {
            "profile": self.profile,
            "public_model": self.public_model,
            "residency": {
                "base": asdict(r.base),
                "adapters": {label: asdict(c) for label, c in r.adapters.items()},
                "mol_values": r.mol_values,
                "replicated_values": r.replicated_values,
                "fewer_pct": round(r.fewer_pct, 1),
            },
            "kv": [asdict(k) for k in self.kv],
        }


def plan_profile(args: AppArgs) -> ProfilePlan:
    """The residency and the KV capacity of every engine role of one profile. Prepares nothing."""
    residency = plan_residency(args)
    return ProfilePlan(profile=args.profile, public_model=args.public_model, residency=residency,
                       kv=[kv_capacity(args, role, residency) for role in args.roles()])


def plan_residency(args: AppArgs) -> Residency:
    capacity = args.capacity
    declared_base = capacity.base_parameters if capacity else None
    model_dir = local_model_dir(args)
    counted = count_dir_values(model_dir) if model_dir and any(model_dir.glob("*.safetensors")) else None
    if counted is not None:
        if declared_base is not None and declared_base != counted:
            raise PlanError(f"{args.profile}: capacity.base_parameters {declared_base:,} but the base's "
                            f"safetensors headers hold {counted:,} values")
        base = Count(counted, "safetensors header")
    elif declared_base is not None:
        base = Count(declared_base, "declared")
    else:
        raise PlanError(f"{args.profile}: the base's safetensors are not on this machine (embedded: run "
                        "`macaron models prepare`) and capacity.base_parameters is not declared")

    adapters = {}
    for adapter in args.adapter_list():
        declared = capacity.adapter_values.get(adapter.label) if capacity else None
        weights = Path(adapter.path) / "adapter_model.safetensors"
        if weights.is_file():
            counted = count_values(weights)
            tolerance = capacity.adapter_values_rounding // 2 if capacity else 0
            if declared is not None and abs(declared - counted) > tolerance:
                raise PlanError(f"{args.profile}: capacity.adapter_values.{adapter.label} {declared:,} but "
                                f"its safetensors header holds {counted:,} values")
            adapters[adapter.label] = Count(counted, "safetensors header")
        elif declared is not None:
            adapters[adapter.label] = Count(declared, "declared")
        else:
            raise PlanError(f"{args.profile}: adapter {adapter.label}'s weights are not on this machine and "
                            f"capacity.adapter_values.{adapter.label} is not declared")
    return Residency(base=base, adapters=adapters)


def kv_capacity(args: AppArgs, role: str, residency: Residency) -> KVCapacity:
    kwargs = args.engine_kwargs_for(role)
    devices = engine_world_size(kwargs)
    dcp = int(kwargs.get("decode_context_parallel_size", 1))
    per_token = kv_bytes_per_token_per_device(args, kwargs)
    if "kv_cache_memory_bytes" in kwargs:
        kv_bytes, source = int(kwargs["kv_cache_memory_bytes"]), "kv_cache_memory_bytes"
    elif args.accelerator == "cpu":
        raise PlanError(f"{args.profile}.{role}: a CPU engine needs kv_cache_gib")
    else:
        device_gib = args.capacity.device_memory_gib if args.capacity else None
        if device_gib is None:
            raise PlanError(f"{args.profile}: capacity.device_memory_gib is not declared")
        utilization = float(kwargs.get("gpu_memory_utilization", VLLM_DEFAULT_GPU_MEMORY_UTILIZATION))
        kv_bytes = int(device_gib * GIB * utilization - _weight_bytes(args, kwargs, residency) / devices)
        source = f"{device_gib:g} GiB x {utilization:g} - weights / {devices}"
    return KVCapacity(role=role, devices=devices, kv_bytes_per_device=kv_bytes,
                      kv_bytes_per_token_per_device=per_token, dcp=dcp,
                      kv_tokens=max(kv_bytes, 0) // per_token * dcp, kv_memory_source=source)


def kv_bytes_per_token_per_device(args: AppArgs, kwargs: dict[str, Any]) -> int:
    """From the base's config.json when it is local and plain attention, else the declared figure."""
    declared = args.capacity.kv_bytes_per_token_per_device if args.capacity else None
    config = _plain_attention_config(args)
    if config is None:
        if declared is None:
            raise PlanError(f"{args.profile}: the base's config.json is not on this machine (or its attention "
                            "is not plain multi-head) and capacity.kv_bytes_per_token_per_device is not declared")
        return declared
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    # vLLM shards KV heads over the TP ranks and replicates them when there are fewer heads than ranks.
    heads_per_device = max(1, heads // int(kwargs.get("tensor_parallel_size", 1)))
    counted = 2 * config["num_hidden_layers"] * heads_per_device * head_dim * _kv_dtype_bytes(kwargs, config)
    if declared is not None and declared != counted:
        raise PlanError(f"{args.profile}: capacity.kv_bytes_per_token_per_device {declared} but the base's "
                        f"config.json gives {counted}")
    return counted


def local_model_dir(args: AppArgs) -> Path | None:
    """The base's directory when it is on this machine: the prepared embedded base, or a local path."""
    if args.base.source == EMBEDDED:
        from macaron_ray.model.prepare import base_model_dir, is_prepared

        directory = base_model_dir()
        return directory if is_prepared(directory) else None
    directory = Path(args.base.source).expanduser()
    return directory if directory.is_dir() else None


def _plain_attention_config(args: AppArgs) -> dict[str, Any] | None:
    """The base's config.json if 2 x layers x kv_heads x head_dim x dtype describes its KV (not MLA,
    not hybrid linear attention)."""
    directory = local_model_dir(args)
    if directory is None or not (directory / "config.json").is_file():
        return None
    config = json.loads((directory / "config.json").read_text())
    layer_types = set(config.get("layer_types") or ["full_attention"])
    if "kv_lora_rank" in config or layer_types != {"full_attention"}:
        return None
    return config


def _kv_dtype_bytes(kwargs: dict[str, Any], config: dict[str, Any]) -> int:
    kv_dtype = kwargs.get("kv_cache_dtype") or "auto"
    if kv_dtype.startswith("fp8"):
        return 1
    if kv_dtype != "auto":
        name = kv_dtype
    elif kwargs.get("dtype", "auto") != "auto":
        name = kwargs["dtype"]
    else:
        name = config.get("dtype") or config.get("torch_dtype") or ""
    if name not in DTYPE_BYTES:
        raise PlanError(f"KV dtype {name!r}: not one of {sorted(DTYPE_BYTES)}; declare "
                        "capacity.kv_bytes_per_token_per_device")
    return DTYPE_BYTES[name]


def _weight_bytes(args: AppArgs, kwargs: dict[str, Any], residency: Residency) -> float:
    """The base plus the adapters this engine serves (the router serves only L0)."""
    served = {m["name"] for m in kwargs.get("lora_modules", [])}
    labels = [a.label for a in args.adapter_list() if a.adapter_id in served]
    capacity = args.capacity
    return (residency.base.values * capacity.base_bytes_per_value
            + sum(residency.adapters[label].values for label in labels) * capacity.adapter_bytes_per_value)
