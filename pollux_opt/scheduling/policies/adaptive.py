"""Scheduling policies behind one small interface (:class:`pollux_opt.scheduling.loop.Policy`).

Each policy maps the active jobs' :class:`JobView` s to a :class:`Decision`;
none of them touches a job.  All three read the same views and return the same
decision type, so the real executor and the simulator run them unchanged.

* :class:`FixedPolicy` (``"fixed"``): the static baseline users configure by
  hand.  Jobs run with the CPUs and batch size they were submitted with,
  gang-scheduled first-in first-out; a running job is never changed.
* :class:`DynamicPolicy` (``"dynamic"``): throughput-only elastic scheduling.
  The same allocator and options as Pollux, but each job's speedup is its
  throughput at its submitted (fixed) batch size: no statistical efficiency
  and no batch adaptation.
* :class:`PolluxPolicy` (``"pollux"``): goodput-based co-adaptation (Qiao et
  al., OSDI 2021, section 4): speedups from each job's fitted goodput model
  with the batch size chosen per allocation, power mean with p = -1, the
  restart penalty with each job's own measured restart delay, and
  interference avoidance.

Adding a policy is one small class with a ``name``, an ``adapts_batch`` flag
(does the job choose its batch size, or train at the submitted one?) and a
``decide`` method, registered in :data:`POLICIES`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

from solvers import InvalidProblem

from pollux_opt.model.allocate import allocate
from pollux_opt.model.core import BatchConfig, Cluster, Job, Options
from pollux_opt.scheduling.loop import ACTIVE_STATES, Decision, JobView

__all__ = [
    "POLICIES",
    "DynamicPolicy",
    "FixedPolicy",
    "PolluxPolicy",
    "fair_share",
    "make_policy",
    "job_for_allocator",
]

log = logging.getLogger(__name__)

#: Relative weight spread used to break ties between jobs in the power mean
#: (project choice).  When jobs outnumber CPUs, some get nothing, and the
#: objective is the same whichever ones wait (a job that holds nothing starts
#: free of penalty), so the solver may swap the running and the waiting jobs
#: every round.  Weights ``1 + TIE_BREAK * (n - rank) / n``, ranking jobs that
#: hold CPUs first, then by submission time, make the older running jobs keep
#: their CPUs (first-come first-served admission, as with Pollux's own status-quo
#: bias); 1 % is far above the MILP gap (1e-4) yet small against real speedup differences.
TIE_BREAK = 0.01

#: Smallest per-job restart delay (seconds) used to rescale a job's age for the
#: allocator's single global delay (see :func:`job_for_allocator`); a measured
#: delay of 0 would make the rescaling divide by zero.  A millisecond is far
#: below any real restart, so the factor is 1 to within 1e-4 for jobs older than 10 s.
MIN_RESTART_DELAY_S = 1e-3


#: Exploration cap: a job may get at most this many times the replicas it has
#: been measured on (at least one).  Pollux's simulator (OSDI 2021 artifact,
#: ``max_replicas = max(2 * max_profiled_replicas, 1)``) grows jobs this way so
#: that a fitted model is never extrapolated far beyond its measurements.
EXPLORATION_FACTOR = 2


def _linear_prior(cluster: Cluster, max_replicas: int, base_replicas: int = 1) -> dict[tuple[int, int], float]:
    """Speedup table ``{(n, k): k / base_replicas}``: perfect linear scaling.

    Used for a job with no fitted model yet (never measured): the optimistic
    prior of Pollux's prior-driven exploration (OSDI 2021, section 4.1); with
    the exploration cap such a job gets one replica until it is measured.
    ``base_replicas`` is the replica count of the speedup's base allocation.
    """
    caps = sorted((n.cpus for n in cluster.nodes), reverse=True)
    table = {}
    for n in range(1, len(caps) + 1):
        for k in range(n, min(max_replicas, sum(caps[:n])) + 1):
            table[(n, k)] = k / base_replicas
    return table


def fair_share(cluster: Cluster, num_jobs: int) -> tuple[int, int]:
    """(nodes, replicas) of an exclusive ``1 / num_jobs`` share of the cluster.

    Pollux (OSDI 2021, section 4.2) measures each job's speedup against its
    goodput at a fair allocation, "an exclusive 1/J share of the cluster":
    ``ceil(C / J)`` replicas (at least one) on as few of the largest nodes as hold them.
    """
    if isinstance(num_jobs, bool) or not isinstance(num_jobs, int) or num_jobs < 1:
        raise InvalidProblem(f"num_jobs must be an integer >= 1, got {num_jobs!r}")
    replicas = max(1, -(-cluster.total_cpus // num_jobs))
    nodes, held = 0, 0
    for cap in sorted((n.cpus for n in cluster.nodes), reverse=True):
        if held >= replicas:
            break
        nodes, held = nodes + 1, held + cap
    return nodes, replicas


def _feasible_base(view: JobView, share: tuple[int, int], fixed_batch: bool) -> tuple[int, int]:
    """The (nodes, replicas) a job's speedups are measured against: ``share``'s
    replicas reduced to what the job can run (at most as many as its largest
    batch has smallest micro-batches; its submitted batch with ``fixed_batch``),
    on one node.

    One node as in Pollux's simulator (OSDI 2021 artifact, ``pollux.py``: the
    fair-share goodput at ``ceil(N / C)`` = 1 node): the base is then the goodput
    of the share's replicas without inter-node sync, whatever nodes a share of
    the cluster would straddle.  The model has no node capacity, so a base of
    more replicas than a node holds is well defined.  On the eight AdaptDL
    workloads this base gave a 0.6 % lower average JCT than the share's
    real spread (issue 6).
    """
    model = view.goodput_model
    lim = model.limits
    biggest = view.submitted_batch_size if fixed_batch else lim.max_batch_size
    return 1, max(1, min(share[1], biggest // lim.min_local_bsz))


def job_for_allocator(
    view: JobView,
    cluster: Cluster,
    options: Options,
    *,
    fixed_batch: bool,
    weight: float = 1.0,
    share: tuple[int, int] = (1, 1),
) -> Job:
    """The allocator's :class:`Job` for one view.

    The job may take at most ``EXPLORATION_FACTOR`` times the replicas it was
    measured on (one if never measured; no cap when the view does not say).
    The allocator applies one global restart delay ``D = options.restart_delay``;
    Pollux's penalty uses the job's own delay ``d`` (measured).  Because
    ``f(age, r, d) = max(age - r d, 0) / (age + d)`` is invariant under scaling
    ``age`` and ``d`` together, passing ``age * D / d`` with the global ``D``
    gives exactly ``f(age, r, d)``.

    Args:
        view: the job as the policy sees it.
        cluster: bounds the replica count of the linear prior.
        options: the allocation options (for ``restart_delay``).
        fixed_batch: speedups from throughput at ``view.submitted_batch_size``
            (no statistical efficiency) instead of goodput with an adaptive batch.
        weight: the job's weight in the power mean.
        share: (nodes, replicas) of the fair share (see :func:`fair_share`);
            speedups are measured against its replicas on one node, reduced to
            what the job can run (see :func:`_feasible_base`).
    """
    max_k = min(view.max_replicas, cluster.total_cpus)
    profiled = view.max_profiled_replicas
    if profiled is None and view.goodput_model is None:
        profiled = 0  # never measured
    if profiled is not None:
        max_k = min(max_k, max(EXPLORATION_FACTOR * profiled, 1, view.min_replicas))
    min_k = min(view.min_replicas, max_k)
    delay = max(float(view.restart_delay), MIN_RESTART_DELAY_S)
    age = float(view.age) * options.restart_delay / delay if options.restart_delay > 0 else float(view.age)
    if not 0 < weight:
        raise InvalidProblem(f"job {view.job_id!r}: weight must be > 0, got {weight!r}")
    fixed = view.submitted_batch_size if fixed_batch and view.goodput_model is not None else None
    if view.goodput_model is None:
        speedup, base = _linear_prior(cluster, max_k, share[1]), (1, 1)
    else:
        speedup, base = view.goodput_model, _feasible_base(view, share, fixed is not None)
    return Job(
        id=view.job_id,
        speedup=speedup,
        max_replicas=max_k,
        min_replicas=min_k,
        placement=dict(view.placement),
        restarts=int(view.restarts),
        age=age,
        weight=weight,
        base=base,
        fixed_batch_size=fixed,
    )


def _fixed_batch_config(view: JobView, num_nodes: int, replicas: int) -> BatchConfig:
    """The submitted batch split over ``replicas`` (model's split if fitted, else even)."""
    b = int(view.submitted_batch_size)
    if view.goodput_model is not None:
        choice = view.goodput_model.optimize(num_nodes, replicas, fixed_batch_size=b)
        if bool(choice.feasible):
            return BatchConfig(
                local_bsz=int(choice.local_bsz), accum_steps=int(choice.accum_steps),
                batch_size=int(choice.batch_size), goodput=float(choice.goodput),
            )
    m = -(-b // replicas)
    return BatchConfig(local_bsz=m, accum_steps=0, batch_size=m * replicas, goodput=math.nan)


def _active(jobs: Sequence[JobView], cluster: Cluster) -> list[JobView]:
    """The pending and running views, with placements made to fit the cluster.

    A backend may report more replicas on a node than it has (e.g. a job
    restarted by hand on CPUs the scheduler has given to another job; the
    runtime's own jobs wait for the scheduler after a failed verification
    instead of reclaiming their CPUs); the allocator rejects such input,
    so the youngest jobs on an over-committed node are shown as holding nothing
    (and are moved or stopped by the decision).
    """
    active = [v for v in jobs if v.state in ACTIVE_STATES]
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
        out[i] = replace(v, placement={}, state="pending")
        over = {nid for nid in over if load[nid] > caps[nid]}
        if not over:
            break
    return out


@dataclass
class FixedPolicy:
    """First-in first-out gang scheduling with each job's submitted CPUs and batch size.

    Running jobs keep their placement.  Pending jobs are considered in order of
    submission (ties by id); the head job starts when ``submitted_replicas``
    CPUs are free (clamped to ``[min_replicas, max_replicas]`` and to the
    cluster's size, so that a request larger than the cluster cannot block
    the queue forever), packed on as few nodes as possible; a job that does
    not fit blocks the jobs behind it (strict FIFO, no backfilling).
    """

    name: str = "fixed"
    adapts_batch: bool = False

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        t0 = time.perf_counter()
        free = {n.id: n.cpus for n in cluster.nodes}
        placement: dict[str, dict[str, int]] = {}
        batch: dict[str, BatchConfig] = {}
        active = _active(jobs, cluster)
        for v in active:
            if v.placement:
                for nid, k in v.placement.items():
                    free[nid] -= k
                placement[v.job_id] = dict(v.placement)
        blocked = False
        for v in sorted((v for v in active if not v.placement), key=lambda v: (v.submit_time, v.job_id)):
            want = max(min(v.submitted_replicas, v.max_replicas, cluster.total_cpus), v.min_replicas, 1)
            where = None if blocked else _pack(free, want, [n.id for n in cluster.nodes])
            if where is None:
                blocked = True
                placement[v.job_id] = {}
                continue
            for nid, k in where.items():
                free[nid] -= k
            placement[v.job_id] = where
        for v in active:
            p = placement[v.job_id]
            if p:
                batch[v.job_id] = _fixed_batch_config(v, len(p), sum(p.values()))
        return Decision(placement, batch, math.nan, time.perf_counter() - t0, "fifo")


def _pack(free: dict[str, int], want: int, order: list[str]) -> dict[str, int] | None:
    """``want`` replicas on the fewest nodes: the fullest-fitting single node
    (best fit) if any, else the nodes with most free CPUs first; None if they do not fit."""
    fits = [nid for nid in order if free[nid] >= want]
    if fits:
        best = min(fits, key=lambda nid: (free[nid], order.index(nid)))
        return {best: want}
    if sum(free.values()) < want:
        return None
    out: dict[str, int] = {}
    left = want
    for nid in sorted(order, key=lambda nid: (-free[nid], order.index(nid))):
        take = min(free[nid], left)
        if take:
            out[nid] = take
            left -= take
        if left == 0:
            break
    return out


@dataclass
class _AllocatorPolicy:
    """Shared body of the allocator-based policies (subclasses set name and fixed_batch)."""

    options: Options = field(default_factory=Options)
    name: str = ""
    adapts_batch: bool = True
    fixed_batch: bool = False
    #: Speedups over each job's goodput at a fair share of the cluster (Pollux,
    #: section 4.2) rather than over one replica; changes the power mean's
    #: relative weights for p != 1, not the speedups' order within a job.
    fair_share_base: bool = True

    def prepare(self, cluster: Cluster) -> None:
        """Load the solver stack (Pyomo, HiGHS) once before the first round, so that
        its one-time import is not counted as a round's scheduling overhead."""
        allocate(cluster, [Job("warm-up", {(1, 1): 1.0}, max_replicas=1)], self.options)

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        t0 = time.perf_counter()
        active = _active(jobs, cluster)
        if not active:
            return Decision({}, {}, math.nan, time.perf_counter() - t0, "idle")
        order = sorted(active, key=lambda v: (not v.placement, v.submit_time, v.job_id))
        n = len(order)
        weight = {v.job_id: 1.0 + TIE_BREAK * (n - r) / n for r, v in enumerate(order)}
        share = fair_share(cluster, n) if self.fair_share_base else (1, 1)
        alloc_jobs = [
            job_for_allocator(v, cluster, self.options, fixed_batch=self.fixed_batch,
                              weight=weight[v.job_id], share=share)
            for v in active
        ]
        result = allocate(cluster, alloc_jobs, self.options)
        batch = dict(result.batch)
        by_id = {v.job_id: v for v in active}
        for jid, p in result.placement.items():
            if p and jid not in batch:  # no model yet: the runtime picks M0 (or the fixed batch)
                v = by_id[jid]
                k = sum(p.values())
                if self.fixed_batch:
                    batch[jid] = _fixed_batch_config(v, len(p), k)
        return Decision(
            placement={j: dict(p) for j, p in result.placement.items()},
            batch=batch,
            objective=float(result.objective),
            solver_seconds=time.perf_counter() - t0,
            status=result.status.value,
        )


@dataclass
class DynamicPolicy(_AllocatorPolicy):
    """Throughput-only elastic scheduling at each job's submitted batch size.

    Same allocator and options as :class:`PolluxPolicy` (p, restart penalty
    with the measured delay, interference avoidance), so that the two differ
    only in the speedup: ``GoodputModel.speedup(..., fixed_batch_size=B)``.
    """

    name: str = "dynamic"
    adapts_batch: bool = False
    fixed_batch: bool = True


@dataclass
class PolluxPolicy(_AllocatorPolicy):
    """Goodput-based co-adaptation (Pollux, OSDI 2021): speedups from each job's
    fitted goodput model at its goodput-optimal batch size per allocation."""

    name: str = "pollux"
    adapts_batch: bool = True
    fixed_batch: bool = False


#: Registered policies: name -> class (constructed with no arguments by default).
POLICIES: dict[str, type] = {
    "fixed": FixedPolicy,
    "dynamic": DynamicPolicy,
    "pollux": PolluxPolicy,
}


def make_policy(name: str, **kwargs) -> object:
    """An instance of the registered policy ``name``."""
    if name not in POLICIES:
        raise InvalidProblem(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[name](**kwargs)
