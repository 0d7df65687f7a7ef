"""Stage 1 of the MILP: the solver's own options, and what each job may do.

Two kinds of "option" meet here.  The *solver options* (``mip_gap``,
``formulation``, ...) are checked by :func:`check_options` against the
constants below.  A job's *options* are the runs of its allowed
configurations that the model chooses between: :func:`prune_dominated`
drops the configurations no optimum needs, and :func:`option_table` merges the
rest into options and prices each one on the objective's utility scale
(:class:`OptionTable`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checks import check_problem, check_time_limit
from ..errors import InvalidProblem
from ..problem import Problem, utility

__all__ = [
    "DEFAULT_MIP_GAP",
    "FORMULATIONS",
    "OptionTable",
    "check_options",
    "option_table",
    "prune_dominated",
]

#: Default relative MIP gap, as pinned by the allocation options.
DEFAULT_MIP_GAP = 1e-4

#: Names accepted by ``solve_milp(formulation=...)``.
FORMULATIONS = ("auto", "exact", "large")

#: Relative tolerance when comparing utility sums (float noise of HiGHS and numpy).
UTILITY_RTOL = 1e-9


def check_options(problem, time_limit, mip_gap, formulation) -> None:
    """Raise :class:`InvalidProblem`, naming the option and its value, for bad input."""
    check_problem(problem)
    check_time_limit(time_limit)
    if isinstance(mip_gap, bool) or not isinstance(mip_gap, (int, float)) or not 0 <= mip_gap < 1:
        raise InvalidProblem(f"mip_gap must be in [0, 1), got {mip_gap!r}")
    if not isinstance(formulation, str) or formulation not in FORMULATIONS:
        raise InvalidProblem(f"formulation must be one of {list(FORMULATIONS)}, got {formulation!r}")


def prune_dominated(problem: Problem, usable: np.ndarray | None = None) -> np.ndarray:
    """bool[C]: configurations that no optimal solution needs (False: prune it).

    Configuration (N, K) of a job is dominated by another of its configurations
    (N', K') with speedup ``s' >= s`` when every placement realising (N, K)
    contains a placement realising (N', K'): keep the N' nodes holding most
    replicas (together at least ``ceil(K N' / N)``) and drop replicas down to
    K'.  That holds when ``N' <= N`` and ``N' <= K' <= ceil(K N' / N)``; the
    sub-placement uses no more capacity, no more nodes, and is multi-node only
    if the original was.  Ties keep the smaller shape.  Dropping dominated
    configurations keeps the optimum exact.

    Vectorised over all configurations at once with a running maximum of each
    job's speedup table along the replica axis; with ``usable`` (bool[C]) only
    usable configurations dominate others.
    """
    if problem.num_configs == 0:
        return np.ones(0, dtype=bool)
    a, r = problem.table_shape
    table = np.full((problem.num_jobs, a + 1, r + 1), -np.inf)
    src = np.ones(problem.num_configs, dtype=bool) if usable is None else np.asarray(usable, dtype=bool)
    table[problem.cfg_job[src], problem.cfg_nodes[src], problem.cfg_replicas[src]] = problem.cfg_speedup[src]
    best_upto = np.maximum.accumulate(table, axis=2)  # [j, N', K']: max speedup with <= K' replicas
    job, nodes, reps = problem.cfg_job, problem.cfg_nodes, problem.cfg_replicas
    other = np.arange(1, a + 1)[None, :]  # N'
    reach = -(-reps[:, None] * other // nodes[:, None])  # ceil(K N' / N)
    # Same N: strictly fewer replicas; fewer N: up to ceil(K N' / N).
    reach = np.where(other == nodes[:, None], reps[:, None] - 1, np.minimum(reach, r))
    rival = best_upto[job[:, None], other, reach]
    rival[other > nodes[:, None]] = -np.inf
    return ~(rival.max(axis=1) >= problem.cfg_speedup)


@dataclass(frozen=True)
class OptionTable:
    """Everything a job may do, with its objective coefficient (pure numpy, shapes in brackets).

    An *option* merges the configurations of one job that have the same
    replica count K, the same speedup and consecutive node counts lo..hi (all
    > 1): every such count is allowed and worth the same, so the solver picks
    the node count within [lo, hi] and the optimum is unchanged (the anchors'
    speedups depend on the node count only through "one node or several", so
    this merges up to 16 configurations into one).  Dominated configurations
    (:func:`prune_dominated`) are left out first.

    ``worth = w_j u(s f_j)`` with f_j the restart factor of a running job (1
    for one that holds nothing), ``keep_worth = w_j u(s0_j)``, ``idle_worth =
    w_j u(0)``; ``gain = worth - idle_worth`` and ``base = sum_j idle_worth``,
    so the utility sum of a choice is ``base`` plus the gains of the chosen
    options and keeps.
    """

    job: np.ndarray  # int64[O] job of each option
    reps: np.ndarray  # int64[O] replicas K
    lo: np.ndarray  # int64[O] fewest nodes
    hi: np.ndarray  # int64[O] most nodes
    speedup: np.ndarray  # float64[O]
    worth: np.ndarray  # float64[O]
    gain: np.ndarray  # float64[O]
    keep: np.ndarray  # int64[Kp] running jobs whose current shape is allowed
    keep_reps: np.ndarray  # int64[Kp] K0
    keep_nodes: np.ndarray  # int64[Kp] N0
    keep_worth: np.ndarray  # float64[Kp]
    keep_gain: np.ndarray  # float64[Kp]
    idle_worth: np.ndarray  # float64[J]
    base: float


def _node_ranges(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(job, reps, lo, hi, speedup)[O] of the options: runs of undominated configurations.

    A run holds one job's configurations of equal K and speedup whose node
    counts (all > 1) are consecutive; its first entry gives lo, its last hi.
    """
    c = np.flatnonzero(prune_dominated(problem))
    job, reps = problem.cfg_job[c], problem.cfg_replicas[c]
    nodes, spd = problem.cfg_nodes[c], problem.cfg_speedup[c]
    multi = nodes > 1
    order = np.lexsort((nodes, spd, reps, multi, job))
    job, reps, nodes, spd, multi = job[order], reps[order], nodes[order], spd[order], multi[order]
    new_run = np.ones(c.size, dtype=bool)
    new_run[1:] = (
        (job[1:] != job[:-1])
        | (reps[1:] != reps[:-1])
        | (spd[1:] != spd[:-1])
        | ~multi[1:]
        | (nodes[1:] != nodes[:-1] + 1)
    )
    first = np.flatnonzero(new_run)
    last = np.append(first[1:], c.size)[: first.size].astype(np.int64) - 1
    return job[first], reps[first], nodes[first], nodes[last], spd[first]


def option_table(problem: Problem) -> OptionTable:
    """The options and keep choices of ``problem`` (see :class:`OptionTable`)."""
    job, reps, lo, hi, spd = _node_ranges(problem)

    cur = problem.current
    n0, k0 = (cur > 0).sum(axis=1), cur.sum(axis=1)
    a, r = problem.table_shape
    running = np.flatnonzero(problem.has_current & (n0 <= a) & (k0 <= r))
    s0 = problem.speedup_table[running, n0[running], k0[running]]
    keep, keep_speedup = running[~np.isnan(s0)], s0[~np.isnan(s0)]

    p, w = problem.p, problem.weight
    u0 = float(utility(0.0, p))
    f = np.where(problem.has_current, problem.restart_factor, 1.0)
    worth = w[job] * utility(spd * f[job], p)
    keep_worth = w[keep] * utility(keep_speedup, p)
    return OptionTable(
        job=job,
        reps=reps,
        lo=lo,
        hi=hi,
        speedup=spd,
        worth=worth,
        gain=w[job] * (utility(spd * f[job], p) - u0),
        keep=keep,
        keep_reps=k0[keep],
        keep_nodes=n0[keep],
        keep_worth=keep_worth,
        keep_gain=w[keep] * (utility(keep_speedup, p) - u0),
        idle_worth=w * u0,
        base=float(w.sum() * u0),
    )
