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

import math
from dataclasses import dataclass

import numpy as np

from ..checks import check_problem, check_time_limit
from ..errors import InvalidProblem
from ..objective import EPS, UtilityScale
from ..problem import Problem

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

#: :func:`prune_dominated` uses a dense (job, nodes, replicas) table up to this
#: many cells (128 MiB of float64), else binary searches over the configurations.
DENSE_PRUNE_CELLS = 2**24

#: Queries (configuration, node count) per chunk of the sparse pruning (memory bound).
SPARSE_PRUNE_QUERIES = 2**21

#: Largest replica count for which the dense pruning's running maximum is one pass per count.
_SHORT_ACCUMULATE = 64


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

    With node types, only configurations of the same job and type dominate
    each other.  With ``usable`` (bool[C]) only usable configurations dominate others.
    Vectorised over all configurations at once: with a running maximum of
    each job's dense speedup table along the replica axis while that table
    has at most ``DENSE_PRUNE_CELLS`` cells, else by binary search over the
    configurations sorted by (job, nodes, replicas) (:func:`_sparse_rivals`),
    whose memory does not grow with the replica counts' magnitude.
    """
    if problem.num_configs == 0:
        return np.ones(0, dtype=bool)
    src = np.ones(problem.num_configs, dtype=bool) if usable is None else np.asarray(usable, dtype=bool)
    a, r = problem.table_shape
    group, num_groups = _groups(problem)
    if num_groups * (a + 1) * (r + 1) <= DENSE_PRUNE_CELLS:
        rival = _dense_rivals(problem, src, group, num_groups)
    else:
        rival = _sparse_rivals(problem, src, group)
    return ~(rival >= problem.cfg_speedup)


def _groups(problem: Problem) -> tuple[np.ndarray, int]:
    """(int64[C] group of each configuration, number of groups): its job, or (job, type) as ``job T + type``."""
    if not problem.typed:
        return problem.cfg_job, problem.num_jobs
    return problem.cfg_job * problem.num_types + problem.cfg_type, problem.num_jobs * problem.num_types


def _dense_rivals(problem: Problem, src: np.ndarray, group: np.ndarray, num_groups: int) -> np.ndarray:
    """float64[C]: a dominating speedup of each configuration at least its own (-inf if none), by the dense table.

    One pass per dominating node count N', over the configurations with at
    least N' nodes that no earlier pass has dominated (in their given order,
    so that the table lookups of one job stay close together).
    """
    a, r = problem.table_shape
    table = np.full((num_groups, a + 1, r + 1), -np.inf)
    table[group[src], problem.cfg_nodes[src], problem.cfg_replicas[src]] = problem.cfg_speedup[src]
    # Running maximum along the replicas: [j, N', K'] = max speedup with <= K' replicas.
    if r <= _SHORT_ACCUMULATE:  # a pass per replica count beats the strided accumulate on short rows
        for k in range(1, r + 1):
            np.maximum(table[:, :, k], table[:, :, k - 1], out=table[:, :, k])
    else:
        table = np.maximum.accumulate(table, axis=2)
    best_upto = table.reshape(-1)
    rival = np.full(problem.num_configs, -np.inf)
    live = np.arange(problem.num_configs)  # not dominated yet (all have >= N' nodes at pass N')
    nodes, reps, speed = problem.cfg_nodes, problem.cfg_replicas, problem.cfg_speedup
    row = group * ((a + 1) * (r + 1))
    for other in range(1, a + 1):  # N'
        if live.size == 0:
            break
        # Same N: strictly fewer replicas (K - 1 = min(K, R) - 1); fewer N: up to ceil(K N' / N).
        at = np.minimum((reps * other + nodes - 1) // nodes, r)
        at -= nodes == other
        at += row
        at += other * (r + 1)
        best = best_upto[at]
        beaten = best >= speed
        rival[live[beaten]] = best[beaten]
        alive = nodes > other  # fewer nodes than the next N' cannot be dominated by it
        alive &= ~beaten
        live, nodes, reps, speed, row = live[alive], nodes[alive], reps[alive], speed[alive], row[alive]
    return rival


def _running_max(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Inclusive running maximum of float64[n] within runs of equal ``group`` (doubling scan)."""
    out = values.copy()
    shift = 1
    while shift < out.size:
        earlier = np.where(group[shift:] == group[:-shift], out[:-shift], -np.inf)
        out[shift:] = np.maximum(out[shift:], earlier)
        shift *= 2
    return out


def _sparse_rivals(problem: Problem, src: np.ndarray, group: np.ndarray) -> np.ndarray:
    """:func:`_dense_rivals` without the dense table: O(C log C) per node count, in chunks.

    Dominators are sorted by (job, nodes, replicas) with a running maximum of
    speedup per (job, nodes) group; a query (job, N', K' <= reach) is one
    binary search on (group rank, replica rank), both compressed so that the
    int64 keys cannot overflow.
    """
    a = problem.table_shape[0]
    job, nodes, reps, spd = group, problem.cfg_nodes, problem.cfg_replicas, problem.cfg_speedup
    dom = np.flatnonzero(src)
    rival = np.full(problem.num_configs, -np.inf)
    if dom.size == 0:
        return rival
    dom = dom[np.lexsort((reps[dom], nodes[dom], job[dom]))]
    group_key = job[dom] * (a + 1) + nodes[dom]
    groups, gid = np.unique(group_key, return_inverse=True)
    values = np.unique(reps[dom])
    best = _running_max(spd[dom], gid)
    sorted_key = gid * values.size + np.searchsorted(values, reps[dom])
    other = np.unique(nodes[dom])  # the N' that can dominate
    step = max(1, SPARSE_PRUNE_QUERIES // max(other.size, 1))
    for lo in range(0, problem.num_configs, step):
        c = np.arange(lo, min(lo + step, problem.num_configs))
        n_c, k_c = nodes[c][:, None], reps[c][:, None]
        reach = np.where(other == n_c, k_c - 1, -(-k_c * other // n_c))
        g = np.minimum(np.searchsorted(groups, job[c][:, None] * (a + 1) + other), groups.size - 1)
        v = np.searchsorted(values, reach, side="right") - 1
        ok = (other <= n_c) & (groups[g] == job[c][:, None] * (a + 1) + other) & (v >= 0)
        at = np.searchsorted(sorted_key, g * values.size + v, side="right") - 1
        ok &= (at >= 0) & (gid[np.maximum(at, 0)] == g)
        rival[c] = np.where(ok, best[np.maximum(at, 0)], -np.inf).max(axis=1, initial=-np.inf)
    return rival


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
    options and keeps.  ``u`` and ``w`` are on the problem's
    :class:`~solvers.objective.UtilityScale` (``scale``; plain ``u`` and
    weights on ordinary instances), ``weight_sum`` the sum of those weights.
    """

    job: np.ndarray  # int64[O] job of each option
    type: np.ndarray  # int64[O] node type of each option (all 0 without types)
    reps: np.ndarray  # int64[O] replicas K
    lo: np.ndarray  # int64[O] fewest nodes
    hi: np.ndarray  # int64[O] most nodes
    speedup: np.ndarray  # float64[O]
    worth: np.ndarray  # float64[O]
    gain: np.ndarray  # float64[O]
    keep: np.ndarray  # int64[Kp] running jobs whose current shape is allowed
    keep_reps: np.ndarray  # int64[Kp] K0
    keep_nodes: np.ndarray  # int64[Kp] N0
    keep_type: np.ndarray  # int64[Kp] node type of the current placement
    keep_worth: np.ndarray  # float64[Kp]
    keep_gain: np.ndarray  # float64[Kp]
    idle_worth: np.ndarray  # float64[J]
    base: float
    scale: UtilityScale
    weight_sum: float


def _lexsort_order(job, multi, reps, spd, nodes) -> np.ndarray:
    """``np.lexsort((nodes, spd, reps, multi, job))``, by one stable argsort of a combined int64 key.

    The speedups enter by rank; when the key could overflow int64, lexsort
    itself (the same order; five sorts instead of two, seconds at millions).
    """
    if job.size == 0:
        return np.zeros(0, dtype=np.int64)
    speeds, spd_rank = np.unique(spd, return_inverse=True)
    radices = (2, int(reps.max()) + 1, int(speeds.size), int(nodes.max()) + 1)
    if (int(job.max()) + 1) * math.prod(radices) >= 2**62:
        return np.lexsort((nodes, spd, reps, multi, job))
    key = job.astype(np.int64)
    for digit, radix in zip((multi, reps, spd_rank.reshape(-1), nodes), radices):
        key = key * radix + digit
    return np.argsort(key, kind="stable")


def _node_ranges(problem: Problem) -> tuple[np.ndarray, ...]:
    """(job, reps, lo, hi, speedup, type)[O] of the options: runs of undominated configurations.

    A run holds one job's configurations of one type, equal K and speedup
    whose node counts (all > 1) are consecutive; its first entry gives lo,
    its last hi.  Configurations that do not fit the cluster's capacities (of
    their type) are left out (no feasible placement uses one, and none
    dominates a configuration that fits).
    """
    fits = problem.fits_cluster(problem.cfg_replicas, problem.cfg_nodes, problem.cfg_type if problem.typed else None)
    c = np.flatnonzero(prune_dominated(problem) & fits)
    job, reps = _groups(problem)[0][c], problem.cfg_replicas[c]
    nodes, spd = problem.cfg_nodes[c], problem.cfg_speedup[c]
    multi = nodes > 1
    order = _lexsort_order(job, multi, reps, spd, nodes)
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
    types = problem.num_types
    return job[first] // types, reps[first], nodes[first], nodes[last], spd[first], job[first] % types


def _keeps(problem: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(running jobs whose current shape is allowed, its speedup, its node type)."""
    cur = problem.current
    n0, k0 = (cur > 0).sum(axis=1), cur.sum(axis=1)
    running = np.flatnonzero(problem.has_current)
    if not problem.typed:
        s0 = problem.lookup_speedup(running, n0[running], k0[running])
        t0 = np.zeros(running.size, dtype=np.int64)
    else:
        kind, mixed = problem.placement_types(cur[running])
        s0 = problem.lookup_speedup(running, n0[running], k0[running], kind)
        s0[mixed] = np.nan
        t0 = kind
    ok = ~np.isnan(s0)
    return running[ok], s0[ok], t0[ok]


def option_table(problem: Problem) -> OptionTable:
    """The options and keep choices of ``problem`` (see :class:`OptionTable`)."""
    job, reps, lo, hi, spd, kind = _node_ranges(problem)

    cur = problem.current
    n0, k0 = (cur > 0).sum(axis=1), cur.sum(axis=1)
    keep, keep_speedup, keep_type = _keeps(problem)

    f = np.where(problem.has_current, problem.restart_factor, 1.0)
    best_y = np.full(problem.num_jobs, -np.inf)  # each job's best y
    np.maximum.at(best_y, job, spd * f[job] + EPS)
    np.maximum.at(best_y, keep, keep_speedup + EPS)
    scale = UtilityScale.of(problem.p, best_y, problem.weight)
    w = problem.weight if scale.weight_scale == 1 else problem.weight * scale.weight_scale
    u0 = float(scale(0.0))
    u, keep_u = scale(spd * f[job]), scale(keep_speedup)
    w_job, w_keep = w[job], w[keep]
    return OptionTable(
        job=job,
        type=kind,
        reps=reps,
        lo=lo,
        hi=hi,
        speedup=spd,
        worth=w_job * u,
        gain=w_job * (u - u0),
        keep=keep,
        keep_reps=k0[keep],
        keep_nodes=n0[keep],
        keep_type=keep_type,
        keep_worth=w_keep * keep_u,
        keep_gain=w_keep * (keep_u - u0),
        idle_worth=w * u0,
        base=float(w.sum() * u0),
        scale=scale,
        weight_sum=float(w.sum()),
    )
