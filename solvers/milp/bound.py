"""Stage 2 of the MILP: the Lagrangian bound of the aggregated relaxation.

:func:`relax` prices CPUs (and, with interference avoidance, multi-node
slots) so that every job's best choice fits the cluster's totals on
average; the result is an upper bound on the utility sum of every feasible
placement and a reduced cost per option, which the formulations
(:mod:`solvers.milp.strategy`) use to decide which options a model offers
and to certify its answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..problem import Problem
from .options import OptionTable

__all__ = ["Relaxation", "relax"]

#: Bisection steps per price when minimising the Lagrangian (2^-40 of the price range).
_PRICE_STEPS = 40
#: Rounds of alternating between the two prices when the slot total binds.
_PRICE_ROUNDS = 3


@dataclass(frozen=True)
class Relaxation:
    """Lagrangian bound of the aggregated relaxation, and reduced costs of options.

    The relaxation keeps one choice per job but replaces the node-level
    constraints by two totals: replicas <= total capacity, and (with
    interference avoidance) nodes spanned by multi-node jobs <= number of
    nodes.  Pricing them at ``cpu_price`` (lambda) and ``slot_price`` (mu) gives,
    for any lambda, mu >= 0, the upper bound

        L = lambda CAP + mu NODES + sum_j max(w_j u(0), max_o (w_j u_o - lambda K_o - mu N_o))

    on the utility sum of every feasible placement (weak duality; N_o counts
    only for multi-node options).  An option o of job j has reduced cost
    ``rc_o = best_j - (w_j u_o - lambda K_o - mu N_o) >= 0``, and every
    placement using it is worth at most ``L - rc_o``.  Sums run over each
    job's best value, never over gains against u(0), which for p < -1 is
    huge (-1e12 at p = -4) and would cancel most digits.
    """

    bound: float  # L, an upper bound on the utility sum
    cpu_price: float  # lambda
    slot_price: float  # mu
    reduced_cost: np.ndarray  # float64[O]


@dataclass(frozen=True)
class _Entries:
    """The relaxation's choices, sorted by job: options, keeps, and one "hold nothing" per job.

    Arrays are float64[E] in job order (``order`` maps back); ``starts``
    int64[J'] are the first entry of each job that has entries.
    """

    worth: np.ndarray  # w_j u of the choice (-inf for an option that fits no node)
    gain: np.ndarray  # worth - w_j u(0)
    reps: np.ndarray  # replicas K the choice uses
    span: np.ndarray  # multi-node slots it takes (0 without interference avoidance)
    order: np.ndarray  # int64[E]: entry positions before sorting by job
    starts: np.ndarray
    counts: np.ndarray  # int64[J']: entries of each job that has entries

    def _values(self, lam: float, mu: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(entry values, each job's best, each entry's job best) at prices ``lam``, ``mu``."""
        value = self.worth - lam * self.reps - mu * self.span
        best = np.maximum.reduceat(value, self.starts)
        return value, best, np.repeat(best, self.counts)

    def used(self, lam: float, mu: float, per: np.ndarray) -> float:
        """Sum over jobs of the least ``per`` (``reps`` or ``span``) among the job's best choices.

        Ties count their smallest use, so the subgradient errs towards lower prices.
        """
        if self.worth.size == 0:
            return 0.0
        value, _, best_each = self._values(lam, mu)
        return float(np.minimum.reduceat(np.where(value >= best_each, per, np.inf), self.starts).sum())

    def evaluate(self, lam: float, mu: float) -> tuple[float, np.ndarray, np.ndarray]:
        """(sum of job bests, entry values, each entry's job best)."""
        if self.worth.size == 0:
            value = self.worth - lam * self.reps - mu * self.span
            return 0.0, value, value
        value, best, best_each = self._values(lam, mu)
        return float(best.sum()), value, best_each


def _entries(problem: Problem, table: OptionTable) -> _Entries:
    """The choices of every job as :class:`_Entries`."""
    slots = problem.interference_avoidance
    placeable = (table.hi > 1) | (table.reps <= problem.capacity.max(initial=0))
    jobs = np.arange(problem.num_jobs)
    job = np.concatenate([table.job, table.keep, jobs])
    worth = np.concatenate([np.where(placeable, table.worth, -np.inf), table.keep_worth, table.idle_worth])
    gain = worth - table.idle_worth[job]
    reps = np.concatenate([table.reps, table.keep_reps, np.zeros(jobs.size)]).astype(np.float64)
    span = np.concatenate(
        [
            np.where(table.hi > 1, table.lo, 0),
            np.where(table.keep_nodes > 1, table.keep_nodes, 0),
            np.zeros(jobs.size),
        ]
    )
    span = span.astype(np.float64) * slots
    order = np.argsort(job, kind="stable")
    sorted_job = job[order]
    starts = np.flatnonzero(np.r_[True, sorted_job[1:] != sorted_job[:-1]]) if job.size else np.zeros(0, int)
    counts = np.diff(np.append(starts, job.size))
    return _Entries(worth[order], gain[order], reps[order], span[order], order, starts, counts)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


def _lowest_price(
    use: Callable[[float], float], limit: float, gain: np.ndarray, per: np.ndarray, deadline: float | None
) -> float:
    """Smallest price in [0, max gain / use] at which ``use(price) <= limit`` (bisection).

    Stops early at ``deadline`` with the upper end of the bracket (any price
    gives a valid bound; this one satisfies the total).
    """
    if use(0.0) <= limit:
        return 0.0
    ratio = gain / np.maximum(per, 1.0)
    lo, hi = 0.0, float(np.max(ratio[np.isfinite(ratio)], initial=0.0))
    for _ in range(_PRICE_STEPS):
        if _past(deadline):
            break
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if use(mid) > limit else (lo, mid)
    return hi


def relax(problem: Problem, table: OptionTable, deadline: float | None = None) -> Relaxation:
    """Minimise the Lagrangian bound over the two prices (see :class:`Relaxation`).

    The bound is convex and piecewise linear in each price; each price is found
    by bisection on the sign of its subgradient (capacity minus the totals the
    best choices use).  Any prices give a valid bound, so stopping early (at
    ``deadline``, a ``time.perf_counter()`` value) is safe.
    """
    cap_total, nodes_total = float(problem.capacity.sum()), float(problem.num_nodes)
    e = _entries(problem, table)

    def cpu_price(mu: float) -> float:
        return _lowest_price(lambda lam: e.used(lam, mu, e.reps), cap_total, e.gain, e.reps, deadline)

    def slot_price(lam: float) -> float:
        return _lowest_price(lambda mu: e.used(lam, mu, e.span), nodes_total, e.gain, e.span, deadline)

    lam, mu = cpu_price(0.0), 0.0
    for _ in range(_PRICE_ROUNDS if problem.interference_avoidance else 0):
        if (mu == 0.0 and e.used(lam, mu, e.span) <= nodes_total) or _past(deadline):
            break  # the slot total does not bind at mu = 0, or the time is up
        mu = slot_price(lam)
        lam = cpu_price(mu)
    best_sum, value, best_each = e.evaluate(lam, mu)
    bound = lam * cap_total + mu * nodes_total + best_sum
    rc = np.empty(e.order.size)
    rc[e.order] = best_each - value
    return Relaxation(bound=float(bound), cpu_price=lam, slot_price=mu, reduced_cost=rc[: table.job.size])
