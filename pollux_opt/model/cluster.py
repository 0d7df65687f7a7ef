"""The cluster: nodes and their replica slots."""

from __future__ import annotations

from dataclasses import dataclass

from solvers import InvalidProblem

from pollux_opt.model.domains import REQUIRED, Integer, Text, check, check_fields, domain_field

__all__ = ["Node", "Cluster"]

#: A node's replica slots, and the number of nodes of a uniform cluster.
POSITIVE_COUNT = Integer(gt=0)


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
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise InvalidProblem("cluster.nodes must not be empty")
        seen: set[str] = set()
        for node in self.nodes:
            if node.id in seen:
                raise InvalidProblem(f"duplicate node id {node.id!r}")
            seen.add(node.id)

    @classmethod
    def uniform(cls, num_nodes: int, cpus_per_node: int, prefix: str = "n") -> "Cluster":
        """``num_nodes`` identical nodes named ``n0, n1, ...``."""
        num_nodes = check("num_nodes", num_nodes, POSITIVE_COUNT)
        return cls(tuple(Node(f"{prefix}{i}", cpus_per_node) for i in range(num_nodes)))

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    @property
    def total_cpus(self) -> int:
        return sum(n.cpus for n in self.nodes)
