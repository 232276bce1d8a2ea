"""Ray cluster definitions (`cluster/*.yaml`): node types, their resources, and how each node starts."""

from macaron_ray.cluster.spec import CLUSTER_DIR, ClusterSpec, ContainerResources, NodeGroup

__all__ = ["CLUSTER_DIR", "ClusterSpec", "ContainerResources", "NodeGroup"]
