"""Finish-time fairness as a constraint on an encoded allocation problem (plain arrays).

:func:`bound_rho` takes the round's :class:`solvers.Problem` of a linear
objective (p = 1: ``sum_j w_j x_j``) and each job's fairness outlook
(:class:`RhoOutlook`) and returns the problem in which every job whose
predicted finish-time fairness ``rho`` (Themis, NSDI 2020: its JCT over its
JCT alone on a fair share, as submitted) would pass ``bound`` if it held
nothing for the next round may only take the configurations that keep it
within the bound.

**Prediction.**  A job that holds configuration ``o`` for the next round of
``L`` seconds and a fair share afterwards finishes with

    rho_j(o) = rho_j + (L - s_j(o) L_j(o)) / I_j

where ``rho_j`` is its predicted rho on a fair share from now on, ``I_j`` its
isolated JCT (seconds), ``s_j(o)`` the configuration's speedup over the fair
share and ``L_j(o)`` the seconds of the round it trains: ``L`` if it keeps its
placement or starts, ``L - delay_j`` if it moves (a restart).  Holding
nothing is ``s = 0``.

**Constraint.**  For a job with ``rho_j(nothing) > bound`` the allowed
configurations are those with ``rho_j(o) <= bound``; where there are none (the
job is already past the bound), those with ``s_j(o) >= 1``, at least its
fair-share speed, so that its rho stops rising (``past="hold"``), or else its
fastest ones; ``past="fastest"`` takes the configurations of least
``rho_j(o)`` directly.  Holding nothing is not allowed either.

**Encoding.**  :class:`solvers.Problem` lets every job hold nothing, so the
constraint enters as a penalty: holding an allowed configuration earns the
job a bonus ``b_j = 1 + sigma K_j + r``, more than the other jobs lose when
they make room for its smallest allowed configuration by shrinking and moving
one job: ``sigma`` is the most utility per CPU of any configuration, ``K_j``
the CPUs of that configuration, ``r`` the largest restart price of a job that
keeps its configuration now (``(1 - f_k) w_k s_k``), and 1 a unit of weight
(the largest weight is near 1) as the margin.  The bonus is kept this small
on purpose: a larger one spreads the objective's coefficients and made
HiGHS's branch and bound twice as slow, for the same mean JCT.  Where the
cluster's CPUs cannot hold every constrained job's smallest allowed
configuration, the solver chooses whom to hold: each bonus is then
``2 (1 + sigma K + r)`` (``K``: the most CPUs of any allowed configuration),
more than any configuration's CPUs could earn others, times
``priority_j rho_j(nothing) / bound``, so that the held jobs are those with the
most priority-weighted rho past the bound that the CPUs can hold.  It is
the same for every allowed configuration of a job, so the choice among them
is the objective's as before: with weight ``w' = w + b`` and speedups
``s' = (w s + b) / w'`` for keeping the current shape and
``(w f s + b) / (w' f)`` for another (``f``: the job's restart factor, which
the solver applies to a move), a stay is worth ``w s + b`` and a move
``w f s + b``, Pollux's restart price plus the bonus.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from solvers import MAX_SPEEDUP, InvalidProblem, Problem

__all__ = ["PAST_BOUND_RULES", "RhoOutlook", "bound_rho"]

#: What a job already past the bound may take (see the module docstring).
PAST_BOUND_RULES = ("hold", "fastest")
#: Relative tolerance of "the fastest" / "the least rho" configurations.
_TIE = 1e-9


@dataclass(frozen=True)
class RhoOutlook:
    """Each job's finish-time fairness outlook, rows in the problem's job order.

    Attributes:
        rho: float64[J] predicted rho on a fair share from now on (nan: unknown, unconstrained).
        isolated_s: float64[J] the job's JCT alone on a fair share as submitted, seconds (> 0).
        delay_s: float64[J] seconds a restart costs the job.
        priority: float64[J] the jobs' priority weights (> 0).
        lookahead_s: L, seconds of the next round (> 0).
    """

    rho: np.ndarray
    isolated_s: np.ndarray
    delay_s: np.ndarray
    priority: np.ndarray
    lookahead_s: float

    def __post_init__(self) -> None:
        for name in ("rho", "isolated_s", "delay_s", "priority"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        if not (math.isfinite(self.lookahead_s) and self.lookahead_s > 0):
            raise InvalidProblem(f"lookahead_s must be finite and > 0, got {self.lookahead_s!r}")


def _stays(problem: Problem, j: int) -> np.ndarray:
    """bool over job j's configurations: the (type, nodes, replicas) it holds now."""
    lo, hi = problem.cfg_start[j], problem.cfg_start[j + 1]
    row = problem.current[j]
    if not row.any():
        return np.zeros(hi - lo, dtype=bool)
    used = row > 0
    return ((problem.cfg_nodes[lo:hi] == used.sum()) & (problem.cfg_replicas[lo:hi] == row.sum())
            & (problem.cfg_type[lo:hi] == problem.node_type[used][0]))


def _allowed(problem: Problem, j: int, out: RhoOutlook, bound: float,
             past: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(job j's allowed configurations, those that keep its placement), bool over its
    configurations; None where it is not constrained."""
    rho, iso, look = out.rho[j], out.isolated_s[j], out.lookahead_s
    lo, hi = problem.cfg_start[j], problem.cfg_start[j + 1]
    if not (math.isfinite(rho) and math.isfinite(iso) and iso > 0) or rho + look / iso <= bound or hi == lo:
        return None
    s, stays = problem.cfg_speedup[lo:hi], _stays(problem, j)
    trained = np.where(stays | ~problem.has_current[j], look, max(look - out.delay_s[j], 0.0))
    cfg_rho = rho + (look - s * trained) / iso
    ok = cfg_rho <= bound
    if not ok.any():
        if past == "fastest":
            ok = cfg_rho <= cfg_rho.min() * (1 + _TIE)
        else:
            ok = s >= 1.0 if (s >= 1.0).any() else s >= s.max() * (1 - _TIE)
    return ok, stays


def _bonuses(problem: Problem, outlook: RhoOutlook, allowed: dict[int, np.ndarray], stays: list[np.ndarray],
             sigma: float, bound: float) -> dict[int, float]:
    """Job -> its bonus for holding an allowed configuration (see the module docstring)."""
    sizes = {j: problem.cfg_replicas[problem.cfg_start[j]:problem.cfg_start[j + 1]][ok] for j, ok in allowed.items()}
    restart = max(((1.0 - problem.restart_factor[k]) * problem.weight[k]
                   * float(problem.cfg_speedup[problem.cfg_start[k]:problem.cfg_start[k + 1]][st].max())
                   for k, st in enumerate(stays) if st.any()), default=0.0)
    if sum(int(k.min()) for k in sizes.values()) <= int(problem.capacity.sum()):
        return {j: 1.0 + sigma * float(k.min()) + restart for j, k in sizes.items()}
    unit = 2.0 * (1.0 + sigma * max(float(k.max()) for k in sizes.values()) + restart)
    return {j: unit * outlook.priority[j] * (outlook.rho[j] + outlook.lookahead_s / outlook.isolated_s[j]) / bound
            for j in allowed}


def bound_rho(problem: Problem, outlook: RhoOutlook, bound: float, *,
              past: Literal["hold", "fastest"] = "hold") -> Problem:
    """``problem`` (p = 1) with each job kept within the fairness ``bound`` (see the module docstring).

    Raises:
        InvalidProblem: ``problem.p`` is not 1, the outlook's rows do not match
            its jobs, an unknown ``past`` rule, or a ``bound`` not above 1.
    """
    if problem.p != 1.0:
        raise InvalidProblem(f"bound_rho needs the linear objective, p = 1; got p={problem.p}")
    if outlook.rho.shape != (problem.num_jobs,):
        raise InvalidProblem(f"outlook has {outlook.rho.shape} rows for {problem.num_jobs} jobs")
    if past not in PAST_BOUND_RULES:
        raise InvalidProblem(f"past must be one of {PAST_BOUND_RULES}, got {past!r}")
    if not (isinstance(bound, (int, float)) and math.isfinite(bound) and bound > 1):
        raise InvalidProblem(f"bound must be a finite number > 1, got {bound!r}")
    found = {j: r for j in range(problem.num_jobs) if (r := _allowed(problem, j, outlook, bound, past)) is not None}
    if not found:
        return problem
    allowed = {j: ok for j, (ok, _) in found.items()}
    stays = [found[j][1] if j in found else _stays(problem, j) for j in range(problem.num_jobs)]
    keep = np.ones(problem.num_configs, dtype=bool)
    speed, weight = problem.cfg_speedup.copy(), problem.weight.copy()
    sigma = float(np.max(problem.weight[problem.cfg_job] * problem.cfg_speedup / problem.cfg_replicas, initial=0.0))
    bonus = _bonuses(problem, outlook, allowed, stays, sigma, bound)
    for j, ok in allowed.items():
        lo, hi = problem.cfg_start[j], problem.cfg_start[j + 1]
        keep[lo:hi] = ok
        w, s = weight[j], problem.cfg_speedup[lo:hi]
        f = float(problem.restart_factor[j]) if problem.has_current[j] and problem.restart_factor[j] > 0 else 1.0
        weight[j] = w + bonus[j]
        moved = np.minimum((w * s + bonus[j] / f) / weight[j], MAX_SPEEDUP)  # a factor near 0 bars moves
        speed[lo:hi] = np.where(stays[j], (w * s + bonus[j]) / weight[j], moved)
    return replace(problem, cfg_job=problem.cfg_job[keep], cfg_nodes=problem.cfg_nodes[keep],
                   cfg_replicas=problem.cfg_replicas[keep], cfg_speedup=speed[keep],
                   cfg_type=problem.cfg_type[keep] if problem.typed else None, weight=weight)
