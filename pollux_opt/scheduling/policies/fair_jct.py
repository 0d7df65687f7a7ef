"""``fair-jct``: Pollux's goodput power mean, weighted for mean JCT under a finish-time fairness bound.

The same exact allocator and objective as Pollux (one-hot options per job,
speedups over a fair share from each job's fitted goodput model with the
goodput-best batch per option, the restart penalty, interference avoidance,
the power mean with p = -1: Pollux, section 4), with per-job weights that
carry what Pollux's objective ignores (how much work a job still has and how
long it has waited), a restart factor that keeps a light job's move as costly
as Pollux makes it, and a wider exploration cap.  The formulation, its
assumptions and the measurements behind each choice are in
``docs/fair-jct.md``; in short, the round maximises

    M_p = ( sum_j w_j (s_j(o_j) f'_j(o_j))^p / sum_j w_j )^(1/p),
    w_j = pi_j * t_j * max((Gamma_j / Gamma_top)^alpha, 2^-max_tilt),
    Gamma_j = H_j^(1 - c_j) * Gamma_top^(c_j),      H_j = G_j r_j

over one option ``o_j`` per job, where

* ``s_j(o)``: Pollux's speedup over the fair share;
* ``H_j``: the job's expected completions per second on its fair share: its
  Gittins index ``G_j`` (completions per reference second of service, from
  the online distribution of completed jobs' work,
  :class:`~pollux_opt.scheduling.policies.remaining.WorkHistory`) times its
  work rate ``r_j`` there; jobs likely to finish soon weigh more (SRPT /
  Gittins scheduling for mean JCT), with strength ``alpha`` (0: Pollux's
  weights), at most ``max_tilt`` halvings below the top;
* ``c_j = clip((rho_j - knee) / (bound - knee), 0, 1)``: fairness.  ``rho_j``
  is the job's predicted finish-time fairness (Themis, NSDI 2020) if it got
  its fair share from now on; as it passes ``knee`` the job's index is raised
  geometrically to the highest index of the round, ``Gamma_top = max_j H_j``,
  reached at ``bound``: a job about to exceed the bound is weighted like the
  job most likely to finish;
* ``f'_j(o)``: 1 if the option keeps the job's placement, else the restart
  factor that costs the move ``w_j (1 / f' - 1) = pi_j t_j (1 / f - 1)`` for
  Pollux's factor ``f`` (:func:`_restart_as_pollux`);
* ``pi_j``: the job's priority weight (``JobView.weight``) and ``t_j`` Pollux's
  tie-break factor (:data:`~pollux_opt.scheduling.policies.goodput.TIE_BREAK`).

A job may get :data:`FAIR_JCT_EXPLORATION` times the replicas it has been
measured on (Pollux: 2).  Each term is per job (weights, restart factors) or
per job and option (speedups), so the round is the same one-hot MILP as
Pollux's: the policy only sets the Problem's weights and restart factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from solvers import InvalidProblem

from pollux_opt.model import Cluster, GoodputModel, Job
from pollux_opt.model.job import restart_factor
from pollux_opt.model.domains import Real, domain_field
from pollux_opt.model.goodput import SearchCache
from pollux_opt.scheduling.loop import JobView
from pollux_opt.scheduling.policies.goodput import AllocatorPolicy
from pollux_opt.scheduling.policies.optimus import StepOracle
from pollux_opt.scheduling.policies.remaining import MIN_WORK_S, WorkHistory, one_node_rates, work_done
from pollux_opt.scheduling.policies.views import EXPLORATION_FACTORS, fair_share

__all__ = ["FAIR_JCT_EXPLORATION", "FAIRNESS_BOUND", "FAIRNESS_KNEE", "MAX_TILT", "FairJctOraclePolicy", "FairJctPolicy", "SRPT_STRENGTH", "predicted_rho"]

#: Exponent ``alpha`` of the remaining-work weights (project choice: a mild
#: tilt of the power mean; 0.25, 0.5 and 1 were tried on workload-6, docs/fair-jct.md).
SRPT_STRENGTH = 0.25
#: Predicted rho from which a job's priority starts to rise to the top (project
#: choice: half-way between a fair finish, 1, and the bound).
FAIRNESS_KNEE = 1.5
#: Predicted rho at which a job is served as if it were the shortest (project
#: choice: below the worst rho Pollux reaches on the AdaptDL workloads, about 3.8).
FAIRNESS_BOUND = 3.0
#: Largest tilt of a job's weight below the round's top, in halvings (project
#: choice: 2^-10; bounds the weights' spread, which sets how hard the MILP is).
MAX_TILT = 10.0
#: fair-jct's exploration cap: a job may get this many times the replicas it
#: has been measured on (Pollux: 2).  Project choice: 4 reached the first
#: efficient scale of the short jobs in one restart fewer (docs/fair-jct.md).
FAIR_JCT_EXPLORATION = 4
#: Smallest weight of a job (the lower end of the solvers' weight range,
#: ``solvers.domain.WEIGHT_RANGE``); the largest is about 1.
MIN_WEIGHT = 1e-6


def _rates(model: GoodputModel | None, share_replicas: int, cache: SearchCache | None = None) -> tuple[float, float]:
    """(reference rate, fair-share work rate) of a job of ``model``: its
    :func:`~pollux_opt.scheduling.policies.remaining.reference_rate`, and its
    work rate (reference seconds per second) on a fair share of
    ``share_replicas`` replicas on one node, as many as its largest batch can
    use (the linear prior without a model, 1 where either rate is unusable);
    both from one batch search (:func:`~pollux_opt.scheduling.policies.remaining.one_node_rates`)."""
    if model is None:
        return math.nan, float(share_replicas)
    lim = model.limits
    ref, at_share = one_node_rates(model, max(1, min(share_replicas, lim.max_batch_size // lim.min_local_bsz)), cache)
    if not math.isfinite(at_share) or not math.isfinite(ref) or ref <= 0:
        return ref, 1.0
    return ref, max(at_share / ref, 1e-9)


def _restart_as_pollux(job: Job, tilt: float, default_delay: float) -> Job:
    """``job`` with the restart factor ``f'`` that costs a move as much in the
    power mean (p = -1) as Pollux's factor ``f`` costs a job of Pollux's weight:
    ``w (1 / f' - 1) = w_pollux (1 / f - 1)`` with ``tilt = w / w_pollux`` (<= 1),
    i.e. ``f' = 1 / (1 + (1 / f - 1) / tilt)``.  Without it a job that the
    remaining-work weights make light moves almost for free, and every restart
    idles all its replicas for the restart delay.  Encoded through the job's
    age with no restarts: ``f' = age' / (age' + delay)``."""
    delay = default_delay if job.restart_delay is None else job.restart_delay
    f = restart_factor(job.age, job.restarts, delay)
    if f >= 1.0 or tilt >= 1.0:
        return job
    g = 0.0 if f <= 0 else 1.0 / (1.0 + (1.0 / f - 1.0) / tilt)
    return replace(job, age=delay * g / (1.0 - g), restarts=0, restart_delay=delay)


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
class FairJctPolicy(AllocatorPolicy):
    """Pollux's power mean with Gittins-index weights under a finish-time fairness bound.

    Attributes:
        alpha: strength of the remaining-work weights (>= 0; 0: Pollux's weights).
        knee: predicted rho from which a job's index rises (>= 1).
        bound: predicted rho at which it reaches the round's top index (> knee).
        by_family: estimate a job's work from completed jobs of its own model
            family (same batch limits) once there are any, else from all.
        max_tilt: most halvings of a job's weight below the round's top (>= 0).
        exploration_factor: the exploration cap's multiple of the measured
            replicas (:data:`FAIR_JCT_EXPLORATION`; Pollux's is 2).
    """

    name: str = "fair-jct"
    alpha: float = domain_field(SRPT_STRENGTH, Real(ge=0))
    knee: float = domain_field(FAIRNESS_KNEE, Real(ge=1))
    bound: float = domain_field(FAIRNESS_BOUND, Real(gt=1))
    by_family: bool = True
    max_tilt: float = domain_field(MAX_TILT, Real(ge=0))
    exploration_factor: int = domain_field(FAIR_JCT_EXPLORATION, EXPLORATION_FACTORS)
    _history: WorkHistory = field(init=False, repr=False)
    _last_tilts: dict[str, float] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bound <= self.knee:
            raise InvalidProblem(f"bound must be > knee, got bound={self.bound} and knee={self.knee}")
        self._history = WorkHistory(by_family=self.by_family)

    def estimates(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, tuple[float, float, float, float]]:
        """Job id -> (work done, estimated remaining work, Gittins index, predicted rho),
        work in reference seconds; also records the jobs that finished since the last call."""
        share = fair_share(cluster, len(active))[1]
        rates = {v.job_id: _rates(v.goodput_model, share, self._search_cache) for v in active}
        done = {v.job_id: work_done(v, rate=rates[v.job_id][0]) for v in active}
        self._history.observe(list(active), done)
        out = {}
        for v in active:
            rem = self._history.remaining(v, done[v.job_id])
            rho = predicted_rho(v.age, done[v.job_id], rem, rates[v.job_id][1])
            out[v.job_id] = (done[v.job_id], rem, self._history.gittins(v, done[v.job_id]), rho)
        return out

    def weights(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, float]:
        """Job id -> ``w_j`` of the module docstring (at least :data:`MIN_WEIGHT`); one
        call per round (it records the jobs that finished since the last one)."""
        base = super().weights(cluster, active)  # priority times tie-break
        out = self._weights(cluster, active, self.estimates(cluster, active), base)
        self._last_tilts = {j: w / base[j] for j, w in out.items()}  # for the round's restart factors
        return out

    def _weights(self, cluster: Cluster, active: Sequence[JobView],
                 est: dict[str, tuple[float, float, float, float]], base: dict[str, float]) -> dict[str, float]:
        share = fair_share(cluster, len(active))[1]
        # completions per second on the speedup's base allocation (a fair share, see
        # views._feasible_base): G_j times its work rate there
        index = {v.job_id: est[v.job_id][2] * _rates(v.goodput_model, share, self._search_cache)[1] for v in active}
        top = max(index.values())
        floor = -self.max_tilt * math.log(2.0)
        out = {}
        for v in active:
            rho = est[v.job_id][3]
            c = min(max((rho - self.knee) / (self.bound - self.knee), 0.0), 1.0)
            # log(Gamma / top) = (1 - c) log(H / top): the raised index, relative to the top
            log_tilt = max(self.alpha * (1.0 - c) * math.log(index[v.job_id] / top), floor)
            out[v.job_id] = max(base[v.job_id] * math.exp(log_tilt), MIN_WEIGHT)
        return out

    def allocator_jobs(self, cluster: Cluster, active: Sequence[JobView]) -> list[Job]:
        """Pollux's allocator jobs with the weights of :meth:`weights` and, for a
        running job, the restart factor of :func:`_restart_as_pollux`."""
        jobs = super().allocator_jobs(cluster, active)  # calls self.weights once
        by_id = {v.job_id: v for v in active}
        return [_restart_as_pollux(job, self._last_tilts[job.id], self.options.restart_delay)
                if by_id[job.id].placement else job for job in jobs]


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
            ref, fair = _rates(model, share, self._search_cache)
            rem = max(self.oracle.remaining_steps(v.job_id, model.limits.init_batch_size) / ref, MIN_WORK_S)
            out[v.job_id] = (done, rem, 1.0 / rem, predicted_rho(v.age, done, rem, fair))
        return out
