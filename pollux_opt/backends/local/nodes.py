"""The nodes of a real run on this machine: its cluster, CPU pins, GPUs, node types and cgroups.

A real run's cluster is untyped (:func:`default_cluster` splits the CPUs this
process may use) or comes from a node-type description
(:mod:`pollux_opt.model.cluster_types`; :func:`typed_cluster`), whose types may
carry a ``cpu_quota`` < 1: each replica slot of such a node may use that
fraction of one CPU, and whose slots may be GPUs (``slot: "gpu"``; each GPU
replica's process also holds a CPU core of its own).  :class:`CpuPinning` gives
each node its own CPUs and each replica one of them, so that jobs do not
contend for a core (and a quota is a speed on a CPU of its own);
:class:`GpuSlots` gives each GPU node its own GPUs and each of its replicas
one (:func:`gpu_cluster`: this machine's GPUs beside its CPU cores).
:class:`RunNodes` holds one cgroup per throttled node for the backend's life
(a killed scheduler's are removed by the next run); each replica moves itself
into its node's cgroup, or the root one, before it trains
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
from pollux_opt.model import Cluster, Node
from pollux_opt.model.cluster_types import GPU_SLOT, ClusterTypes, NodeType
from pollux_opt.model.domains import Integer, check
from pollux_opt.runtime.device import machine_gpus

__all__ = ["GPU_TYPE_NAME", "CPU_TYPE_NAME", "THROTTLE_PERIOD_US", "CpuPinning", "GpuSlots", "ReplicaSlots",
           "RunNodes", "SlotOwners", "ThrottleRefused", "check_throttle", "default_cluster", "gpu_cluster",
           "throttle_period_us", "typed_cluster"]

log = logging.getLogger(__name__)

#: CPUs a real run uses (0 is an error, not "unset": None is).
_CPUS = Integer(ge=1)
#: GPUs :func:`gpu_cluster` offers.
_GPUS = Integer(ge=1)
#: The node types of :func:`gpu_cluster`.
GPU_TYPE_NAME, CPU_TYPE_NAME = "gpu", "cpu"
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


def gpu_cluster(gpus: int, cpus: int | None = None) -> ClusterTypes:
    """This machine with ``gpus`` of its GPUs: node type ``gpu``, one node of
    ``gpus`` GPU slots (each replica's process on a CPU core of its own), and
    node type ``cpu``, one node of the remaining CPU cores of ``cpus`` (default:
    all this process may use), left out where none remain.

    Raises:
        solvers.InvalidProblem: ``gpus`` not an integer >= 1, or more than the
            GPUs torch sees or the CPU cores there are.
    """
    gpus = check("gpus", gpus, _GPUS)
    total = len(os.sched_getaffinity(0)) if cpus is None else check("cpus", cpus, _CPUS)
    seen = machine_gpus()
    if gpus > seen:
        raise InvalidProblem(f"gpus must be at most the {seen} GPUs torch sees here (a CUDA build of torch and a "
                             f"GPU driver are needed), got {gpus}")
    if gpus > total:
        raise InvalidProblem(f"gpus must be at most cpus ({total}): each GPU replica's process holds a CPU core, "
                             f"got {gpus}")
    types = [NodeType(GPU_TYPE_NAME, 1, gpus, slot=GPU_SLOT)]
    if total > gpus:
        types.append(NodeType(CPU_TYPE_NAME, 1, total - gpus))
    return ClusterTypes(tuple(types))


def typed_cluster(types: ClusterTypes) -> tuple[Cluster, dict[str, float], tuple[str, ...]]:
    """The run's cluster of a node-type description, ``{node type: cpu_quota}``
    of its throttled types (empty where every type is unthrottled) and the
    names of its GPU types.

    Raises:
        InvalidProblem: the description has more slots than this process may
            use CPUs (``os.sched_getaffinity``; a GPU replica's process holds a
            core too), or more GPU slots than torch sees GPUs.
    """
    if not isinstance(types, ClusterTypes):
        raise InvalidProblem(f"types must be a ClusterTypes, got {types!r}")
    available = len(os.sched_getaffinity(0))
    if types.total_replicas > available:
        raise InvalidProblem(
            f"cluster: the description has {types.total_replicas} slots "
            f"({', '.join(f'{t.name}: {t.count} x {t.replicas_per_node}' for t in types.types)}) but this "
            f"process may use {available} CPUs; a real run pins each slot's replica to a CPU of its own")
    gpu_types = tuple(t.name for t in types.types if t.slot == GPU_SLOT)
    wanted = sum(types.capacity()[name] for name in gpu_types)
    there = machine_gpus() if wanted else 0
    if wanted > there:
        raise InvalidProblem(
            f"cluster: node type {', '.join(repr(n) for n in gpu_types)} has {wanted} GPU slots but torch sees "
            f"{there} GPUs here (a CUDA build of torch and a GPU driver are needed)")
    quotas = {t.name: float(t.cpu_quota) for t in types.types if t.cpu_quota < 1}
    return Cluster.from_types(types), quotas, gpu_types


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


class SlotOwners:
    """Which job holds each slot (a CPU id, or a GPU index) of each node:
    ``node_slots``, ``{node id: slot ids}``; a node not in it has none to hand out."""

    def __init__(self, node_slots: Mapping[str, list[int]]) -> None:
        self._node_slots = {nid: list(ids) for nid, ids in node_slots.items()}
        self._owner: dict[tuple[str, int], str] = {}

    def release(self, job_id: str) -> None:
        """Free every slot ``job_id`` holds."""
        self._owner = {s: owner for s, owner in self._owner.items() if owner != job_id}

    def _owned(self, job_id: str, node_id: str) -> list[int]:
        return [i for i in self._node_slots[node_id] if self._owner.get((node_id, i)) == job_id]

    def shrink(self, job_id: str, target: Mapping[str, int]) -> None:
        """Free the slots ``job_id`` holds beyond ``target`` (``{node id: replicas}``)."""
        for nid in self._node_slots:
            for i in self._owned(job_id, nid)[target.get(nid, 0):]:
                del self._owner[(nid, i)]

    def grow(self, job_id: str, target: Mapping[str, int]) -> list[int | None] | None:
        """The slots of ``job_id`` on ``target``, one per replica in node order
        (None on a node without slots here), keeping those it holds and taking
        free ones; None for a target without such a node, or where a node has
        too few free slots (a job still holding slots it was told to free)."""
        if not any(nid in self._node_slots for nid in target):
            return None
        out: list[int | None] = []
        for nid, k in target.items():
            if nid not in self._node_slots:
                out.extend([None] * k)
                continue
            owned = self._owned(job_id, nid)
            free = [i for i in self._node_slots[nid] if (nid, i) not in self._owner]
            take = owned + free[: max(k - len(owned), 0)]
            if len(take) < k:
                return None
            for i in take:
                self._owner[(nid, i)] = job_id
            out.extend(take[:k])
        return out


def _consecutive(nodes, ids) -> dict[str, list[int]]:
    """``{node id: ids}``: each of ``nodes`` the next ``node.cpus`` (its slots) of ``ids``, in order."""
    ids, out, i = list(ids), {}, 0
    for node in nodes:
        out[node.id] = ids[i:i + node.cpus]
        i += node.cpus
    return out


class CpuPinning(SlotOwners):
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
        super().__init__(_consecutive(cluster.nodes, affinity) if self.enabled else {})


class GpuSlots(SlotOwners):
    """Which GPU each replica on a node of a GPU type holds: the nodes of
    ``gpu_types`` get the next ``cpus`` (slots) of the GPUs torch numbers 0, 1, ...,
    in cluster order.  :meth:`grow` gives one entry per replica: its GPU, or
    None on a node of CPU cores (None for a target without a GPU node)."""

    def __init__(self, cluster: Cluster, gpu_types=()) -> None:
        gpu_nodes = [n for n in cluster.nodes if n.type in gpu_types]
        super().__init__(_consecutive(gpu_nodes, range(sum(n.cpus for n in gpu_nodes))))


class ReplicaSlots:
    """The CPU pins (:class:`CpuPinning`) and the GPUs (:class:`GpuSlots`) of a
    run's jobs, held and freed together.  ``own_gpu_only``: each replica's
    process is shown only its own GPU by the one that starts it (as Ray does
    for an actor holding ``num_gpus=1``), so its GPU is that process's GPU 0."""

    def __init__(self, cluster: Cluster, pin: bool, gpu_types=(), *, own_gpu_only: bool = False) -> None:
        self.cpus, self.gpus = CpuPinning(cluster, pin), GpuSlots(cluster, gpu_types)
        self.own_gpu_only = own_gpu_only

    def release(self, job_id: str) -> None:
        """Free every CPU and GPU ``job_id`` holds."""
        self.cpus.release(job_id)
        self.gpus.release(job_id)

    def shrink(self, job_id: str, target: Mapping[str, int]) -> None:
        """Free what ``job_id`` holds beyond ``target`` (``{node id: replicas}``)."""
        self.cpus.shrink(job_id, target)
        self.gpus.shrink(job_id, target)

    def grow(self, job_id: str, target: Mapping[str, int]) -> tuple[list[int] | None, list[int | None] | None]:
        """``(cpus, gpus)`` of ``job_id`` on ``target`` (see :meth:`SlotOwners.grow`)."""
        gpus = self.gpus.grow(job_id, target)
        if self.own_gpu_only and gpus is not None:
            gpus = [None if g is None else 0 for g in gpus]
        return self.cpus.grow(job_id, target), gpus


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
