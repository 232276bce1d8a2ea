"""`macaron plan`: what each profile keeps resident (MoL vs replicated) and how many KV tokens it holds."""

from macaron_ray.plan.capacity import (
    KVCapacity,
    PlanError,
    ProfilePlan,
    Residency,
    kv_capacity,
    plan_profile,
    plan_residency,
)
from macaron_ray.plan.safetensors_header import count_values, read_header

__all__ = ["KVCapacity", "PlanError", "ProfilePlan", "Residency", "count_values", "kv_capacity",
           "plan_profile", "plan_residency", "read_header"]
