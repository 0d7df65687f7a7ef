"""The cluster as Ray sees it: its alive nodes with CPUs, read every round.

A scheduler node id is ``ray-`` and the first :data:`NODE_ID_CHARS` hex digits
of the Ray node id (stable while the node's raylet lives; a node that rejoins
is a new node).  Nodes without CPUs (a head started with ``--num-cpus=0``) are
not part of the scheduler's cluster.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from dataclasses import dataclass

from pollux_opt.model import Cluster, Node

__all__ = ["NODE_ID_CHARS", "NodeInfo", "RayNodes", "interface_of"]

#: Hex digits of a Ray node id kept in the scheduler's node id (48 bits: no
#: collision in any realistic cluster, and short in the event log).
NODE_ID_CHARS = 12
#: Linux ioctl that reads an interface's IPv4 address (``<linux/sockios.h>``).
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class NodeInfo:
    """One alive Ray node with CPUs: scheduler id, Ray's node id (hex), CPUs."""

    id: str
    ray_id: str
    cpus: int


def _node_infos(ray) -> list[NodeInfo]:
    out = []
    for n in ray.nodes():
        cpus = int(n.get("Resources", {}).get("CPU", 0))
        if n.get("Alive") and cpus > 0:
            out.append(NodeInfo(f"ray-{n['NodeID'][:NODE_ID_CHARS]}", n["NodeID"], cpus))
    return sorted(out, key=lambda i: i.id)


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
        self._nodes = {i.id: i for i in _node_infos(self.ray)}
        return self.cluster()

    def cluster(self) -> Cluster | None:
        nodes = list(self._nodes.values())
        return Cluster(tuple(Node(i.id, i.cpus) for i in nodes)) if nodes else None

    def get(self, node_id: str) -> NodeInfo | None:
        """The alive node ``node_id`` as last read (None: unknown or gone)."""
        return self._nodes.get(node_id)

    def alive(self, node_id: str) -> bool:
        """Whether ``node_id`` is alive now (asks Ray: a node that left since the last refresh is not)."""
        info = self._nodes.get(node_id)
        if info is None:
            return False
        return any(n["NodeID"] == info.ray_id and n.get("Alive") for n in self.ray.nodes())


def interface_of(ip: str) -> str:
    """The name of this machine's network interface with IPv4 address ``ip``
    (what gloo binds to: ``GLOO_SOCKET_IFNAME``); ValueError naming ``ip`` if none has it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    raise ValueError(f"no network interface of this machine has the address ip={ip!r}")
