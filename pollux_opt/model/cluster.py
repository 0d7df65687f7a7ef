"""The cluster: nodes and their replica slots."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from solvers import MAX_CPUS, InvalidProblem

from pollux_opt.model.domains import REQUIRED, Integer, Text, check, check_fields, domain_field, shown

__all__ = ["Node", "Cluster"]

#: A node's replica slots (at most the solvers' ``MAX_CPUS``), and the number
#: of nodes of a uniform cluster.
POSITIVE_COUNT = Integer(ge=1, le=MAX_CPUS)


@dataclass(frozen=True)
class Node:
    """A node with ``cpus`` allocatable cores (or GPUs: the unit is a replica slot)."""

    id: str = domain_field(REQUIRED, Text())
    cpus: int = domain_field(REQUIRED, POSITIVE_COUNT)

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

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    @property
    def total_cpus(self) -> int:
        return sum(n.cpus for n in self.nodes)
