"""The allocator-driven policies: speedups of every job in one power-mean allocation.

* :class:`DynamicPolicy` (``"dynamic"``): throughput-only elastic scheduling.
  The same allocator and options as Pollux, but each job's speedup is its
  throughput at its submitted (fixed) batch size: no statistical efficiency
  and no batch adaptation.
* :class:`PolluxPolicy` (``"pollux"``): goodput-based co-adaptation (Qiao et
  al., OSDI 2021, section 4): speedups from each job's fitted goodput model
  with the batch size chosen per allocation, power mean with p = -1, the
  restart penalty with each job's own measured restart delay, and
  interference avoidance.  On a cluster of several node types it is
  heterogeneity-aware: each job's speedups per type come from its model on
  that type over one common base, and a job runs on one type at a time, in
  Sia's configurations (the allocator's default ``Options.shapes`` on several
  types, :mod:`pollux_opt.model.configs`); a running job's move to another
  type is priced as two restarts
  (:func:`~pollux_opt.scheduling.policies.views.type_move_factors`).
* :class:`PolluxUnawarePolicy` (``"pollux-unaware"``): Pollux that sees every
  node as one type (how Sia, SOSP 2023, evaluated Pollux on heterogeneous
  clusters): one goodput model per job, fitted to whatever it measured, and
  placements that may span types (a simulated job then runs at the pace of
  its slowest type).

Both turn each view into the allocator's job with
:func:`~pollux_opt.scheduling.policies.views.job_for_allocator` (the
exploration cap, the restart penalty and the fair-share base live there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from solvers import Problem

from pollux_opt.model import Cluster, Job, Options
from pollux_opt.model.allocate import allocate, placement_of, solve
from pollux_opt.model.domains import check_fields, domain_field
from pollux_opt.model.goodput import SearchCache
from pollux_opt.scheduling.loop import Decision, DecisionStatus, JobView
from pollux_opt.scheduling.policies.views import (
    EXPLORATION_FACTOR,
    EXPLORATION_FACTORS,
    active_views,
    fair_share,
    job_for_allocator,
)

__all__ = ["AllocatorPolicy", "DynamicPolicy", "PolluxPolicy", "PolluxUnawarePolicy", "TIE_BREAK"]

#: Relative weight spread used to break ties between jobs in the power mean
#: (project choice).  When jobs outnumber CPUs, some get nothing, and the
#: objective is the same whichever ones wait (a job that holds nothing starts
#: free of penalty), so the solver may swap the running and the waiting jobs
#: every round.  Weights ``1 + TIE_BREAK * (n - rank) / n``, ranking jobs that
#: hold CPUs first, then by submission time, make the older running jobs keep
#: their CPUs (first-come first-served admission, as with Pollux's own status-quo
#: bias); 1 % is far above the MILP gap (1e-4) yet small against real speedup differences.
TIE_BREAK = 0.01


@dataclass
class AllocatorPolicy:
    """Shared body of the allocator-based policies (subclasses set name and fixed_batch).

    A job's speedups come from throughput at its ``fixed_batch_size`` where
    its view has one, else from goodput at the batch it would choose per
    allocation (:func:`~pollux_opt.scheduling.policies.views.job_for_allocator`).

    Attributes:
        options: the allocation options (p, restart delay, solver, ...).
        fair_share_base: speedups over each job's goodput at a fair share of
            the cluster (Pollux, section 4.2) rather than over one replica;
            changes the power mean's relative weights for p != 1, not the
            speedups' order within a job.
        exploration_factor: a job gets at most this many times the replicas it
            has been measured on (integer >= 1; see
            :func:`~pollux_opt.scheduling.policies.views.replica_cap`).
    """

    options: Options = field(default_factory=Options)
    name: str = ""
    fixed_batch: bool = False
    fair_share_base: bool = True
    exploration_factor: int = domain_field(EXPLORATION_FACTOR, EXPLORATION_FACTORS)
    #: The rounds' batch searches, kept from round to round (speed only: see :class:`SearchCache`).
    _search_cache: SearchCache = field(default_factory=SearchCache, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_fields(self)

    def prepare(self, cluster: Cluster) -> None:
        """Load the solver stack (Pyomo, HiGHS) once before the first round, so that
        its one-time import is not counted as a round's scheduling overhead."""
        allocate(cluster, [Job("warm-up", {(1, 1): 1.0}, max_replicas=1)], self.options)

    def weights(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, float]:
        """Job id -> weight in the power mean: the job's priority weight
        (``view.weight``: a job of weight w counts as w jobs of weight 1) times
        its :data:`TIE_BREAK` factor."""
        order = sorted(active, key=lambda v: (not v.placement, v.submit_time, v.job_id))
        n = len(order)
        return {v.job_id: v.weight * (1.0 + TIE_BREAK * (n - r) / n) for r, v in enumerate(order)}

    def allocator_jobs(self, cluster: Cluster, active: Sequence[JobView]) -> list[Job]:
        """The allocator's job for each active view (see
        :func:`~pollux_opt.scheduling.policies.views.job_for_allocator`), weighted by :meth:`weights`."""
        weight = self.weights(cluster, active)
        share = fair_share(cluster, len(active)) if self.fair_share_base else (1, 1)
        return [
            job_for_allocator(v, cluster, self.options, weight=weight[v.job_id], share=share,
                              exploration_factor=self.exploration_factor)
            for v in active
        ]

    def refiner(self, active: Sequence[JobView]) -> Callable[[Problem], Problem] | None:
        """A change to the round's encoded problem before it is solved (None: none);
        called after :meth:`allocator_jobs`, with the same ``active`` views (the problem's rows)."""
        return None

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        active = active_views(jobs, cluster)
        if not active:
            return Decision({}, math.nan, math.nan, DecisionStatus.IDLE)
        allocator_jobs = self.allocator_jobs(cluster, active)
        result = solve(cluster, allocator_jobs, self.options, cache=self._search_cache,
                       refine=self.refiner(active))
        return Decision(
            placement=placement_of(cluster, allocator_jobs, result.placement),
            objective=float(result.objective),
            solver_seconds=math.nan,  # the loop times the decision
            status=result.status,
            allocator_seconds=float(result.build_seconds + result.solve_seconds),
        )


@dataclass
class DynamicPolicy(AllocatorPolicy):
    """Throughput-only elastic scheduling at each job's submitted batch size.

    Same allocator and options as :class:`PolluxPolicy` (p, restart penalty
    with the measured delay, interference avoidance), so that the two differ
    only in the speedup: ``GoodputModel.speedup(..., fixed_batch_size=B)``.
    """

    name: str = "dynamic"
    fixed_batch: bool = True


@dataclass
class PolluxPolicy(AllocatorPolicy):
    """Goodput-based co-adaptation (Pollux, OSDI 2021): speedups from each job's
    fitted goodput model at its goodput-optimal batch size per allocation."""

    name: str = "pollux"
    fixed_batch: bool = False


@dataclass
class PolluxUnawarePolicy(PolluxPolicy):
    """Pollux blind to node types: the cluster as one type (:meth:`Cluster.untyped`)
    and each job's single goodput model (``view.goodput_model``), never its
    per-type models.  On a one-type cluster it is :class:`PolluxPolicy`."""

    name: str = "pollux-unaware"

    def prepare(self, cluster: Cluster) -> None:
        super().prepare(cluster.untyped())

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        views = [replace(v, goodput_models=None) for v in jobs]
        return super().decide(now, cluster.untyped(), views)
