"""``fair-jct``: goodput allocation for mean JCT, with finish-time fairness as a constraint.

The same exact one-hot MILP as Pollux (each job's options are (nodes,
replicas) with its speedup over a fair share from its goodput model at the
goodput-best batch, Pollux's restart factor per job, interference avoidance:
Pollux, OSDI 2021, section 4), with a linear objective (the power mean with
p = 1) in place of Pollux's p = -1:

    maximise  sum_j w_j s_j(o_j) f_j(o_j)

* ``s_j(o)``: the speedup over the job's fair share, capped by its own replica
  limit (a one-replica job runs its fair share on one replica);
  ``f_j(o)``: Pollux's restart factor on a move, 1 otherwise;
* ``w_j = t_j mu_j``: the weights under which this objective minimises the
  mean flow time of the jobs present if they complete shortest first
  (:mod:`.flow_weights`: heSRPT, Berg, Vesilo and Harchol-Balter, SPAA 2019
  and 2020, and SmartFill's rule for general concave speedups).  ``mu_j``
  depends on the completion order and the jobs' speedup curves (their goodput
  on 1..cap replicas, the cap of :func:`~.views.replica_cap`, on as few nodes
  as hold them, concave hull), not on their sizes: completing a job lowers
  the best weighted speed of the jobs left by its priority ``pi_j``.  The
  order is by expected remaining time on the job's whole curve over priority,
  ``R_j / (phi_j C_j pi_j)`` (Smith's rule), ``R_j`` the online estimate of its
  remaining work (:class:`~pollux_opt.scheduling.policies.remaining.WorkHistory`:
  the mean residual work of completed jobs like it; no oracle), ``phi_j`` its
  work rate on the fair share and ``C_j`` its speedup at the cap over the fair
  share: the time it needs when the weights serve it, which is what a
  shortest-first order ranks; ``t_j`` is Pollux's tie-break factor.

``weighting="rank"`` uses heSRPT's weights for a speedup ``k^beta``,
``pi_j t_j (r_j / m)^beta`` (``r_j`` the job's rank among the ``m`` active
jobs by ``R_j / phi_j``, 1: the longest; ``beta`` = :data:`RANK_POWER`), and
``weighting="rate"`` the expected completion rates ``phi_j / R_j`` (the
objective is then the cluster's expected completion rate, which gives the
shortest jobs CPUs far past their efficient scale); both measure worse
(docs/fair-jct.md).

Fairness is a constraint, not a weight (:mod:`.rho_bound`): a job whose
predicted finish-time fairness ``rho`` would pass ``bound`` (2 by default) if
it waited a round may only take the options that keep it within the bound (or,
already past it, at least its fair-share speed).  ``rho`` uses the same
reference as the run's metrics (:func:`~pollux_opt.model.goodput.isolated_rate`:
the job alone on a fair share, trained as submitted), its work done plus the
estimate of its remaining work, and a fair share from now on.  A job that has
not started is kept within the bound as if it were as short as
:data:`~pollux_opt.scheduling.policies.remaining.MIN_WORK_S` (its size is not
known; a short job's rho suffers most from waiting).

A job may get :data:`FAIR_JCT_EXPLORATION` times the replicas it has been
measured on (Pollux: 2).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np
from scipy.stats import rankdata

from solvers import InvalidProblem, Problem

from pollux_opt.model import Cluster, GoodputModel, Job, Options
from pollux_opt.model.domains import Boolean, Choice, Real, domain_field
from pollux_opt.model.goodput import SearchCache, isolated_rate, memo_beside_search_cache
from pollux_opt.scheduling.loop import JobView
from pollux_opt.scheduling.policies.goodput import AllocatorPolicy
from pollux_opt.scheduling.policies.flow_weights import flow_weights, hull_increments
from pollux_opt.scheduling.policies.optimus import StepOracle
from pollux_opt.scheduling.policies.remaining import MIN_WORK_S, WorkHistory, one_node_rates, work_done
from pollux_opt.scheduling.policies.rho_bound import PAST_BOUND_RULES, RhoOutlook, bound_rho
from pollux_opt.scheduling.policies.views import (
    EXPLORATION_FACTORS, compact_goodput, fair_share, feasible_base, job_for_allocator, replica_cap,
)

__all__ = [
    "FAIRNESS_BOUND", "FAIR_JCT_EXPLORATION", "Estimate", "FairJctOraclePolicy", "FairJctPolicy", "RANK_POWER",
    "WEIGHTINGS",
]

#: Default bound on a job's predicted finish-time fairness rho (project choice:
#: twice its JCT alone on a fair share).
FAIRNESS_BOUND = 2.0
#: ``beta``, the exponent of ``weighting="rank"`` (see the module docstring).
RANK_POWER = 0.5
#: How the objective weights the jobs (see the module docstring); the first is the default.
WEIGHTINGS = ("flow", "rank", "rate")
#: fair-jct's exploration cap: a job may get this many times the replicas it
#: has been measured on (Pollux: 2).  Project choice: the short jobs reach their
#: first efficient scale in one restart fewer (docs/fair-jct.md).
FAIR_JCT_EXPLORATION = 4
#: fair-jct's relative MIP gap (Pollux's: 1e-4).  Project choice: the weights
#: rest on estimated remaining times, so answers within 0.1 % of the best are
#: equally good; on the linear objective HiGHS's branch and bound is most of the
#: extra time, and this gap takes about a fifth of it away (docs/fair-jct.md).
FAIR_JCT_MIP_GAP = 1e-3
#: Seconds of a round before two rounds have been seen: Pollux's scheduling
#: interval (OSDI 2021, section 5).
DEFAULT_LOOKAHEAD_S = 60.0
#: Rounds whose spacing sets the lookahead (their mean).
_LOOKAHEAD_ROUNDS = 20
#: Smallest weight of a job (the lower end of ``solvers.domain.WEIGHT_RANGE``).
MIN_WEIGHT = 1e-6
#: Models whose submitted-configuration rates are cached (a few rounds of jobs).
_RATE_CACHE_SIZE = 4096


class Estimate(NamedTuple):
    """What fair-jct estimates of one job: work in reference seconds
    (:mod:`~pollux_opt.scheduling.policies.remaining`) and the rates of :func:`_rates`."""

    done: float
    remaining: float
    ref: float  # progress per second on one replica (nan without a model)
    phi: float  # work rate on the fair share it can hold, reference seconds per second


@functools.lru_cache(maxsize=_RATE_CACHE_SIZE)
def _submitted_rate(model: GoodputModel, cpus: float, batch: int, max_replicas: int, node_cpus: int) -> float:
    return isolated_rate(model, cpus, batch, max_replicas, node_cpus)


@memo_beside_search_cache(maxsize=_RATE_CACHE_SIZE)
def _model_curve(model: GoodputModel, fixed_batch_size: int | None, cap: int, base: tuple[int, int],
                 node_cpus: int, cache: SearchCache | None = None) -> tuple[np.ndarray, float]:
    """:meth:`FairJctPolicy._curve` of a job with a model (read-only arrays); memoized, as a
    waiting job's model and share repeat from round to round."""
    goodput = compact_goodput(model, np.arange(1, cap + 1), node_cpus, fixed_batch_size, cache)
    if not goodput[0] > 0:
        return _frozen(np.zeros(0)), 1.0
    at_base = model.optimize(np.array([base[0]]), np.array([base[1]]), fixed_batch_size=fixed_batch_size,
                             cache=cache).goodput
    return (_frozen(hull_increments(np.concatenate([[0.0], goodput / goodput[0]]))),
            float(np.asarray(at_base)[0] / goodput[0]))


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _own_share(view: JobView, share: int) -> int:
    """The fair share's replicas that the job can hold (its own replica limit)."""
    return max(1, min(share, view.max_replicas))


def _rates(model: GoodputModel | None, replicas: int, cache: SearchCache | None = None) -> tuple[float, float]:
    """(reference rate, fair-share work rate ``phi``) of a job of ``model``: its
    progress per second on one replica at the goodput-best batch, and its work
    rate (reference seconds per second) on ``replicas`` replicas of one node,
    as many as its largest batch can use (the linear prior without a model;
    1 where either rate is unusable)."""
    if model is None:
        return math.nan, float(replicas)
    lim = model.limits
    ref, at_share = one_node_rates(model, max(1, min(replicas, lim.max_batch_size // lim.min_local_bsz)), cache)
    if not math.isfinite(at_share) or not math.isfinite(ref) or ref <= 0:
        return ref, 1.0
    return ref, max(at_share / ref, 1e-9)


@dataclass
class FairJctPolicy(AllocatorPolicy):
    """Goodput allocation for mean JCT under a finish-time fairness bound (see the module docstring).

    Attributes:
        options: the allocation options; ``p`` must be 1 (the objective is
            linear); default: ``mip_gap`` :data:`FAIR_JCT_MIP_GAP`.
        bound: the bound on a job's predicted rho (> 1; None: no bound).
        rank_power: ``beta``, the exponent of ``weighting="rank"`` (>= 0; 0: every job alike).
        weighting: ``"flow"`` (the flow-time weights of the jobs' speedup curves),
            ``"rank"`` (heSRPT's weights of a speedup ``k^beta``) or ``"rate"``
            (expected completion rates).
        past_bound: what a job already past the bound may take: ``"hold"``
            (at least its fair-share speed) or ``"fastest"`` (its most rho-reducing options).
        by_family: estimate a job's work from completed jobs of its own model
            family (same batch limits) once there are any, until then by the
            Lindy fallback; false: from all completed jobs.
        exploration_factor: the exploration cap's multiple of the measured replicas.
    """

    name: str = "fair-jct"
    options: Options = field(default_factory=lambda: Options(p=1.0, mip_gap=FAIR_JCT_MIP_GAP))
    bound: float | None = domain_field(FAIRNESS_BOUND, Real(gt=1, none=True))
    rank_power: float = domain_field(RANK_POWER, Real(ge=0))
    weighting: str = domain_field(WEIGHTINGS[0], Choice(WEIGHTINGS))
    past_bound: str = domain_field("hold", Choice(PAST_BOUND_RULES))
    by_family: bool = domain_field(True, Boolean())
    exploration_factor: int = domain_field(FAIR_JCT_EXPLORATION, EXPLORATION_FACTORS)
    _history: WorkHistory = field(init=False, repr=False)
    _rounds: list[float] = field(init=False, repr=False, default_factory=list)
    _outlook: RhoOutlook | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.options.p != 1.0:
            raise InvalidProblem(f"fair-jct's objective is linear: options.p must be 1, got {self.options.p}")
        self._history = WorkHistory(by_family=self.by_family)

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]):
        self._rounds = (self._rounds + [float(now)])[-(_LOOKAHEAD_ROUNDS + 1):]
        return super().decide(now, cluster, jobs)

    def lookahead(self) -> float:
        """Seconds of the next round: the mean spacing of the last rounds seen."""
        gaps = np.diff(self._rounds)
        gaps = gaps[gaps > 0]
        return float(gaps.mean()) if gaps.size else DEFAULT_LOOKAHEAD_S

    def estimates(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, Estimate]:
        """Job id -> :class:`Estimate`; also records the jobs that finished since the last call."""
        share = fair_share(cluster, len(active))[1]
        rates = {v.job_id: _rates(v.goodput_model, _own_share(v, share), self._search_cache) for v in active}
        done = {v.job_id: work_done(v, rate=rates[v.job_id][0]) for v in active}
        self._history.observe(list(active), done)
        return {v.job_id: Estimate(done[v.job_id], self._history.remaining(v, done[v.job_id]), *rates[v.job_id])
                for v in active}

    def weights(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, float]:
        """Job id -> ``w_j`` of the module docstring (at least :data:`MIN_WEIGHT`); one call
        per round (it records the jobs that finished and the round's fairness outlook)."""
        base = super().weights(cluster, active)  # priority times tie-break
        est = self.estimates(cluster, active)
        speed = np.array([est[v.job_id].phi / est[v.job_id].remaining for v in active])  # 1 / time left
        if self.weighting == "flow":
            index = self._flow_index(cluster, active, speed, np.array([base[v.job_id] for v in active]))
        else:
            index = rankdata(speed) ** self.rank_power if self.weighting == "rank" else speed
        top = float(index.max())
        index = index / top if top > 0 else np.ones(len(active))
        self._outlook = self._rho_outlook(cluster, active, est)
        return {v.job_id: max(base[v.job_id] * float(x), MIN_WEIGHT) for v, x in zip(active, index)}

    def _flow_index(self, cluster: Cluster, active: Sequence[JobView], speed: np.ndarray,
                    base: np.ndarray) -> np.ndarray:
        """``mu_j / pi_j`` in units of each job's fair-share speedup (see the module docstring);
        ``speed``: 1 / the jobs' expected remaining time on the fair share;
        ``base``: the jobs' priorities times tie-break factors, which order jobs of equal time left."""
        nodes, share = fair_share(cluster, len(active))
        node_cpus = max(n.cpus for n in cluster.nodes)
        priority = np.array([v.weight for v in active], dtype=float)
        curves = [self._curve(v, cluster, (nodes, _own_share(v, share)), node_cpus) for v in active]
        full = np.array([gains.sum() / unit for gains, unit in curves])  # C_j: speedup at the cap
        order = np.lexsort((base, speed * full * priority))  # the last to complete first
        mu = np.empty(len(active))
        mu[order] = flow_weights([curves[i][0] for i in order], priority[order], cluster.total_cpus)
        return mu * np.array([unit for _, unit in curves]) / priority

    def _curve(self, view: JobView, cluster: Cluster, share: tuple[int, int],
               node_cpus: int) -> tuple[np.ndarray, float]:
        """(the hull increments of the job's speedup over 1..cap replicas in units of its
        one-replica goodput, its fair-share base in the same units): the linear prior
        without a model, as the allocator's :func:`~.views.job_for_allocator`."""
        cap = replica_cap(view, cluster, self.exploration_factor)
        if view.goodput_model is None:
            return np.ones(cap), float(share[1])
        return _model_curve(view.goodput_model, view.fixed_batch_size, cap, feasible_base(view, share), node_cpus,
                            self._search_cache)

    def _rho_outlook(self, cluster: Cluster, active: Sequence[JobView], est: dict[str, Estimate]) -> RhoOutlook:
        """Each job's predicted rho on a fair share and its isolated JCT (see the module docstring)."""
        share_cpus = cluster.total_cpus / len(active)
        node_cpus = max(n.cpus for n in cluster.nodes)
        rho, iso = np.full(len(active), math.nan), np.full(len(active), math.nan)
        for i, v in enumerate(active):
            done, rem, ref, phi = est[v.job_id]
            if not v.placement and v.progress <= 0:
                rem = MIN_WORK_S  # not started: as short as a job may be
            if v.goodput_model is None or not math.isfinite(ref):
                iso[i] = (done + rem) / phi  # the linear prior's fair share
            else:
                sub = _submitted_rate(v.goodput_model, share_cpus, int(v.submitted_batch_size),
                                      int(v.max_replicas), node_cpus)
                iso[i] = (done + rem) * ref / sub if math.isfinite(sub) and sub > 0 else math.nan
            rho[i] = (v.age + rem / phi) / iso[i]
        return RhoOutlook(rho=rho, isolated_s=iso, delay_s=np.array([v.restart_delay for v in active]),
                          priority=np.array([v.weight for v in active]), lookahead_s=self.lookahead())

    def allocator_jobs(self, cluster: Cluster, active: Sequence[JobView]) -> list[Job]:
        """The allocator's jobs with the weights of :meth:`weights` and each job's
        speedups over the fair share that it can hold (:func:`_own_share`)."""
        weight = self.weights(cluster, active)
        nodes, share = fair_share(cluster, len(active))
        return [job_for_allocator(v, cluster, self.options, weight=weight[v.job_id],
                                  share=(nodes, _own_share(v, share)), exploration_factor=self.exploration_factor)
                for v in active]

    def refiner(self, active: Sequence[JobView]) -> Callable[[Problem], Problem] | None:
        """The fairness bound on the round's problem (:func:`~.rho_bound.bound_rho`); None without a bound."""
        if self.bound is None or self._outlook is None:
            return None
        outlook, bound, past = self._outlook, self.bound, self.past_bound
        return lambda problem: bound_rho(problem, outlook, bound, past=past)


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

    def estimates(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, Estimate]:
        out = super().estimates(cluster, active)
        for v in active:
            ref = out[v.job_id].ref
            if v.goodput_model is None or not (math.isfinite(ref) and ref > 0):
                continue
            steps = self.oracle.remaining_steps(v.job_id, v.goodput_model.limits.init_batch_size)
            out[v.job_id] = out[v.job_id]._replace(remaining=max(steps / ref, MIN_WORK_S))
        return out
