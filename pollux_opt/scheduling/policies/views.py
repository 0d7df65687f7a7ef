"""What the policies read from :class:`~pollux_opt.scheduling.loop.JobView` s.

* :func:`active_views`: the views of live jobs, made to fit the cluster.
* :func:`job_for_allocator`: the allocator's :class:`~pollux_opt.model.Job` for
  one view (speedups, replica range with Pollux's exploration cap, restart
  penalty with the job's own delay, the fair-share base of :func:`fair_share`).
* :func:`requested_replicas`: a job's own (user submitted) replica count, for
  the policies that run jobs as submitted.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.lifecycle import JobState
from pollux_opt.model import Cluster, GoodputModel, Job, Options
from pollux_opt.model.configs import node_replica_pairs, top_sums
from pollux_opt.model.domains import Integer, check
from pollux_opt.model.goodput import SearchCache
from pollux_opt.model.job import WEIGHT, restart_factor
from pollux_opt.model.typed import TypedGoodput
from pollux_opt.scheduling.loop import JobView

__all__ = [
    "EXPLORATION_FACTOR",
    "EXPLORATION_FACTORS",
    "active_views",
    "compact_goodput",
    "fair_share",
    "feasible_base",
    "job_for_allocator",
    "replica_cap",
    "requested_replicas",
    "type_gpus",
    "type_move_factors",
    "typed_goodput",
]

log = logging.getLogger(__name__)

#: Exploration cap: a job may get at most this many times the replicas it has
#: been measured on (at least one).  Pollux's simulator (OSDI 2021 artifact,
#: ``max_replicas = max(2 * max_profiled_replicas, 1)``) grows jobs this way so
#: that a fitted model is never extrapolated far beyond its measurements.
EXPLORATION_FACTOR = 2
#: The multiple of measured replicas the exploration cap allows.
EXPLORATION_FACTORS = Integer(ge=1)
#: Jobs sharing the cluster in a fair share.
_NUM_JOBS = Integer(ge=1)


def active_views(jobs: Sequence[JobView], cluster: Cluster) -> list[JobView]:
    """The views of live jobs (in their given order), with placements made to fit the cluster.

    A backend may report more replicas on a node than it has (e.g. a job
    restarted by hand on CPUs the scheduler has given to another job; the
    runtime's own jobs wait for the scheduler after a failed verification
    instead of reclaiming their CPUs); the allocator rejects such input,
    so the youngest jobs on an over-committed node are shown as holding nothing
    (and are moved or stopped by the decision).

    Raises:
        InvalidProblem: a view places replicas on a node the cluster lacks.
    """
    active = [v for v in jobs if not v.state.terminal]
    caps = {n.id: n.cpus for n in cluster.nodes}
    load: dict[str, int] = {}
    for v in active:
        for nid, k in v.placement.items():
            if nid not in caps:
                raise InvalidProblem(f"job {v.job_id!r}: placement on unknown node {nid!r}")
            load[nid] = load.get(nid, 0) + k
    over = {nid for nid, k in load.items() if k > caps[nid]}
    if not over:
        return active
    out = list(active)
    for i in sorted(range(len(out)), key=lambda i: (-out[i].submit_time, out[i].job_id)):
        v = out[i]
        hit = over & set(v.placement)
        if not hit:
            continue
        log.warning("nodes %s over capacity: treating job %s as holding nothing", sorted(hit), v.job_id)
        for nid, k in v.placement.items():
            load[nid] -= k
        out[i] = replace(v, placement={}, state=JobState.QUEUED)
        over = {nid for nid in over if load[nid] > caps[nid]}
        if not over:
            break
    return out


def fair_share(cluster: Cluster, num_jobs: int) -> tuple[int, int]:
    """(nodes, replicas) of an exclusive ``1 / num_jobs`` share of the cluster.

    Pollux (OSDI 2021, section 4.2) measures each job's speedup against its
    goodput at a fair allocation, "an exclusive 1/J share of the cluster":
    ``ceil(C / J)`` replicas (at least one) on as few of the largest nodes as hold them.
    """
    num_jobs = check("num_jobs", num_jobs, _NUM_JOBS)
    replicas = max(1, -(-cluster.total_cpus // num_jobs))
    nodes, held = 0, 0
    for cap in sorted((n.cpus for n in cluster.nodes), reverse=True):
        if held >= replicas:
            break
        nodes, held = nodes + 1, held + cap
    return nodes, replicas


def replica_cap(view: JobView, cluster: Cluster, exploration_factor: int = EXPLORATION_FACTOR) -> int:
    """Most replicas the allocator may give the job: its own limit and the
    cluster's size, and Pollux's prior-driven exploration cap (OSDI 2021,
    section 4.1): ``exploration_factor`` times the replicas it has been measured
    on, at least one (and at least its own minimum).

    A view without a goodput model that does not say what was measured counts
    as never measured (one replica); one with a model that does not say is not capped.
    """
    cap = min(view.max_replicas, cluster.total_cpus)
    profiled = view.max_profiled_replicas
    if profiled is None and view.goodput_model is None:
        profiled = 0
    if profiled is not None:
        cap = min(cap, max(exploration_factor * profiled, 1, view.min_replicas))
    return cap


def compact_goodput(model: GoodputModel, replicas: np.ndarray, node_slots: int, fixed_batch_size: int | None,
                    cache: SearchCache | None = None) -> np.ndarray:
    """float64 goodput (M0-samples / s) of a job's ``model`` at each replica
    count of ``replicas`` on as few nodes of ``node_slots`` as hold them, at its
    goodput-best batch (``fixed_batch_size`` where the job has one, a view's
    :attr:`~pollux_opt.scheduling.loop.JobView.fixed_batch_size`); ``cache``
    spares the batch search's first pass (speed only)."""
    replicas = np.asarray(replicas)
    return np.asarray(model.optimize(-(-replicas // node_slots), replicas, fixed_batch_size=fixed_batch_size,
                                     cache=cache).goodput, dtype=float)


def _linear_prior(cluster: Cluster, max_replicas: int, base_replicas: int = 1) -> dict[tuple[int, int], float]:
    """Speedup table ``{(n, k): k / base_replicas}``: perfect linear scaling.

    Used for a job with no fitted model yet (never measured): the optimistic
    prior of Pollux's prior-driven exploration (OSDI 2021, section 4.1); with
    the exploration cap such a job gets one replica until it is measured.
    ``base_replicas`` is the replica count of the speedup's base allocation.
    """
    return {(n, k): k / base_replicas for n, k in node_replica_pairs(1, max_replicas, top_sums(cluster))}


def feasible_base(view: JobView, share: tuple[int, int]) -> tuple[int, int]:
    """The (nodes, replicas) a job's speedups are measured against: ``share``'s
    replicas reduced to what the job can run (at most as many as its largest
    batch, or its ``fixed_batch_size``, has smallest micro-batches), on one node.

    One node as in Pollux's simulator (OSDI 2021 artifact, ``pollux.py``: the
    fair-share goodput at ``ceil(N / C)`` = 1 node): the base is then the goodput
    of the share's replicas without inter-node sync, whatever nodes a share of
    the cluster would straddle.  The model has no node capacity, so a base of
    more replicas than a node holds is well defined.  On the eight AdaptDL
    workloads this base gave a 0.6 % lower average JCT than the share's real spread.
    """
    return _base_of(view.goodput_model.limits, view, share)


def _base_of(lim, view: JobView, share: tuple[int, int]) -> tuple[int, int]:
    """:func:`feasible_base` under the batch limits ``lim`` (those of one node type's model)."""
    biggest = lim.max_batch_size if view.fixed_batch_size is None else view.fixed_batch_size
    return 1, max(1, min(share[1], biggest // lim.min_local_bsz))


def typed_goodput(view: JobView, cluster: Cluster, share: tuple[int, int]) -> TypedGoodput | None:
    """The job's per-type goodput models on a cluster of several node types, each
    with its fair-share base (:func:`feasible_base` under that type's limits),
    over one common speedup base: the mean of the fair-share goodputs over the
    types weighted by each type's slots (:func:`type_gpus`), the goodput of a
    fair share of the whole cluster; None on a one-type cluster or without
    per-type models.  The exploration cap
    (:func:`replica_cap`) counts the replicas measured on any type, as Sia
    shares a job's replica limit over the types it projects to.

    A running job's speedups on the types it does not run on carry the job's
    restart factor once more (:func:`type_move_factors`)."""
    if not cluster.typed or not view.goodput_models:
        return None
    models = {t: view.goodput_models[t] for t in cluster.types if t in view.goodput_models}
    if not models:
        return None
    return TypedGoodput.of(models, {t: _base_of(m.limits, view, share) for t, m in models.items()},
                           type_move_factors(view, cluster, tuple(models)), type_gpus(cluster, tuple(models)))


def type_gpus(cluster: Cluster, types: Sequence[str]) -> dict[str, float]:
    """``{type: replica slots of the cluster's nodes of that type}``: each type's
    weight in a job's speedup base (:meth:`TypedGoodput.base_goodput`), so that
    the base is the goodput of a fair share of the whole cluster, which holds
    that share of every type's slots."""
    return {t: float(sum(n.cpus for n in cluster.of_type(t))) for t in types}


def type_move_factors(view: JobView, cluster: Cluster, types: Sequence[str]) -> dict[str, float]:
    """``{type: factor}`` on the speedups of a running job's other types: its
    Pollux restart factor ``r`` (:func:`pollux_opt.model.job.restart_factor`
    with the job's own delay), so that with the allocator's own factor a move
    to another type is worth ``r ** 2`` of its speedup and a move within the
    type ``r``.

    A type move costs more than a resize: it leaves the type whose throughput
    the job has measured for one whose speedups are, until it runs there, a
    projection from another type (``docs/node-types.md``, section 2), so a
    move on an overestimate is likely to be followed by a second restart back.
    Pricing the move as two restarts keeps a job on its type unless the other
    type's speedup beats it by more than a second restart's cost.  Empty for a
    job that holds nothing or whose restart factor is 0 or 1.
    """
    node_type = {n.id: n.type for n in cluster.nodes}
    held = {node_type[nid] for nid, k in view.placement.items() if k > 0 and nid in node_type}
    if len(held) != 1:
        return {}
    r = restart_factor(float(view.age), int(view.restarts), float(view.restart_delay))
    if not 0.0 < r < 1.0:
        return {}
    return {t: r for t in types if t not in held}


def job_for_allocator(
    view: JobView,
    cluster: Cluster,
    options: Options,
    *,
    weight: float = 1.0,
    share: tuple[int, int] = (1, 1),
    exploration_factor: int = EXPLORATION_FACTOR,
) -> Job:
    """The allocator's :class:`Job` for one view.

    Speedups are throughputs at ``view.fixed_batch_size`` (no statistical
    efficiency) where the view has one, else goodputs at the batch the job
    would choose per allocation.  The job may take at most :func:`replica_cap` replicas.  Its restart factor
    uses the job's own restart delay (``view.restart_delay``, measured for
    real jobs), not ``options.restart_delay``.

    Args:
        view: the job as the policy sees it.
        cluster: bounds the replica count of the linear prior.
        options: the allocation options (their ``restart_delay`` is not used:
            the job carries its own).
        weight: the job's weight in the power mean (> 0).
        share: (nodes, replicas) of the fair share (see :func:`fair_share`);
            speedups are measured against its replicas on one node, reduced to
            what the job can run (see :func:`feasible_base`).
        exploration_factor: the exploration cap's multiple of the measured replicas.
    """
    check("weight", weight, WEIGHT, prefix=f"job {view.job_id!r}: ")
    max_k = replica_cap(view, cluster, exploration_factor)
    fixed = view.fixed_batch_size if view.goodput_model is not None else None
    typed = typed_goodput(view, cluster, share)
    if typed is not None:
        speedup, base = typed, (1, 1)
    elif view.goodput_model is None:
        speedup, base = _linear_prior(cluster, max_k, share[1]), (1, 1)
    else:
        speedup, base = view.goodput_model, feasible_base(view, share)
    return Job(
        id=view.job_id,
        speedup=speedup,
        max_replicas=max_k,
        min_replicas=min(view.min_replicas, max_k),
        placement=dict(view.placement),
        restarts=int(view.restarts),
        age=float(view.age),
        weight=weight,
        base=base,
        fixed_batch_size=fixed,
        restart_delay=float(view.restart_delay),
    )


def requested_replicas(view: JobView, cluster: Cluster) -> int:
    """The job's submitted replica count, clamped to its own range and to the
    cluster's size (so that a request larger than the cluster cannot block a
    queue forever); at least one."""
    return max(min(view.submitted_replicas, view.max_replicas, cluster.total_cpus), view.min_replicas, 1)
