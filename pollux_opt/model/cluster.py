"""The cluster: nodes and their replica slots."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from solvers import MAX_CPUS, InvalidProblem

from pollux_opt.model.domains import NAME, REQUIRED, Integer, Text, check, check_fields, domain_field, shown

__all__ = ["DEFAULT_NODE_TYPE", "Node", "Cluster"]

#: A node's replica slots (at most the solvers' ``MAX_CPUS``), and the number
#: of nodes of a uniform cluster.
POSITIVE_COUNT = Integer(ge=1, le=MAX_CPUS)
#: The type of a node whose type is not given: a cluster of such nodes is
#: homogeneous (one type), as every cluster without a type description.
DEFAULT_NODE_TYPE = "default"


@dataclass(frozen=True)
class Node:
    """A node with ``cpus`` allocatable cores (or GPUs: the unit is a replica slot)
    of one node ``type`` (a device kind; see :mod:`pollux_opt.model.cluster_types`)."""

    id: str = domain_field(REQUIRED, Text())
    cpus: int = domain_field(REQUIRED, POSITIVE_COUNT)
    type: str = domain_field(DEFAULT_NODE_TYPE, NAME)

    def __post_init__(self) -> None:
        check_fields(self, prefix="node ", names=("id",))
        check_fields(self, prefix=f"node {self.id!r}: ")


@dataclass(frozen=True)
class Cluster:
    """An ordered set of nodes with unique ids."""

    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        if isinstance(self.nodes, (str, bytes, Mapping)) or not isinstance(self.nodes, Iterable):
            raise InvalidProblem(f"cluster.nodes must be a sequence of Node objects, got {shown(self.nodes)}")
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise InvalidProblem("cluster.nodes must not be empty")
        bad = [i for i, node in enumerate(self.nodes) if not isinstance(node, Node)]
        if bad:
            raise InvalidProblem(f"cluster.nodes[{bad[0]}] must be a Node, got {shown(self.nodes[bad[0]])}")
        repeated = [nid for nid, count in Counter(n.id for n in self.nodes).items() if count > 1]
        if repeated:
            raise InvalidProblem(f"duplicate node id {repeated[0]!r}")

    @classmethod
    def uniform(cls, num_nodes: int, cpus_per_node: int, prefix: str = "n") -> "Cluster":
        """``num_nodes`` identical nodes named ``n0, n1, ...``."""
        num_nodes = check("num_nodes", num_nodes, POSITIVE_COUNT)
        if not isinstance(prefix, str):
            raise InvalidProblem(f"prefix must be a string, got {shown(prefix)}")
        return cls(tuple(Node(f"{prefix}{i}", cpus_per_node) for i in range(num_nodes)))

    @classmethod
    def from_types(cls, types) -> "Cluster":
        """The typed nodes of a :class:`~pollux_opt.model.cluster_types.ClusterTypes`
        (ids ``<type>-<i>``, in the description's type order)."""
        from pollux_opt.model.cluster_types import ClusterTypes

        if not isinstance(types, ClusterTypes):
            raise InvalidProblem(f"types must be a ClusterTypes, got {shown(types)}")
        return cls(tuple(Node(nid, cap, t) for nid, t, cap in types.nodes()))

    @property
    def types(self) -> tuple[str, ...]:
        """The node types, in order of first appearance."""
        return tuple(dict.fromkeys(n.type for n in self.nodes))

    @property
    def typed(self) -> bool:
        """More than one node type (a heterogeneous cluster)."""
        return len(self.types) > 1

    def of_type(self, type_name: str) -> tuple[Node, ...]:
        """The nodes of one type, in cluster order."""
        return tuple(n for n in self.nodes if n.type == type_name)

    def untyped(self) -> "Cluster":
        """The same nodes, all of :data:`DEFAULT_NODE_TYPE`: the cluster as a
        heterogeneity-unaware scheduler sees it."""
        return Cluster(tuple(Node(n.id, n.cpus) for n in self.nodes))

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    @property
    def total_cpus(self) -> int:
        return sum(n.cpus for n in self.nodes)
