"""The scheduler's view of a Ray cluster's nodes (:class:`RayNodes`) and, for an
autoscaling cluster that starts without worker nodes, the wait for its first
ones (:func:`first_nodes`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from solvers import InvalidProblem

from pollux_opt.backends.local.nodes import CPU_TYPE_NAME, GPU_TYPE_NAME
from pollux_opt.model import Cluster, Node

__all__ = ["NODE_ID_CHARS", "NODE_WAIT_S", "NodeInfo", "RayNodes", "first_nodes"]

#: Hex digits of a Ray node id kept in the scheduler's node id (48 bits: no
#: collision in any realistic cluster, and short in the event log).  The last
#: ones: Ray's ids are random throughout, and the nodes of Ray's fake
#: autoscaling provider share a prefix and differ in a counter at the end.
NODE_ID_CHARS = 12
#: Most seconds a run waits for the first node an autoscaling Ray cluster adds
#: (cloud VMs take 60-300 s to boot and join).
NODE_WAIT_S = 600.0


@dataclass(frozen=True)
class NodeInfo:
    """One alive Ray node with CPUs: scheduler id, Ray's node id (hex), CPUs and GPUs."""

    id: str
    ray_id: str
    cpus: int
    gpus: int = 0

    @property
    def slots(self) -> int:
        """Its replica slots: one per GPU where it has GPUs (each replica's actor
        holds a CPU too), else one per CPU."""
        return min(self.gpus, self.cpus) if self.gpus else self.cpus


class RayNodes:
    """The scheduler's view of the Ray cluster (refreshed by :meth:`refresh`; thread-safe reads).

    Args:
        ray: the ``ray`` module, connected (``ray.init`` done).
    """

    def __init__(self, ray) -> None:
        self.ray = ray
        self._nodes: dict[str, NodeInfo] = {}
        self.refresh()

    def refresh(self) -> Cluster | None:
        """Re-read Ray's nodes; the new cluster (None where there is no node with CPUs)."""
        infos = []
        for n in self.ray.nodes():
            resources = n.get("Resources", {})
            cpus, gpus = int(resources.get("CPU", 0)), int(resources.get("GPU", 0))
            if n.get("Alive") and cpus > 0:
                infos.append(NodeInfo(f"ray-{n['NodeID'][-NODE_ID_CHARS:]}", n["NodeID"], cpus, gpus))
        self._nodes = {i.id: i for i in sorted(infos, key=lambda i: i.id)}
        return self.cluster()

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The node types whose slots are GPUs: ``("gpu",)`` where a node has GPUs."""
        return (GPU_TYPE_NAME,) if any(i.gpus for i in self._nodes.values()) else ()

    def cluster(self) -> Cluster | None:
        """The nodes as the scheduler's cluster (None: no node with CPUs): nodes with
        GPUs of type ``gpu`` (a slot per GPU), the others of type ``cpu`` (a slot
        per CPU); untyped where no node has a GPU."""
        nodes = list(self._nodes.values())
        if not nodes:
            return None
        if not self.gpu_types:
            return Cluster(tuple(Node(i.id, i.cpus) for i in nodes))
        return Cluster(tuple(Node(i.id, i.slots, GPU_TYPE_NAME if i.gpus else CPU_TYPE_NAME) for i in nodes))

    def get(self, node_id: str) -> NodeInfo | None:
        """The alive node ``node_id`` as last read (None: unknown or gone)."""
        return self._nodes.get(node_id)

    def alive(self, node_id: str) -> bool:
        """Whether ``node_id`` is alive now (asks Ray: a node that left since the last refresh is not)."""
        info = self._nodes.get(node_id)
        if info is None:
            return False
        return any(n["NodeID"] == info.ray_id and n.get("Alive") for n in self.ray.nodes())



def first_nodes(nodes: RayNodes, count: int, node_cpus: int | None, address: str | None) -> Cluster:
    """An autoscaling Ray cluster without worker nodes: ask Ray's autoscaler for
    ``count`` nodes of ``node_cpus`` CPUs and wait (up to :data:`NODE_WAIT_S`)
    for the first to join."""
    from ray.autoscaler.sdk import request_resources

    if node_cpus is None:
        raise InvalidProblem(f"the Ray cluster at address={address!r} has no node with CPUs yet: give node_cpus "
                             f"(--node-cpus), the CPUs of a node its autoscaler adds")
    request_resources(bundles=[{"CPU": int(node_cpus)}] * count)
    deadline = time.monotonic() + NODE_WAIT_S
    while time.monotonic() < deadline:
        cluster = nodes.refresh()
        if cluster is not None:
            return cluster
        time.sleep(1.0)
    raise InvalidProblem(f"the Ray cluster at address={address!r} added no node with CPUs within "
                         f"{NODE_WAIT_S:g} s of the request for {count}")
