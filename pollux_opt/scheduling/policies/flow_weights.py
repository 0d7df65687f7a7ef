"""The weights under which a linear objective over concave speedups minimises mean flow time.

**The problem** (heSRPT, Berg, Vesilo and Harchol-Balter, SPAA 2019 and 2020;
SmartFill for general concave speedups): jobs ``1..n``, all present, share
``P`` slots; job ``j`` runs at speed ``c_j(k)`` on ``k`` slots (concave,
``c_j(0) = 0``) and completes in order ``1, 2, ..., n`` (``n`` last).  Between
the ``(i-1)``-th and the ``i``-th completion (a phase of ``tau_i`` seconds) the
jobs ``i..n`` hold ``k_{j,i}`` slots.  The total weighted flow time is

    sum_i tau_i (pi_i + ... + pi_n)      subject to  sum_{i <= j} c_j(k_{j,i}) tau_i = W_j

(``pi_j``: the job's priority weight, ``W_j`` its work).  With a multiplier
``mu_j`` per work constraint, the phase allocation that minimises the
Lagrangian maximises ``sum_{j >= i} mu_j c_j(k_j)`` in every phase, with the
same ``mu`` throughout: a linear objective over speedups with fixed weights.
Stationarity in ``tau_i`` pins the weights:

    V(S_i) = pi_i + ... + pi_n,      V(S) = max sum_{j in S} mu_j c_j(k_j),  sum k_j <= P

for each suffix ``S_i = {i..n}``: completing job ``i`` lowers the best weighted
speed of the jobs left by exactly its priority.  The weights depend on the
completion order and the speedup curves only, not on the works (as heSRPT's
shares depend on the ranks only).  For ``c(k) = k^p`` the recursion gives
heSRPT's weights, ``mu_i`` proportional to ``theta_i^(1 - p)`` with
``theta_i = (r_i / n)^c - ((r_i - 1) / n)^c`` (``r_i = n + 1 - i``, ``c = 1 / (1 - p)``):
at ``p = 1/2``, ``mu`` is proportional to ``sqrt(2 r - 1)``.

**Solving it.**  From the last job backwards: ``mu_n = pi_n / c_n(P)``; then
each job ``i`` joins the pool of the ``mu``-scaled slot increments of the jobs
after it.  With concave curves the best allocation takes the ``P`` largest
increments, so ``V`` with job ``i`` holding ``t`` slots is
``mu_i C_i(t) + T(P - t)`` (``C_i`` its cumulative speedup, ``T(s)`` the sum of
the pool's ``s`` largest), and the least ``mu_i`` that reaches the target is

    mu_i = min over t >= 1 of (target - T(P - t)) / C_i(t)

exactly, with no search.  Curves that are not concave are replaced by their
upper concave hull (:func:`hull_increments`).

Shapes: ``increments`` a list of float64[K_j] (the speedup each further slot
adds, non-increasing); ``priority`` float64[n] (> 0); ``P`` a slot count.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["flow_weights", "hull_increments"]


def hull_increments(values: np.ndarray) -> np.ndarray:
    """The positive increments of the upper concave hull of ``(k, values[k])``, k = 0..K.

    ``values[0]`` is 0 (no slots); returns float64[<= K], non-increasing."""
    hull: list[int] = [0]
    for k in range(1, len(values)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b lies on or below the chord a-k: drop it
            if (values[b] - values[a]) * (k - a) <= (values[k] - values[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(k)
    inc = np.concatenate([np.full(b - a, (values[b] - values[a]) / (b - a)) for a, b in zip(hull, hull[1:])]) \
        if len(hull) > 1 else np.zeros(0)
    return inc[inc > 0]


def flow_weights(increments: Sequence[np.ndarray], priority: Sequence[float], slots: int) -> np.ndarray:
    """``mu``, float64[n], of the module docstring for jobs in completion order, the LAST to complete first.

    Args:
        increments: per job, the non-increasing increments of its concave speedup
            (:func:`hull_increments`); a job with none gets weight 0.
        priority: per job, its priority weight ``pi`` (> 0).
        slots: ``P``, the slots the jobs share (>= 1).
    """
    mu = np.zeros(len(increments))
    pool = np.zeros(0)  # the mu-scaled increments of the jobs after this one, largest first
    target = 0.0
    for j, inc in enumerate(increments):
        target += float(priority[j])
        inc = np.asarray(inc, dtype=np.float64)[:slots]
        if inc.size == 0:
            continue
        held = np.cumsum(inc)  # C_j(t), t = 1..T
        t = np.arange(1, held.size + 1)
        best = np.concatenate([[0.0], np.cumsum(pool)])  # T(s), s = 0..len(pool)
        rest = best[np.minimum(slots - t, pool.size)]
        mu[j] = max(float(np.min((target - rest) / held)), 0.0)
        pool = np.sort(np.concatenate([pool, mu[j] * inc]))[::-1][:slots]
    return mu
