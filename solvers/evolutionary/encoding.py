"""The allocation problem as padded arrays for the genetic search, and the fitness of placements.

Individuals are placement matrices (replicas of job j on node n), stored
node-major as ``X`` int32[N, J]: jobs along the minor axis, so each job is a
*gene* of :mod:`solvers.evolutionary.search`.  Most operators work per job
(a job's node count and replica count are reductions over nodes, its random
numbers and table lookups are per job and broadcast over nodes), which XLA's
CPU backend vectorizes along the minor axis.

:func:`pad_problem` turns a :class:`solvers.Problem` into a
:class:`PaddedProblem`: jobs, nodes and table sizes are padded up to buckets,
so that instances of similar size share one compiled program.  :func:`score`
is the fitness: the log of the pinned power mean ``M_p`` (monotone in
``M_p``; by log-sum-exp, so float32 stays finite for very negative ``p``),
-inf for an infeasible placement.  The solver recomputes the objective it
returns in float64 with :func:`solvers.evaluate`; the float32 fitness only
ranks individuals.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..problem import EPS, Problem
from .search import import_jax

__all__ = ["NOT_ALLOWED", "PaddedProblem", "lookup", "log_mean", "pad_problem", "round_up", "score"]

#: Jobs, nodes and table dimensions are padded up to multiples of these, so
#: instances of similar size share one compiled program.
JOB_BUCKET = 8
NODE_BUCKET = 4
TABLE_BUCKET = 8
#: Channels of ``PaddedProblem.table``: the speedup (NOT_ALLOWED where the pair is
#: not allowed), and the prefix maximum over replicas of allowed speedups with
#: the replica count attaining it (fewest on ties).
SPEEDUP, BEST_VALUE, BEST_REPLICAS = 0, 1, 2
NOT_ALLOWED = -1.0


class PaddedProblem(NamedTuple):
    """The problem as (padded) arrays; padded jobs have weight 0 and only (0, 0).

    Shapes: J jobs, N nodes, A1 = largest node count + 1, R1 = largest replica
    count + 1 (all padded up to their bucket).
    """

    capacity: Any  # int32[N], 0 on padded nodes
    current: Any  # int32[N, J]: the current placement, node-major
    has_current: Any  # bool[J]: moving the job is a restart
    restart_factor: Any  # float32[J]
    weight: Any  # float32[J], 0 on padded jobs
    table: Any  # float32[J, A1, R1, 3]: the channels SPEEDUP, BEST_VALUE, BEST_REPLICAS
    start_nodes: Any  # int32[J]: nodes of the pair an idle job starts with (see grow), 0 if none
    start_replicas: Any  # int32[J]: replicas of that pair
    p: Any  # float32[]: fairness exponent
    num_jobs: Any  # int32[]: unpadded J, scales the mutation rates
    interference: Any  # bool[]: interference avoidance on


def _start_pairs(allowed: np.ndarray) -> np.ndarray:
    """int32[2, J]: (nodes, replicas) an idle job starts with, from bool[J, A1, R1].

    The one-node pair with the fewest replicas if there is one, else the pair
    with the fewest replicas (then nodes); (0, 0) for a job with no pair (it
    never grows).
    """
    n_jobs, a1, r1 = allowed.shape
    out = np.zeros((2, n_jobs), np.int32)
    one_node = allowed[:, 1, 1:].any(axis=1) if a1 > 1 else np.zeros(n_jobs, bool)
    out[0, one_node] = 1
    out[1, one_node] = allowed[one_node, 1, 1:].argmax(axis=1) + 1
    for j in np.flatnonzero(~one_node):
        a, r = np.nonzero(allowed[j, 1:, 1:])
        if a.size:
            k = np.lexsort((a, r))[0]
            out[:, j] = (a[k] + 1, r[k] + 1)
    return out


def round_up(n: int, bucket: int) -> int:
    """``n`` rounded up to a multiple of ``bucket`` (at least one bucket)."""
    return max(bucket, -(-n // bucket) * bucket)


def pad_problem(problem: Problem, incumbent: np.ndarray | None = None) -> tuple[PaddedProblem, np.ndarray]:
    """``problem`` as padded numpy arrays (:class:`PaddedProblem`), plus seeds int32[2, N, J].

    The seeds (node-major, like every placement here) are the current
    placement and the incumbent (the current placement again when none is
    given, so the shapes never depend on it); entries of the incumbent above a
    node's capacity are clipped to it, which
    :func:`~solvers.evolutionary.repair.repair` would do first.
    """
    j_real, n_real = problem.num_jobs, problem.num_nodes
    a_real, r_real = problem.table_shape
    jp, np_ = round_up(j_real, JOB_BUCKET), round_up(n_real, NODE_BUCKET)
    a1, r1 = round_up(a_real + 1, TABLE_BUCKET), round_up(r_real + 1, TABLE_BUCKET)

    capacity = np.zeros(np_, np.int32)
    capacity[:n_real] = problem.capacity
    current = np.zeros((np_, jp), np.int32)
    current[:n_real, :j_real] = problem.current.T
    has_current = np.zeros(jp, bool)
    has_current[:j_real] = problem.has_current
    restart = np.ones(jp, np.float32)
    restart[:j_real] = problem.restart_factor
    weight = np.zeros(jp, np.float32)
    weight[:j_real] = problem.weight

    allowed = np.zeros((jp, a1, r1), bool)
    allowed[:, 0, 0] = True
    allowed[problem.cfg_job, problem.cfg_nodes, problem.cfg_replicas] = True
    speedup = np.zeros((jp, a1, r1))
    speedup[problem.cfg_job, problem.cfg_nodes, problem.cfg_replicas] = problem.cfg_speedup
    # Prefix max over replicas of the allowed speedups, and where it is attained.
    masked = np.where(allowed, speedup, -np.inf)
    best_value = np.maximum.accumulate(masked, axis=2)
    # best_replicas: the smallest r' attaining the running maximum (fewest replicas on ties).
    previous = np.concatenate([np.full((jp, a1, 1), -np.inf), best_value[:, :, :-1]], axis=2)
    starts = allowed & (masked > previous)
    cols = np.broadcast_to(np.arange(r1), masked.shape)
    best_replicas = np.maximum.accumulate(np.where(starts, cols, 0), axis=2)
    start = _start_pairs(allowed)
    # One table, so that each lookup is one gather.
    table = np.stack([np.where(allowed, speedup, NOT_ALLOWED), best_value, best_replicas], axis=-1)

    params = PaddedProblem(
        capacity=capacity,
        current=current,
        has_current=has_current,
        restart_factor=restart,
        weight=weight,
        table=table.astype(np.float32),
        start_nodes=start[0],
        start_replicas=start[1],
        p=np.float32(problem.p),
        num_jobs=np.int32(j_real),
        interference=np.bool_(problem.interference_avoidance),
    )
    seeds = np.repeat(current[None], 2, axis=0)
    if incumbent is not None:
        seeds[1, :n_real, :j_real] = np.minimum(incumbent.T, problem.capacity[:, None])
    return params, seeds


def lookup(params: PaddedProblem, nodes: Any, replicas: Any) -> Any:
    """float32[J, 3]: each job's table channels at (nodes, replicas), clipped into the table."""
    import jax.numpy as jnp

    n_jobs, a1, r1 = params.table.shape[:3]
    return params.table[
        jnp.arange(n_jobs), jnp.clip(nodes, 0, a1 - 1), jnp.clip(replicas, 0, r1 - 1)
    ]


def log_mean(speedup: Any, x: Any, params: PaddedProblem) -> Any:
    """log M_p (float32) of one placement int[N, J] whose jobs' speedups float32[J] are given.

    Applies each moved running job's restart factor; by log-sum-exp, so
    float32 stays finite for very negative ``p``.
    """
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    moved = params.has_current & jnp.any(x != params.current, axis=0)
    value = jnp.maximum(speedup, 0.0) * jnp.where(moved, params.restart_factor, 1.0)
    log_y = jnp.log(value + EPS)
    w = params.weight
    w_sum = jnp.sum(w)
    tiny = jnp.finfo(jnp.float32).tiny
    p = params.p
    safe_p = jnp.where(p == 0, 1.0, p)
    # M_p = (sum w y^p / W)^(1/p): log M_p = (logsumexp(p log y, b=w) - log W) / p.
    power = (logsumexp(safe_p * log_y, b=w) - jnp.log(jnp.maximum(w_sum, tiny))) / safe_p
    # For |p| < 1 the same without cancellation: m + log1p(sum (w/W) expm1(p log y - m)), m = max p log y.
    a = safe_p * log_y
    m = jnp.max(jnp.where(w > 0, a, -jnp.inf))
    share = w / jnp.maximum(w_sum, tiny)
    small = (m + jnp.log1p(jnp.sum(share * jnp.expm1(jnp.where(w > 0, a - m, 0.0))))) / safe_p
    power = jnp.where(jnp.abs(p) < 1, small, power)
    geometric = jnp.sum(w * log_y) / jnp.maximum(w_sum, tiny)
    return jnp.where(w_sum > 0, jnp.where(p == 0, geometric, power), 0.0)


def _fitness(x: Any, params: PaddedProblem) -> Any:
    """log M_p of one placement int[N, J] (float32), -inf if it is infeasible."""
    import jax.numpy as jnp

    a1, r1 = params.table.shape[1:3]
    x = x.astype(jnp.int32)
    nodes = jnp.sum(x > 0, axis=0)
    reps = jnp.sum(x, axis=0)
    speedup = lookup(params, nodes, reps)[:, SPEEDUP]
    valid = (nodes < a1) & (reps < r1) & (speedup >= 0)
    # Seeds are scored unrepaired, so check every rule (children are scored
    # from their repair, in step).
    multi = (x > 0) & (nodes > 1)[None, :]
    feasible = jnp.all(jnp.sum(x, axis=1) <= params.capacity) & jnp.all(x >= 0)
    feasible &= ~params.interference | jnp.all(jnp.sum(multi, axis=1) <= 1)
    value = log_mean(speedup, x, params)
    return jnp.where(jnp.all(valid) & feasible, value, -jnp.inf)


def score(population: Any, params: PaddedProblem) -> Any:
    """Fitness float32[P] of a population int[P, N, J]: log power mean, -inf if infeasible."""
    jax = import_jax()
    return jax.vmap(_fitness, in_axes=(0, None))(population, params)
