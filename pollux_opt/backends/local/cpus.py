"""This machine's CPUs: the default cluster over them, and pinning replicas to them.

A real run's cluster splits the CPUs this process may use
(``os.sched_getaffinity``) into nodes (:func:`default_cluster`).
:class:`CpuPinning` gives each node its own CPUs, in order, and each replica of
a job one of its node's CPUs, so that jobs do not contend for a core.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

from pollux_opt.model import Cluster, Node
from pollux_opt.model.domains import Integer, check

__all__ = ["CpuPinning", "default_cluster"]

log = logging.getLogger(__name__)

#: CPUs a real run uses (0 is an error, not "unset": None is).
_CPUS = Integer(ge=1)


def default_cluster(num_nodes: int = 1, cpus: int | None = None) -> Cluster:
    """This machine: ``num_nodes`` nodes splitting the CPUs this process may use
    (``cpus`` of them, default all) as evenly as possible.

    Raises:
        solvers.InvalidProblem: ``cpus`` not an integer >= 1, or ``num_nodes`` not one
            in ``[1, cpus]`` (0 of either is an error, not a default).
    """
    total = len(os.sched_getaffinity(0)) if cpus is None else check("cpus", cpus, _CPUS)
    num_nodes = check("num_nodes", num_nodes, Integer(ge=1, le=total))
    base, extra = divmod(total, num_nodes)
    return Cluster(tuple(Node(f"n{i}", base + (1 if i < extra else 0)) for i in range(num_nodes)))


class CpuPinning:
    """Which CPU each job's replicas are pinned to.

    Args:
        cluster: the run's nodes; node ``i`` gets the next ``cpus`` CPUs of
            this process's affinity, in order.
        pin: pin at all; pinning is off (with a warning) where the cluster has
            more CPUs than this process may use.
    """

    def __init__(self, cluster: Cluster, pin: bool) -> None:
        affinity = sorted(os.sched_getaffinity(0))
        self.enabled = bool(pin) and cluster.total_cpus <= len(affinity)
        if pin and not self.enabled:
            log.warning("cluster has %d CPUs but only %d are available: replicas are not pinned",
                        cluster.total_cpus, len(affinity))
        self._node_cpus: dict[str, list[int]] = {}
        i = 0
        for node in cluster.nodes:
            self._node_cpus[node.id] = affinity[i:i + node.cpus] if self.enabled else []
            i += node.cpus
        self._owner: dict[int, str] = {}

    def release(self, job_id: str) -> None:
        """Free every CPU ``job_id`` holds."""
        self._owner = {c: owner for c, owner in self._owner.items() if owner != job_id}

    def _owned(self, job_id: str, node_id: str) -> list[int]:
        return [c for c in self._node_cpus[node_id] if self._owner.get(c) == job_id]

    def shrink(self, job_id: str, target: Mapping[str, int]) -> None:
        """Free the CPUs ``job_id`` holds beyond ``target`` (``{node id: replicas}``)."""
        if not self.enabled:
            return
        for nid in self._node_cpus:
            for cpu in self._owned(job_id, nid)[target.get(nid, 0):]:
                del self._owner[cpu]

    def grow(self, job_id: str, target: Mapping[str, int]) -> list[int] | None:
        """The CPUs of ``job_id`` on ``target``, one per replica in node order,
        keeping those it holds and taking free ones; None when not pinning, for
        an empty target, or where a node has too few free CPUs (a job still
        holding CPUs it was told to free)."""
        if not self.enabled or not target:
            return None
        cpus: list[int] = []
        for nid, k in target.items():
            owned = self._owned(job_id, nid)
            free = [c for c in self._node_cpus[nid] if c not in self._owner]
            take = owned + free[: max(k - len(owned), 0)]
            if len(take) < k:
                return None
            for cpu in take:
                self._owner[cpu] = job_id
            cpus.extend(take[:k])
        return cpus
