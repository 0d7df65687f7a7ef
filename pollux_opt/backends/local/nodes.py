"""Node types of a real run: the cluster a description gives, and the cgroups of its throttled nodes.

A real run's cluster is either untyped (``--nodes/--cpus``: one type, as
:func:`~pollux_opt.backends.local.cpus.default_cluster` splits this machine) or
a node-type description (:mod:`pollux_opt.model.cluster_types`, a JSON file or
a preset such as ``local-hetero``), whose nodes are typed (``Node.type``) and
whose types may carry a ``cpu_quota`` < 1: each replica slot of such a node
may use that fraction of one CPU.  :func:`typed_cluster` turns a description
into the run's cluster and its quotas; it needs every CPU of the description
to be one this process may use (each node's CPUs are pinned as on an untyped
cluster, and a quota is only a speed on a CPU of its own).

:class:`NodeCgroups` holds the run's :class:`~pollux_opt.backends.local.throttle.Throttle`:
one cgroup per throttled node (fraction = its type's ``cpu_quota``, slots = its
CPUs), created when the backend starts and removed when it closes (the
stale-group cleanup of the next run removes those of a killed scheduler).
Every replica of a job placed on a throttled run moves itself into its node's
cgroup (or the root cgroup, on an unthrottled node) before it trains
(``WorkerAllocation.cgroups``), so that a pool worker moving between nodes
always runs under the quota of the node it serves.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Mapping

from solvers import InvalidProblem

from pollux_opt.backends.local.throttle import MIN_QUOTA_US, Throttle, ThrottleUnavailable, detect
from pollux_opt.model import Cluster
from pollux_opt.model.cluster_types import ClusterTypes

__all__ = ["THROTTLE_PERIOD_US", "NodeCgroups", "RunNodes", "ThrottleRefused", "check_throttle",
           "throttle_period_us", "typed_cluster"]

log = logging.getLogger(__name__)

#: CFS period of a real run's throttled nodes, microseconds (20 ms; longer
#: where a quota would fall below the kernel's 1 ms minimum, see
#: :func:`throttle_period_us`).  The runtime represents a configuration by a
#: low quantile of its recent step times (``measurements.STEP_TIME_QUANTILE``):
#: a step shorter than the period either runs within the period's quota
#: (unthrottled) or waits for the next period, so a long period hides the
#: slowdown from the low quantile; a very short one costs the throttled group
#: more than its quota in kernel overhead.  Measured with the built-in
#: ``digits-cnn`` (15 ms steps) at a 0.5 quota on an idle core, slow/fast
#: ratio of the measured (lower-quartile) step time, and of the mean step:
#: 100 ms 0.99 / 2.00, 20 ms 2.01 / 2.27, 10 ms 2.31 / 2.33, 2 ms 3.06 / 3.52.
THROTTLE_PERIOD_US = 20_000


class ThrottleRefused(InvalidProblem):
    """A cluster with a throttled node type where cgroup CPU quotas cannot be set (the reason attached)."""


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


class NodeCgroups:
    """The cgroups of a run's throttled nodes.

    Args:
        cluster: the run's nodes (typed).
        quotas: ``{node type: cpu_quota}`` of the throttled types (< 1); the
            CFS period is :func:`throttle_period_us`.

    Raises:
        ThrottleRefused: cgroups cannot be written here.
    """

    def __init__(self, cluster: Cluster, quotas: Mapping[str, float]) -> None:
        try:
            self.throttle = Throttle(period_us=throttle_period_us(quotas))
        except ThrottleUnavailable as exc:
            raise ThrottleRefused(_refusal(quotas, exc)) from None
        root = str(self.throttle.info.cpu_root)
        self.dirs: dict[str, str] = {}
        try:
            for node in cluster.nodes:
                q = quotas.get(node.type)
                if q is None or q >= 1:
                    self.dirs[node.id] = root
                else:
                    self.dirs[node.id] = str(self.throttle.node(node.id, fraction=q, slots=node.cpus).path)
        except ThrottleUnavailable as exc:
            self.throttle.close()
            raise ThrottleRefused(_refusal(quotas, exc)) from None
        log.info("throttled nodes: %s", {n: d for n, d in self.dirs.items() if d != root})

    def of(self, placement: Mapping[str, int]) -> dict[str, str]:
        """``{node: cgroup directory}`` of the nodes of ``placement``."""
        return {nid: self.dirs[nid] for nid in placement}

    def close(self) -> None:
        """Move every process back to the root cgroup and remove the groups."""
        self.throttle.close()


class RunNodes:
    """What a real run's commands and views say about node types and cgroups.

    Args:
        cluster: the run's nodes.
        cpu_quota: ``{node type: fraction}`` of its throttled types (None or
            empty: no cgroups).

    Raises:
        ThrottleRefused: a throttled type where cgroups cannot be written.
    """

    def __init__(self, cluster: Cluster, cpu_quota: Mapping[str, float] | None) -> None:
        self._node_type = {n.id: n.type for n in cluster.nodes} if cluster.typed else None
        #: The cluster's node types on a cluster of several (None: untyped).
        self.types = cluster.types if cluster.typed else None
        quotas = {t: float(q) for t, q in (cpu_quota or {}).items() if q < 1}
        self.cgroups = NodeCgroups(cluster, quotas) if quotas else None

    def command_kwargs(self, target: Mapping[str, int]) -> dict[str, dict[str, str]]:
        """The ``node_types`` and ``cgroups`` of a command on ``target`` (neither on an
        untyped, unthrottled cluster)."""
        out = {}
        if self._node_type is not None:
            out["node_types"] = {nid: self._node_type[nid] for nid in target}
        if self.cgroups is not None:
            out["cgroups"] = self.cgroups.of(target)
        return out

    def close(self) -> None:
        """Remove the node cgroups (idempotent)."""
        if self.cgroups is not None:
            self.cgroups.close()
            self.cgroups = None
