"""Ray cluster definitions: which node types exist, what each node offers, how it starts.

A definition (`cluster/<name>.yaml`) is a head group plus worker groups. Every
group is one node type: its nodes advertise the custom resource
`macaron_node_<type>` that the profiles' replicas ask a share of, and GPU
nodes carry Ray's accelerator-type label. `NodeGroup.ray_start_args()` renders
the `ray start` flags of one node of the group (flag names as in Ray 2.60's
`ray start`); a KubeRay chart would render the same numbers into a pod spec.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from macaron_ray.paths import PACKAGE_DIR
from macaron_ray.serve.args import NODE_TYPE_PATTERN, node_type_resource

CLUSTER_DIR = PACKAGE_DIR.parent / "cluster"
"""The checked-in definitions, next to `deployments/` (a source checkout, not the installed package)."""
ACCELERATOR_LABEL = "ray.io/accelerator-type"
"""Ray's own node label for the accelerator model; Ray also sets it itself when it detects the GPU."""
HEAD_PORT = 6379
MIN_OBJECT_STORE_BYTES = 75 * 2**20
"""Ray refuses a smaller object store."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ContainerResources(_Strict):
    """What the node's container (a KubeRay pod) requests, and is limited to."""

    cpu: int = Field(ge=1)
    """Cores."""
    memory_gib: int = Field(ge=1)
    """Memory, object store included."""
    shared_memory_gib: int = Field(ge=1)
    """/dev/shm: Ray's object store lives there, so it bounds the object store."""
    nvidia_gpus: int = Field(0, ge=0)
    """`nvidia.com/gpu`."""


class NodeGroup(_Strict):
    """One node type: identical nodes, scaled between min_replicas and max_replicas."""

    name: str = Field(pattern=NODE_TYPE_PATTERN)
    """The group's name (KubeRay's groupName)."""
    node_type: str = Field(pattern=NODE_TYPE_PATTERN)
    """What profiles name in `node_type`; the node advertises `macaron_node_<type>`."""
    replicas: int = Field(1, ge=0)
    """Nodes started with the cluster."""
    min_replicas: int = Field(1, ge=0)
    """Fewest nodes the autoscaler keeps."""
    max_replicas: int = Field(1, ge=1)
    """Most nodes the autoscaler starts."""
    num_cpus: int = Field(ge=0)
    """Ray's logical CPUs on one node (a scheduling budget, not cores)."""
    num_gpus: int = Field(0, ge=0)
    """GPUs on one node."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom resources of one node; must hold `macaron_node_<node_type>: 1`."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Ray node labels; GPU nodes carry `ray.io/accelerator-type`."""
    object_store_memory_bytes: int = Field(ge=MIN_OBJECT_STORE_BYTES)
    """Ray's object store on one node."""
    container: ContainerResources | None = None
    """The pod's resources; none for nodes that are not containers (a local cluster)."""

    @model_validator(mode="after")
    def _consistent(self) -> "NodeGroup":
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(f"{self.name}: needs min_replicas <= replicas <= max_replicas")
        own = node_type_resource(self.node_type)
        if self.resources.get(own) != 1:
            raise ValueError(f"{self.name}: resources must hold {own}: 1 (what replicas of node type "
                             f"{self.node_type!r} ask a share of)")
        if self.num_gpus and ACCELERATOR_LABEL not in self.labels:
            raise ValueError(f"{self.name}: a GPU node needs the label {ACCELERATOR_LABEL}")
        if c := self.container:
            if c.nvidia_gpus != self.num_gpus:
                raise ValueError(f"{self.name}: container.nvidia_gpus {c.nvidia_gpus} != num_gpus {self.num_gpus}")
            if self.object_store_memory_bytes > c.shared_memory_gib * 2**30:
                raise ValueError(f"{self.name}: the object store does not fit in container.shared_memory_gib")
            if c.shared_memory_gib >= c.memory_gib:
                raise ValueError(f"{self.name}: container.shared_memory_gib must leave memory for the processes")
        return self

    @property
    def accelerator_type(self) -> str | None:
        return self.labels.get(ACCELERATOR_LABEL)

    def ray_start_args(self, *, head_address: str | None = None) -> list[str]:
        """`ray start` arguments for one node: the head's when head_address is None, else a worker's."""
        where = ["--head", f"--port={HEAD_PORT}"] if head_address is None else [f"--address={head_address}"]
        args = [*where, f"--num-cpus={self.num_cpus}", f"--num-gpus={self.num_gpus}",
                f"--resources={json.dumps(_whole(self.resources), sort_keys=True)}",
                f"--object-store-memory={self.object_store_memory_bytes}"]
        if self.labels:
            # Ray 2.60 takes labels as `k=v,k=v` (its JSON form is deprecated).
            args.append("--labels=" + ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        return args


def _whole(resources: dict[str, float]) -> dict[str, float]:
    """`{"macaron_node_h20": 1}` rather than `1.0`: the flags read as they are written in the file."""
    return {k: int(v) if float(v).is_integer() else v for k, v in resources.items()}


class ClusterSpec(_Strict):
    """A Ray cluster: one head node and the worker groups, each a node type."""

    name: str = Field(pattern=NODE_TYPE_PATTERN)
    """What profiles name in `cluster`; the file is `cluster/<name>.yaml`."""
    head: NodeGroup
    """The head node: GCS, dashboard, Serve's controller. Exactly one."""
    workers: list[NodeGroup] = Field(default_factory=list)
    """The worker groups."""

    @model_validator(mode="after")
    def _distinct(self) -> "ClusterSpec":
        if not self.head.replicas == self.head.min_replicas == self.head.max_replicas == 1:
            raise ValueError("the head group is exactly one node")
        groups = self.groups()
        for attr in ("name", "node_type"):
            values = [getattr(g, attr) for g in groups]
            if len(set(values)) != len(values):
                raise ValueError(f"group {attr}s must be distinct: {values}")
        return self

    def groups(self) -> list[NodeGroup]:
        return [self.head, *self.workers]

    def group_for(self, node_type: str) -> NodeGroup | None:
        return next((g for g in self.groups() if g.node_type == node_type), None)

    @classmethod
    def load(cls, path: str | Path) -> "ClusterSpec":
        return cls.model_validate(yaml.safe_load(Path(path).read_text()))

    @classmethod
    def named(cls, name: str, cluster_dir: Path = CLUSTER_DIR) -> "ClusterSpec":
        """The definition a profile's `cluster: <name>` refers to."""
        spec = cls.load(cluster_dir / f"{name}.yaml")
        if spec.name != name:
            raise ValueError(f"{cluster_dir / f'{name}.yaml'} defines cluster {spec.name!r}, not {name!r}")
        return spec
