"""The cluster: nodes and their replica slots."""

from __future__ import annotations

from dataclasses import dataclass

from solvers import InvalidProblem

__all__ = ["Node", "Cluster"]


@dataclass(frozen=True)
class Node:
    """A node with ``cpus`` allocatable cores (or GPUs: the unit is a replica slot)."""

    id: str
    cpus: int

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InvalidProblem(f"node id must be a non-empty string, got {self.id!r}")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus <= 0:
            raise InvalidProblem(f"node {self.id!r}: cpus must be an integer > 0, got {self.cpus!r}")


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
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes <= 0:
            raise InvalidProblem(f"num_nodes must be an integer > 0, got {num_nodes!r}")
        return cls(tuple(Node(f"{prefix}{i}", cpus_per_node) for i in range(num_nodes)))

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    @property
    def total_cpus(self) -> int:
        return sum(n.cpus for n in self.nodes)
