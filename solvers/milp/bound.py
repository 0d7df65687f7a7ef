"""Stage 2 of the MILP: the Lagrangian bound of the aggregated relaxation.

:func:`relax` prices CPUs (and, with interference avoidance, multi-node
slots) so that every job's best choice fits the cluster's totals on
average; the result is an upper bound on the utility sum of every feasible
placement and a reduced cost per option, which the formulations
(:mod:`solvers.milp.strategy`) use to decide which options a model offers
and to certify its answer.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..problem import Problem
from .options import OptionTable

__all__ = ["Relaxation", "relax"]

#: Bisection steps per price when minimising the Lagrangian (2^-40 of the price range).
_PRICE_STEPS = 40
#: Bisection steps of the one CPU price from which the typed LP picks its first
#: columns (2^-12 of the price range): only a start, which the column
#: generation corrects.  On Sia's 64-GPU cluster with 40 jobs (ten seeds), 12
#: steps took as many LP rounds as 40.
_START_PRICE_STEPS = 12
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
    only for multi-node options).  With node types the totals are per type
    (capacity and nodes of type t; prices lambda_t, mu_t applied to the
    options of type t), a tighter bound of the same form, whose prices come
    from the aggregated LP (:func:`_relax_typed`).  An option o of job j has reduced cost
    ``rc_o = best_j - (w_j u_o - lambda K_o - mu N_o) >= 0``, and every
    placement using it is worth at most ``L - rc_o``.  Sums run over each
    job's best value, never over gains against u(0), which for p < -1 is
    huge (-1e12 at p = -4) and would cancel most digits.
    """

    bound: float  # L, an upper bound on the utility sum
    cpu_price: float | np.ndarray  # lambda (float64[T] with node types)
    slot_price: float | np.ndarray  # mu (float64[T] with node types)
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
    kind: np.ndarray | None = None  # int64[E] node type of each entry (None without types)

    def _values(self, lam, mu) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(entry values, each job's best, each entry's job best) at prices ``lam``, ``mu`` (per type with types)."""
        if self.kind is not None and np.ndim(lam):  # per-type prices (scalars: one price for all types)
            lam, mu = lam[self.kind], mu[self.kind]
        # A price of +0.0 subtracts +0.0 from every entry, which leaves it as it is (to the bit): skipped.
        value = self.worth.copy() if _plus_zero(lam) else self.worth - lam * self.reps
        if not _plus_zero(mu):
            value -= mu * self.span
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
            return 0.0, self.worth.copy(), self.worth.copy()
        value, best, best_each = self._values(lam, mu)
        return float(best.sum()), value, best_each


def _plus_zero(price) -> bool:
    """True when ``price`` is the scalar +0.0 (not -0.0, not an array)."""
    return isinstance(price, float) and price == 0.0 and math.copysign(1.0, price) > 0


def _entries(problem: Problem, table: OptionTable) -> _Entries:
    """The choices of every job as :class:`_Entries`."""
    slots = problem.interference_avoidance
    if problem.typed:
        largest = np.zeros(problem.num_types, dtype=np.int64)
        np.maximum.at(largest, problem.node_type, problem.capacity)
        placeable = (table.hi > 1) | (table.reps <= largest[table.type])
    else:
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
    kind = None
    if problem.typed:
        kind = np.concatenate([table.type, table.keep_type, np.zeros(jobs.size, dtype=np.int64)])[order]
    return _Entries(worth[order], gain[order], reps[order], span[order], order, starts, counts, kind)


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() >= deadline


def _lowest_price(
    use: Callable[[float], float],
    limit: float,
    gain: np.ndarray,
    per: np.ndarray,
    deadline: float | None,
    steps: int = _PRICE_STEPS,
) -> float:
    """Smallest price in [0, max gain / use] at which ``use(price) <= limit`` (bisection of ``steps`` steps).

    Stops early at ``deadline`` with the upper end of the bracket (any price
    gives a valid bound; this one satisfies the total).
    """
    if use(0.0) <= limit:
        return 0.0
    ratio = gain / np.maximum(per, 1.0)
    lo, hi = 0.0, float(np.max(ratio[np.isfinite(ratio)], initial=0.0))
    for _ in range(steps):
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
    e = _entries(problem, table)
    if problem.typed:
        return _relax_typed(problem, table, e, deadline)
    cap_total, nodes_total = float(problem.capacity.sum()), float(problem.num_nodes)

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


#: Column-generation rounds of the typed dual LP (each adds every job's most profitable choice).
_LP_ROUNDS = 50
#: HiGHS's ``simplex_strategy`` value for the primal simplex.
_PRIMAL_SIMPLEX = 4
#: A choice enters the LP when its reduced profit exceeds this (relative to the bound's scale).
_LP_TOLERANCE = 1e-9


def _relax_typed(problem: Problem, table: OptionTable, e: _Entries, deadline: float | None) -> Relaxation:
    """:func:`relax` with one CPU price and one slot price per node type, from the aggregated LP.

    The prices minimise ``L(lambda, mu)``: they are the duals of the capacity
    rows of the aggregated relaxation's LP (each job a convex combination of
    its choices; per type, replicas <= CAP_t and multi-node spans <= NODES_t),
    solved by HiGHS by column generation: each job starts with its best
    choice per type at one CPU price for all types, and every round adds
    each job's choice of largest reduced profit until none has any.  The bound and
    reduced costs are then computed from the prices as in the untyped case,
    so they are valid whatever precision the LP reached (prices 0 if it fails).
    """
    types = problem.num_types
    cap = np.bincount(problem.node_type, weights=problem.capacity, minlength=types).astype(np.float64)
    count = np.bincount(problem.node_type, minlength=types).astype(np.float64)
    lam, mu = np.zeros(types), np.zeros(types)
    if e.worth.size:
        lam, mu = _dual_prices(problem, e, cap, count, deadline)
    best_sum, value, best_each = e.evaluate(lam, mu)
    bound = float(lam @ cap + mu @ count) + best_sum
    rc = np.empty(e.order.size)
    rc[e.order] = best_each - value
    return Relaxation(bound=float(bound), cpu_price=lam, slot_price=mu, reduced_cost=rc[: table.job.size])


def _first_best_per_run(key: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Position of the first largest finite ``value`` within each run of equal ``key`` (in entry order).

    Runs without a finite value give none.
    """
    if key.size == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    best = np.maximum.reduceat(value, starts)
    hit = np.flatnonzero((value == np.repeat(best, np.diff(np.append(starts, key.size)))) & np.isfinite(value))
    run = np.searchsorted(starts, hit, side="right")
    return hit[np.r_[True, run[1:] != run[:-1]]] if hit.size else hit


def _dual_prices(problem: Problem, e: _Entries, cap: np.ndarray, count: np.ndarray, deadline) -> tuple:
    """(lambda float64[T], mu float64[T]): duals of the aggregated LP (see :func:`_relax_typed`).

    One HiGHS LP (minimise minus the profit), re-solved from its last basis
    after each round's columns are added.
    """
    import highspy

    from .highs_model import new_highs

    types, jobs_n = problem.num_types, e.starts.size
    job = np.repeat(np.arange(jobs_n), e.counts)
    finite = np.flatnonzero(np.isfinite(e.worth))
    profit = e.worth - np.repeat(np.maximum.reduceat(e.worth, e.starts), e.counts)  # <= 0, 0 at each job's best
    scale = max(1.0, float(np.abs(profit[finite]).max(initial=0.0)))
    idle = e.starts + e.counts - 1  # "hold nothing", each job's last entry (always feasible)
    # Start from each job's best choice per type at one CPU price for all types (the
    # untyped relaxation's, roughly), so that the first LP is near its optimum.  Each
    # job's entries come type by type (the option table's order), so a run of equal
    # (job, type) is one type's choices, or a keep.
    flat = _lowest_price(
        lambda lam: e.used(lam, 0.0, e.reps), float(cap.sum()), e.gain, e.reps, deadline, _START_PRICE_STEPS
    )
    start = np.where(np.isfinite(e.worth), profit - flat * e.reps, -np.inf)
    columns = np.union1d(_first_best_per_run(job * types + e.kind, start), idle)
    in_lp = np.zeros(e.worth.size, dtype=bool)
    h = new_highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("simplex_strategy", _PRIMAL_SIMPLEX)  # added columns keep the basis primal feasible
    h.setOptionValue("presolve", "off")  # each LP is re-solved from the last basis; presolve would discard it
    inf = highspy.kHighsInf
    upper = np.concatenate([np.ones(jobs_n), cap, count if problem.interference_avoidance else np.full(types, inf)])
    lower = np.concatenate([np.ones(jobs_n), np.full(2 * types, -inf)])
    h.addRows(upper.size, lower, upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
    lam, mu = np.zeros(types), np.zeros(types)
    for _ in range(_LP_ROUNDS):
        in_lp[columns] = True
        _add_columns(h, e, job, profit, columns, jobs_n, types)
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return np.zeros(types), np.zeros(types)
        dual = -np.asarray(h.getSolution().row_dual)
        lam, mu = np.maximum(dual[jobs_n : jobs_n + types], 0.0), np.maximum(dual[jobs_n + types :], 0.0)
        gain = np.where(np.isfinite(e.worth), profit - lam[e.kind] * e.reps - mu[e.kind] * e.span, -np.inf)
        best = np.maximum.reduceat(gain, e.starts)
        top = np.flatnonzero(gain == np.repeat(best, e.counts))
        top = top[np.r_[True, job[top][1:] != job[top][:-1]]]  # each job's first best choice
        enter = top[gain[top] > dual[job[top]] + _LP_TOLERANCE * scale]
        columns = enter[~in_lp[enter]]
        if columns.size == 0 or _past(deadline):
            break
    return lam, mu


def _add_columns(h, e: _Entries, job: np.ndarray, profit: np.ndarray, columns: np.ndarray, jobs_n: int, types: int) -> None:
    """Add the choices ``columns`` to the LP: cost -profit, rows (job, type capacity, type slots)."""
    n = columns.size
    kind = e.kind[columns]
    index = np.stack([job[columns], jobs_n + kind, jobs_n + types + kind], axis=1).astype(np.int32)
    value = np.stack([np.ones(n), e.reps[columns], e.span[columns]], axis=1)
    keep = value != 0
    starts = np.concatenate([[0], np.cumsum(keep.sum(axis=1))[:-1]]).astype(np.int32)
    h.addCols(n, -profit[columns], np.zeros(n), np.full(n, np.inf), int(keep.sum()), starts, index[keep], value[keep])
