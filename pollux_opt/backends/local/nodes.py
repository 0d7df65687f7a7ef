"""The nodes of a real run on this machine: its cluster, CPU pins, node types and cgroups.

A real run's cluster is untyped (:func:`default_cluster` splits the CPUs this
process may use) or comes from a node-type description
(:mod:`pollux_opt.model.cluster_types`; :func:`typed_cluster`), whose types may
carry a ``cpu_quota`` < 1: each replica slot of such a node may use that
fraction of one CPU.  :class:`CpuPinning` gives each node its own CPUs and each
replica one of them, so that jobs do not contend for a core (and a quota is a
speed on a CPU of its own).  :class:`RunNodes` holds one cgroup per throttled
node for the backend's life (a killed scheduler's are removed by the next run);
each replica moves itself into its node's cgroup, or the root one, before it
trains (``WorkerAllocation.cgroups``), so that a pool worker moving between
nodes always runs under the quota of the node it serves.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Mapping

from solvers import InvalidProblem

from pollux_opt.backends.local.throttle import MIN_QUOTA_US, Throttle, ThrottleUnavailable, detect
from pollux_opt.model import Cluster, Node
from pollux_opt.model.cluster_types import ClusterTypes
from pollux_opt.model.domains import Integer, check

__all__ = ["THROTTLE_PERIOD_US", "CpuPinning", "RunNodes", "ThrottleRefused", "check_throttle", "default_cluster",
           "throttle_period_us", "typed_cluster"]

log = logging.getLogger(__name__)

#: CPUs a real run uses (0 is an error, not "unset": None is).
_CPUS = Integer(ge=1)
#: CFS period of a real run's throttled nodes, microseconds (20 ms; longer
#: where a quota would fall below the kernel's 1 ms minimum).  The runtime
#: represents a configuration by a low quantile of its recent step times
#: (``measurements.STEP_TIME_QUANTILE``): a step shorter than the period runs
#: unthrottled within the period's quota or waits for the next period, so a
#: long period hides the slowdown from the low quantile, and a very short one
#: costs kernel overhead.  Slow/fast ratio of the measured (lower-quartile) and
#: of the mean step of ``digits-cnn`` (15 ms steps) at a 0.5 quota on an idle core:
#: 100 ms 0.99 / 2.00, 20 ms 2.01 / 2.27, 10 ms 2.31 / 2.33, 2 ms 3.06 / 3.52.
THROTTLE_PERIOD_US = 20_000


class ThrottleRefused(InvalidProblem):
    """A cluster with a throttled node type where cgroup CPU quotas cannot be set (the reason attached)."""


def default_cluster(num_nodes: int = 1, cpus: int | None = None) -> Cluster:
    """This machine: ``num_nodes`` nodes splitting the CPUs this process may use
    (``cpus`` of them, default all) as evenly as possible.

    Raises:
        solvers.InvalidProblem: ``cpus`` not an integer >= 1, or ``num_nodes`` not
            one in ``[1, cpus]`` (0 of either is an error, not a default).
    """
    total = len(os.sched_getaffinity(0)) if cpus is None else check("cpus", cpus, _CPUS)
    num_nodes = check("num_nodes", num_nodes, Integer(ge=1, le=total))
    base, extra = divmod(total, num_nodes)
    return Cluster(tuple(Node(f"n{i}", base + (1 if i < extra else 0)) for i in range(num_nodes)))


def typed_cluster(types: ClusterTypes) -> tuple[Cluster, dict[str, float]]:
    """The run's cluster of a node-type description, and ``{node type: cpu_quota}``
    of its throttled types (empty where every type is unthrottled).

    Raises:
        InvalidProblem: the description has more CPUs than this process may use
            (``os.sched_getaffinity``).
    """
    if not isinstance(types, ClusterTypes):
        raise InvalidProblem(f"types must be a ClusterTypes, got {types!r}")
    available = len(os.sched_getaffinity(0))
    if types.total_replicas > available:
        raise InvalidProblem(
            f"cluster: the description has {types.total_replicas} CPUs "
            f"({', '.join(f'{t.name}: {t.count} x {t.replicas_per_node}' for t in types.types)}) but this "
            f"process may use {available}; a real run pins each node's CPUs")
    quotas = {t.name: float(t.cpu_quota) for t in types.types if t.cpu_quota < 1}
    return Cluster.from_types(types), quotas


def throttle_period_us(quotas: Mapping[str, float]) -> int:
    """The CFS period of a run with ``quotas``: :data:`THROTTLE_PERIOD_US`, or
    the shortest period that gives the smallest quota of one slot the kernel's
    minimum (``MIN_QUOTA_US``)."""
    smallest = min(quotas.values(), default=1.0)
    return max(THROTTLE_PERIOD_US, math.ceil(MIN_QUOTA_US / smallest))


def check_throttle(quotas: Mapping[str, float]) -> None:
    """Refuse throttled node types where cgroup CPU quotas cannot be written.

    Raises:
        ThrottleRefused: naming the throttled types and the reason.
    """
    if not quotas:
        return
    try:
        detect()
    except ThrottleUnavailable as exc:
        raise ThrottleRefused(_refusal(quotas, exc)) from None


def _refusal(quotas: Mapping[str, float], exc: Exception) -> str:
    named = ", ".join(f"{t!r} (cpu_quota {q:g})" for t, q in quotas.items())
    return (f"cluster: node type {named} needs cgroup CPU quotas, which cannot be set here: {exc} "
            "(run as root with /sys/fs/cgroup writable, or describe the cluster without cpu_quota)")


class CpuPinning:
    """Which CPU each job's replicas are pinned to: node ``i`` of ``cluster`` gets
    the next ``cpus`` CPUs of this process's affinity, in order.  Pinning is off
    unless ``pin``, and (with a warning) where the cluster has more CPUs than
    this process may use."""

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


class RunNodes:
    """The node types and cgroups that a real run's commands carry.

    Args:
        cluster: the run's nodes.
        cpu_quota: ``{node type: fraction}`` of its throttled types (None or
            empty: no cgroups); the CFS period is :func:`throttle_period_us`.

    Raises:
        ThrottleRefused: a throttled type where cgroups cannot be written.
    """

    def __init__(self, cluster: Cluster, cpu_quota: Mapping[str, float] | None) -> None:
        self._node_type = {n.id: n.type for n in cluster.nodes}
        #: The cluster's node types on a cluster of several (None: untyped).
        self.types = cluster.types if cluster.typed else None
        #: ``{node id: cgroup directory}`` on a throttled run (None: no cgroups).
        self.cgroups: dict[str, str] | None = None
        self._throttle: Throttle | None = None
        quotas = {t: float(q) for t, q in (cpu_quota or {}).items() if q < 1}
        if not quotas:
            return
        try:
            self._throttle = Throttle(period_us=throttle_period_us(quotas))
            root = str(self._throttle.info.cpu_root)
            self.cgroups = {n.id: str(self._throttle.node(n.id, fraction=quotas[n.type], slots=n.cpus))
                            if n.type in quotas else root for n in cluster.nodes}
        except ThrottleUnavailable as exc:
            self.close()
            raise ThrottleRefused(_refusal(quotas, exc)) from None
        log.info("throttled nodes: %s", {n: d for n, d in self.cgroups.items() if d != root})

    def command_kwargs(self, target: Mapping[str, int]) -> dict[str, dict[str, str]]:
        """The ``node_types`` and ``cgroups`` of a command on ``target`` (neither on an
        untyped, unthrottled cluster)."""
        out = {}
        if self.types is not None:
            out["node_types"] = {nid: self._node_type[nid] for nid in target}
        if self.cgroups is not None:
            out["cgroups"] = {nid: self.cgroups[nid] for nid in target}
        return out

    def close(self) -> None:
        """Move every process back to the root cgroup and remove the groups (idempotent)."""
        if self._throttle is not None:
            self._throttle.close()
        self._throttle = self.cgroups = None
