"""``fair-jct``: Pollux's goodput power mean, weighted for mean JCT under a finish-time fairness bound.

The same exact allocator and objective as Pollux (one-hot options per job,
speedups over a fair share from each job's fitted goodput model with the
goodput-best batch per option, the restart penalty, interference avoidance,
the power mean with p = -1: Pollux, section 4), with per-job weights that
carry what Pollux's objective ignores: how much work a job still has and how
long it has waited.  The formulation, its assumptions and the literature it
draws on are in ``docs/fair-jct.md``; in short, the round maximises

    M_p = ( sum_j w_j (s_j(o_j) f_j(o_j))^p / sum_j w_j )^(1/p),
    w_j = pi_j * t_j * (Gamma_j / Gamma_top)^alpha,
    Gamma_j = G_j^(1 - c_j) * Gamma_top^(c_j)

over one option ``o_j`` per job, where

* ``s_j(o)``, ``f_j(o)``: Pollux's speedup over the fair share and restart factor;
* ``G_j``: the job's Gittins index, completions per reference second of
  service, from the online distribution of completed jobs' work
  (:class:`~pollux_opt.scheduling.policies.remaining.WorkHistory`): jobs
  likely to finish soon weigh more (SRPT / Gittins scheduling for mean JCT),
  with strength ``alpha`` (0: Pollux's own weights);
* ``c_j = clip((rho_j - knee) / (bound - knee), 0, 1)``: fairness.  ``rho_j``
  is the job's predicted finish-time fairness (Themis, NSDI 2020) if it got
  its fair share from now on; as it passes ``knee`` the job's index is raised
  geometrically to the highest index of the round, ``Gamma_top = max_j G_j``,
  reached at ``bound``: a job about to exceed the bound is weighted like the
  job most likely to finish;
* ``pi_j``: the job's priority weight (``JobView.weight``) and ``t_j`` Pollux's
  tie-break factor (:data:`~pollux_opt.scheduling.policies.goodput.TIE_BREAK`).

Each term is per job (the weights) or per job and option (the speedups), so
the round is the same one-hot MILP as Pollux's: the policy only sets the
Problem's weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

from solvers import InvalidProblem

from pollux_opt.model import Cluster, GoodputModel
from pollux_opt.model.domains import Real, domain_field
from pollux_opt.scheduling.loop import JobView
from pollux_opt.scheduling.policies.goodput import _AllocatorPolicy
from pollux_opt.scheduling.policies.optimus import StepOracle
from pollux_opt.scheduling.policies.remaining import MIN_WORK_S, WorkHistory, reference_rate, work_done
from pollux_opt.scheduling.policies.views import fair_share

__all__ = ["FAIRNESS_BOUND", "FAIRNESS_KNEE", "FairJctOraclePolicy", "FairJctPolicy", "SRPT_STRENGTH", "predicted_rho"]

#: Exponent ``alpha`` of the remaining-work weights (project choice: a moderate
#: tilt of the power mean; 0.5 and 1 were tried on workload-1, docs/fair-jct.md).
SRPT_STRENGTH = 0.5
#: Predicted rho from which a job's priority starts to rise to the top (project
#: choice: half-way between a fair finish, 1, and the bound).
FAIRNESS_KNEE = 1.5
#: Predicted rho at which a job is served as if it were the shortest (project
#: choice: below the worst rho Pollux reaches on the AdaptDL workloads, about 3.8).
FAIRNESS_BOUND = 3.0
#: Smallest weight of a job (the lower end of the solvers' weight range,
#: ``solvers.domain.WEIGHT_RANGE``); the largest is about 1.
MIN_WEIGHT = 1e-6
#: Fair-share rates cached (models x share sizes of a few rounds).
_RATE_CACHE_SIZE = 4096


@lru_cache(maxsize=_RATE_CACHE_SIZE)
def _fair_rate(model: GoodputModel | None, share_replicas: int) -> float:
    """The work rate (reference seconds per second) of a job of ``model`` on a
    fair share of ``share_replicas`` replicas on one node, as many as its
    largest batch can use (the linear prior without a model; cached per model)."""
    if model is None:
        return float(share_replicas)
    lim = model.limits
    k = max(1, min(share_replicas, lim.max_batch_size // lim.min_local_bsz))
    choice = model.optimize(1, k)
    ref = reference_rate(model)
    if not bool(choice.feasible) or not math.isfinite(ref) or ref <= 0:
        return 1.0
    return max(float(choice.goodput) / lim.init_batch_size / ref, 1e-9)


def predicted_rho(age: float, done: float, remaining: float, fair_rate: float) -> float:
    """Finish-time fairness (Themis) of a job that gets a fair share from now on:
    ``(age + R / f) / (D / f + R / f)`` for ``age`` seconds since submission,
    ``done`` (D) and ``remaining`` (R) reference seconds of work and a fair-share
    work rate ``f``; 1 for a job with no work known at all."""
    ideal = (done + remaining) / fair_rate
    if ideal <= 0:
        return 1.0
    return (age + remaining / fair_rate) / ideal


@dataclass
class FairJctPolicy(_AllocatorPolicy):
    """Pollux's power mean with Gittins-index weights under a finish-time fairness bound.

    Attributes:
        alpha: strength of the remaining-work weights (>= 0; 0: Pollux's weights).
        knee: predicted rho from which a job's index rises (>= 1).
        bound: predicted rho at which it reaches the round's top index (> knee).
        by_family: estimate a job's work from completed jobs of its own model
            family (same batch limits) once there are any, else from all.
    """

    name: str = "fair-jct"
    alpha: float = domain_field(SRPT_STRENGTH, Real(ge=0))
    knee: float = domain_field(FAIRNESS_KNEE, Real(ge=1))
    bound: float = domain_field(FAIRNESS_BOUND, Real(gt=1))
    by_family: bool = True
    _history: WorkHistory = field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bound <= self.knee:
            raise InvalidProblem(f"bound must be > knee, got bound={self.bound} and knee={self.knee}")
        self._history = WorkHistory(by_family=self.by_family)

    def estimates(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, tuple[float, float, float, float]]:
        """Job id -> (work done, estimated remaining work, Gittins index, predicted rho),
        work in reference seconds; also records the jobs that finished since the last call."""
        done = {v.job_id: work_done(v) for v in active}
        self._history.observe(list(active), done)
        share = fair_share(cluster, len(active))[1]
        out = {}
        for v in active:
            rem = self._history.remaining(v, done[v.job_id])
            rho = predicted_rho(v.age, done[v.job_id], rem, _fair_rate(v.goodput_model, share))
            out[v.job_id] = (done[v.job_id], rem, self._history.gittins(v, done[v.job_id]), rho)
        return out

    def weights(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, float]:
        """Job id -> ``w_j`` of the module docstring (at least :data:`MIN_WEIGHT`)."""
        base = super().weights(cluster, active)  # priority times tie-break
        est = self.estimates(cluster, active)
        top = max(g for _, _, g, _ in est.values())
        out = {}
        for v in active:
            _, _, g, rho = est[v.job_id]
            c = min(max((rho - self.knee) / (self.bound - self.knee), 0.0), 1.0)
            # log(Gamma / top) = (1 - c) log(G / top): the raised index, relative to the top
            tilt = math.exp(self.alpha * (1.0 - c) * math.log(g / top))
            out[v.job_id] = max(base[v.job_id] * tilt, MIN_WEIGHT)
        return out


@dataclass
class FairJctOraclePolicy(FairJctPolicy):
    """fair-jct told each job's TRUE remaining work by the simulator's oracle.

    An upper bound of what a better remaining-work estimator could reach in
    simulation, never a policy for real jobs (it needs
    :class:`~pollux_opt.scheduling.policies.optimus.StepOracle`, which only the
    simulator provides).  A job without a model yet keeps the online estimate.

    Attributes:
        oracle: the simulator's step oracle; its remaining steps at the job's
            initial batch size are its remaining progress (M0-equivalent iterations).
    """

    name: str = "fair-jct-oracle"
    oracle: StepOracle | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.oracle is None:
            raise InvalidProblem("fair-jct-oracle needs the simulator's step oracle (oracle=None)")

    def estimates(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, tuple[float, float, float, float]]:
        out = super().estimates(cluster, active)
        share = fair_share(cluster, len(active))[1]
        for v in active:
            model = v.goodput_model
            if model is None:
                continue
            done = out[v.job_id][0]
            rem = max(self.oracle.remaining_steps(v.job_id, model.limits.init_batch_size)
                      / reference_rate(model), MIN_WORK_S)
            out[v.job_id] = (done, rem, 1.0 / rem, predicted_rho(v.age, done, rem, _fair_rate(model, share)))
        return out
