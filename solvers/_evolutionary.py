"""Evolutionary solver: a genetic algorithm over placement matrices, in JAX.

Pollux (Qiao et al., OSDI 2021, section 4.2) allocates with a genetic algorithm
over allocation matrices (population 100, 100 generations per round, NSGA-II in
numpy).  This module keeps that search space and kind of operators but runs the
whole search as compiled XLA programs: the population is scored with ``vmap``
and the generations are a ``lax.scan``.

Individuals are placement matrices ``X`` int32[J, N] (replicas of job j on
node n).  The search is written as pure functions over an immutable
:class:`EvoState` with explicit PRNG keys, in the style of evosax and optax:

* :func:`init` (seeds) -> state: copies of the seeds, the current placement
  and an optional incumbent (such as the MILP's);
* :func:`ask` (key, state) -> children: binary tournament selection, uniform
  crossover over jobs (each job's row comes whole from one parent), then

  - :func:`mutate`: reset a job's row to its current placement (so that "do not
    move" stays reachable: moving a running job costs its restart factor) and
    zero one occupied entry of a job,
  - :func:`repair`,
  - :func:`grow`: randomly increase entries where capacity is free (idle jobs
    always try, so that jobs a repair dropped restart at once),
  - :func:`repair` again;
* :func:`score` (population) -> fitness: the log of the pinned power mean
  ``M_p`` (monotone in ``M_p``; by log-sum-exp, so float32 stays finite for
  very negative ``p``);
* :func:`tell` (state, children, fitness) -> state: (mu + lambda) elitism,
  keep the best ``P`` of parents and children;
* :func:`step` = ask + score + tell with the key ``fold_in(key, generation)``,
  and :func:`evolve` scans it.

All random numbers of a generation come from one draw (:func:`_draws`).

:func:`repair` makes any non-negative integer matrix feasible by only ever
*removing* replicas, in an order that keeps each fixed constraint fixed:

1. clip each entry to its node's capacity;
2. capacity: jobs in a random priority order keep what still fits on a node;
3. interference avoidance: on each node only the highest-priority job that
   spans several nodes stays (the others leave that node; a job can only span
   fewer nodes afterwards, so no node gains a multi-node job);
4. configurations (:func:`_project`): a row whose (nodes, replicas) pair is
   allowed stays as is; any other row becomes the best-speedup allowed pair
   among "keep only its largest entry", "drop its smallest entry", "keep all
   its nodes" (each with the best allowed replica count the kept entries can
   hold) and nothing.  Allowed pairs already respect min/max replicas and max
   nodes per job (the problem validates them), and ``(0, 0)`` is always
   allowed, so the projection always succeeds.

The returned objective is recomputed in float64 by :func:`solvers.evaluate`
on the decoded placement; the float32 fitness only ranks individuals.

Compiled programs are cached per static shape (jobs, nodes and table sizes are
padded up to buckets, so similar instances share them), population size and
number of generations: a second call with the same shapes does not recompile.

jax is an optional dependency (``pip install 'pollux-opt[evo]'``), imported
only when the solver runs.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from typing import Any, NamedTuple

import numpy as np

from ._errors import InvalidProblem
from ._problem import EPS, Problem, evaluate, violations
from ._result import Result, Status

__all__ = [
    "EvoConfig",
    "EvoParams",
    "EvoState",
    "encode",
    "init",
    "ask",
    "tell",
    "score",
    "repair",
    "mutate",
    "grow",
    "step",
    "evolve",
    "solve_evolutionary",
]

logger = logging.getLogger(__name__)

#: Population per generation: Pollux's genetic algorithm uses 100 (OSDI 2021 artifact).
DEFAULT_POPULATION_SIZE = 100
#: Generations per solve: Pollux's genetic algorithm runs 100 per scheduling round.
DEFAULT_GENERATIONS = 100
# The four rates below were tuned on seeded 16 x 4-CPU instances with 20 and 40
# jobs against the MILP optimum (mean gap at 100 x 100 fell from ~4.5 % with
# rates 1, 1, 0.5, 0.9 to ~1-1.5 %); they are not sensitive within a factor of 2.
#: Expected number of jobs per child whose row is reset to the current placement.
RESET_JOBS = 0.5
#: Expected number of jobs per child that lose one occupied node entry.
ZERO_JOBS = 0.5
#: Expected number of busy jobs per child that grow into free capacity (idle ones always try).
INCREASE_JOBS = 2.0
#: Probability that a busy job grows on a node it already occupies (else on any
#: node): growing in place keeps jobs on few nodes, where they run fastest.
OWN_NODE_PROBABILITY = 0.9
#: Probability that a child is a crossover of two parents (else a copy of one).
CROSSOVER_PROBABILITY = 0.5
#: Jobs, nodes and table dimensions are padded up to multiples of these, so
#: instances of similar size share one compiled program.
JOB_BUCKET = 8
NODE_BUCKET = 4
TABLE_BUCKET = 8
#: Best individuals of the final population re-scored exactly in float64.
FINAL_CANDIDATES = 4
#: With a time limit, the generations run in this many chunks, checking the clock between.
TIME_CHECKS = 10
#: Uniform draws per job that :func:`mutate` uses (reset, zero x2, own node, grow x3).
MUTATE_DRAWS = 7
#: Uniform draws per individual besides the per-job ones (4 tournament, crossover, shift).
PER_INDIVIDUAL_DRAWS = 6
#: Largest 16-bit value: each random 32-bit word gives two uniforms.
UINT16_MASK = 0xFFFF
#: Axes up to this long are cumulatively summed by a triangular matmul.
MATMUL_CUMSUM_MAX = 64
#: Channels of ``EvoParams.table``: the speedup (NOT_ALLOWED where the pair is
#: not allowed), and the prefix maximum over replicas of allowed speedups with
#: the replica count attaining it (fewest on ties).
SPEEDUP, BEST_VALUE, BEST_REPLICAS = 0, 1, 2
NOT_ALLOWED = -1.0
#: Integer options (the seed in particular) must fit a signed 64-bit integer.
INT_OPTION_LIMIT = 2**63
#: Compiled programs kept (one per shape, population, chunk length).
COMPILE_CACHE_SIZE = 32

_INSTALL_HINT = "the 'evolutionary' solver needs jax: pip install 'pollux-opt[evo]'"


def _jax() -> Any:
    """Import jax lazily, with the install hint when it is missing."""
    try:
        import jax
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(_INSTALL_HINT) from exc
    return jax


@dataclasses.dataclass(frozen=True)
class EvoConfig:
    """Static hyperparameters of the genetic algorithm (hashable, so jit-static).

    Rates are expected counts of jobs per child; the per-job probability is the
    count divided by the number of (unpadded) jobs, capped at 1.
    """

    population_size: int = DEFAULT_POPULATION_SIZE
    reset_jobs: float = RESET_JOBS
    zero_jobs: float = ZERO_JOBS
    increase_jobs: float = INCREASE_JOBS
    own_node_probability: float = OWN_NODE_PROBABILITY
    crossover_probability: float = CROSSOVER_PROBABILITY


class EvoParams(NamedTuple):
    """The problem as (padded) arrays; padded jobs have weight 0 and only (0, 0).

    Shapes: J jobs, N nodes, A1 = largest node count + 1, R1 = largest replica
    count + 1 (all padded up to their bucket).
    """

    capacity: Any  # int32[N], 0 on padded nodes
    current: Any  # int32[J, N]
    has_current: Any  # bool[J]: moving the job is a restart
    restart_factor: Any  # float32[J]
    weight: Any  # float32[J], 0 on padded jobs
    table: Any  # float32[J, A1, R1, 3]: the channels SPEEDUP, BEST_VALUE, BEST_REPLICAS
    start_nodes: Any  # int32[J]: nodes of the pair an idle job starts with (see grow)
    start_replicas: Any  # int32[J]: replicas of that pair
    p: Any  # float32[]: fairness exponent
    num_jobs: Any  # int32[]: unpadded J, scales the mutation rates
    interference: Any  # bool[]: interference avoidance on


class EvoState(NamedTuple):
    """Immutable state of the search: a population and where it stands."""

    population: Any  # int32[P, J, N]
    fitness: Any  # float32[P]: log power mean, -inf if infeasible
    generation: Any  # int32[]: generations done (keys are folded with it)


def _start_pairs(allowed: np.ndarray) -> np.ndarray:
    """int32[2, J]: (nodes, replicas) an idle job starts with, from bool[J, A1, R1].

    The one-node pair with the fewest replicas if there is one, else the pair
    with the fewest replicas (then nodes); (1, 1) for a job with no pair.
    """
    n_jobs, a1, r1 = allowed.shape
    out = np.ones((2, n_jobs), np.int32)
    one_node = allowed[:, 1, 1:].any(axis=1) if a1 > 1 else np.zeros(n_jobs, bool)
    out[1, one_node] = allowed[one_node, 1, 1:].argmax(axis=1) + 1
    for j in np.flatnonzero(~one_node):
        a, r = np.nonzero(allowed[j, 1:, 1:])
        if a.size:
            k = np.lexsort((a, r))[0]
            out[:, j] = (a[k] + 1, r[k] + 1)
    return out


def _round_up(n: int, bucket: int) -> int:
    return max(bucket, -(-n // bucket) * bucket)


def encode(problem: Problem, incumbent: np.ndarray | None = None) -> tuple[EvoParams, np.ndarray]:
    """Encode a problem as padded numpy :class:`EvoParams` plus seeds int32[2, J, N].

    The seeds are the current placement and the incumbent (the current
    placement again when none is given, so the shapes never depend on it).
    """
    j_real, n_real = problem.num_jobs, problem.num_nodes
    a_real, r_real = problem.table_shape
    jp, np_ = _round_up(j_real, JOB_BUCKET), _round_up(n_real, NODE_BUCKET)
    a1, r1 = _round_up(a_real + 1, TABLE_BUCKET), _round_up(r_real + 1, TABLE_BUCKET)

    capacity = np.zeros(np_, np.int32)
    capacity[:n_real] = problem.capacity
    current = np.zeros((jp, np_), np.int32)
    current[:j_real, :n_real] = problem.current
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

    params = EvoParams(
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
        seeds[1, :j_real, :n_real] = incumbent
    return params, seeds


# --------------------------------------------------------------------------- operators
def _cumsum(x: Any, axis: int) -> Any:
    """Inclusive cumulative sum of int[..] along ``axis``.

    Short axes use a matmul with a triangular matrix (exact in float32 for
    replica counts, and both faster to run and to compile than XLA's cumsum on
    CPU); long ones an associative scan.
    """
    jax = _jax()
    import jax.numpy as jnp

    length = x.shape[axis]
    if length > MATMUL_CUMSUM_MAX:
        return jax.lax.associative_scan(jnp.add, x, axis=axis)
    tri = np.triu(np.ones((length, length), np.float32))  # tri[i, k] = 1 if i <= k
    moved = jnp.moveaxis(x, axis, -1).astype(jnp.float32)
    return jnp.moveaxis(jnp.round(moved @ tri).astype(x.dtype), -1, axis)


def _first_from(mask: Any, offset: Any) -> tuple[Any, Any]:
    """Per row of bool[J, N]: the first True column at or after ``offset[j]`` (cyclic).

    Returns (column int[J], whether the row has any True).  With a random
    offset this is a cheap random pick that needs one random number per row.
    """
    import jax.numpy as jnp

    n = mask.shape[-1]
    distance = jnp.where(mask, (jnp.arange(n)[None, :] - offset[:, None]) % n, n)
    return jnp.argmin(distance, axis=1), jnp.any(mask, axis=1)


def _remove_excess(x: Any, target: Any) -> Any:
    """Lower each row of int[J, N] to ``target[j]`` replicas, keeping >= 1 per used node.

    Replicas go from the lowest-numbered nodes first; ``target`` must lie in
    ``[nodes_j, sum_j]``.
    """
    import jax.numpy as jnp

    budget = jnp.maximum(x - 1, 0)
    excess = jnp.sum(x, axis=1) - target
    before = _cumsum(budget, 1) - budget
    return x - jnp.clip(excess[:, None] - before, 0, budget)


def _project(x: Any, params: EvoParams) -> Any:
    """Project every row of int[J, N] onto an allowed (nodes, replicas) pair.

    A row whose pair is allowed is kept.  Otherwise the best-speedup allowed pair
    among these reductions is taken (ties: fewest nodes): (C) keep only the
    largest entry, (B) drop the smallest entry, (A) keep every node -- each
    with the best allowed replica count not above what the kept nodes hold
    (``best_value``/``best_replicas`` are prefix maxima over replicas) -- or
    (D) nothing.  Sorting rows would find the best of all subsets of nodes,
    but costs more than the rest of a generation together.
    """
    import jax.numpy as jnp

    n_jobs, n_nodes = x.shape
    a1, r1 = params.table.shape[1:3]
    jobs = jnp.arange(n_jobs)
    cols = jnp.arange(n_nodes)[None, :]
    used = x > 0
    nodes = jnp.sum(used, axis=1)
    reps = jnp.sum(x, axis=1)

    def best(a: Any, reach: Any, valid: Any) -> tuple[Any, Any]:
        ai, ri = jnp.clip(a, 0, a1 - 1), jnp.clip(reach, 0, r1 - 1)
        entry = params.table[jobs, ai, ri]
        value = jnp.where(valid & (a < a1), entry[:, BEST_VALUE], -jnp.inf)
        return value, entry[:, BEST_REPLICAS].astype(x.dtype)

    ok = (nodes < a1) & (reps < r1)
    ok &= params.table[jobs, jnp.minimum(nodes, a1 - 1), jnp.minimum(reps, r1 - 1), SPEEDUP] >= 0
    big = jnp.iinfo(x.dtype).max
    smallest = jnp.argmin(jnp.where(used, x, big), axis=1)
    largest = jnp.argmax(x, axis=1)
    low, high = x[jobs, smallest], x[jobs, largest]
    v_c, r_c = best(jnp.ones_like(nodes), high, nodes >= 1)
    v_b, r_b = best(nodes - 1, reps - low, nodes >= 2)
    v_a, r_a = best(nodes, reps, nodes >= 1)
    values = jnp.stack([v_c, v_b, v_a, jnp.zeros_like(v_a)])
    choice = jnp.argmax(values, axis=0)
    target = jnp.stack([r_c, r_b, r_a, jnp.zeros_like(r_a)])[choice, jobs]
    keep = jnp.where(
        (choice == 0)[:, None],
        cols == largest[:, None],
        jnp.where((choice == 1)[:, None], cols != smallest[:, None], (choice == 2)[:, None]),
    )
    return jnp.where(ok[:, None], x, _remove_excess(jnp.where(keep, x, 0), target))


def repair(x: Any, order: Any, params: EvoParams) -> Any:
    """Make one placement int32[J, N] feasible by removing replicas (module docstring).

    ``order`` int[2, J] holds the job priority (a permutation, highest first)
    that settles capacity and interference conflicts, and its inverse.  The
    interference step looks at which jobs span several nodes before the
    capacity step; that can only remove more, never leave a node with two
    multi-node jobs (a job's node count never grows during repair).
    """
    import jax.numpy as jnp

    cap = params.capacity
    xp = jnp.clip(x, 0, cap[None, :])[order[0]]
    multi = (xp > 0) & (jnp.sum(xp > 0, axis=1) > 1)[:, None]
    # One cumulative sum serves both rules: replicas and multi-node jobs placed
    # on each node by higher-priority jobs.
    stacked = jnp.stack([xp, multi.astype(xp.dtype)])
    before = _cumsum(stacked, 1) - stacked
    # Capacity: a job keeps on each node what the higher-priority jobs left free.
    xp = jnp.clip(cap[None, :] - before[0], 0, xp)
    # Interference: only the first multi-node job in priority order stays on a node.
    xp = jnp.where(params.interference & multi & (before[1] > 0), 0, xp)
    return _project(xp[order[1]], params)


def _priorities(u_shared: Any, u_shift: Any) -> Any:
    """int[P, 2, J]: job priorities for :func:`repair` and their inverses.

    One random permutation of the jobs (from ``u_shared`` float[J]), rotated by
    a random shift per individual (from ``u_shift`` float[P]): one permutation
    per generation is much cheaper than one per individual.
    """
    import jax.numpy as jnp

    n_jobs = u_shared.shape[0]
    perm = jnp.argsort(u_shared).astype(jnp.int32)
    inverse = jnp.argsort(perm).astype(jnp.int32)
    shift = jnp.floor(u_shift * n_jobs).astype(jnp.int32)[:, None]
    order = perm[(jnp.arange(n_jobs)[None, :] + shift) % n_jobs]
    return jnp.stack([order, (inverse[None, :] - shift) % n_jobs], axis=1)


def mutate(u: Any, x: Any, params: EvoParams, config: EvoConfig) -> Any:
    """Mutate one placement int32[J, N]: reset rows to the current placement, zero entries.

    ``u`` float[MUTATE_DRAWS, J] are its uniform random numbers (rows 0-2 used
    here, 3-6 by :func:`grow`).  The result may be infeasible; :func:`repair` follows.
    """
    import jax.numpy as jnp

    n_jobs, n_nodes = x.shape
    cols = jnp.arange(n_nodes)[None, :]
    jobs = jnp.maximum(params.num_jobs, 1).astype(jnp.float32)
    x = jnp.where((u[0] < jnp.minimum(config.reset_jobs / jobs, 1.0))[:, None], params.current, x)
    col, has = _first_from(x > 0, jnp.floor(u[1] * n_nodes).astype(jnp.int32))
    hit = (u[2] < jnp.minimum(config.zero_jobs / jobs, 1.0)) & has
    return jnp.where(hit[:, None] & (cols == col[:, None]), 0, x)


def grow(u: Any, x: Any, params: EvoParams, config: EvoConfig) -> Any:
    """Randomly increase entries of one placement int32[J, N] where capacity is free.

    A busy job adds ``U{1..free}`` replicas on one node with free capacity: one
    of its own nodes with probability ``own_node_probability``, else any.  An
    idle job starts on its start pair (``start_nodes``, ``start_replicas``): on
    one free node with ``U{start_replicas..free}`` replicas, or, for a job
    that only runs across nodes, with one replica on each of the first
    ``start_nodes`` free nodes from a random offset and the rest on the first.
    Idle jobs always try (with p <= 0 one idle job dominates the power mean);
    busy ones with the rate ``increase_jobs``.  Several jobs may pick the same
    node: :func:`repair` follows.
    """
    import jax.numpy as jnp

    n_jobs, n_nodes = x.shape
    cols = jnp.arange(n_nodes)[None, :]
    jobs = jnp.maximum(params.num_jobs, 1).astype(jnp.float32)
    free = params.capacity - jnp.sum(x, axis=0)
    busy = jnp.any(x > 0, axis=1)
    offset = jnp.floor(u[4] * n_nodes).astype(jnp.int32)
    own = (u[3] < config.own_node_probability) & busy
    mask = (free[None, :] > 0) & jnp.where(own[:, None], x > 0, True)
    node, has = _first_from(mask, offset)
    room = free[node]
    low = jnp.where(busy, 1, jnp.minimum(params.start_replicas, room))
    amount = low + jnp.floor(u[5] * jnp.maximum(room - low + 1, 0)).astype(x.dtype)
    wants = ~busy | (u[6] < jnp.minimum(config.increase_jobs / jobs, 1.0))
    one_node = jnp.where((wants & has)[:, None] & (cols == node[:, None]), x + amount[:, None], x)
    # Multi-node starts: rank of each free node in cyclic order from the offset.
    is_free = (free > 0).astype(x.dtype)
    seen = _cumsum(is_free[None, :], 1)[0]  # free nodes among 0..n
    before = jnp.where(offset > 0, seen[jnp.maximum(offset - 1, 0)], 0)[:, None]
    rank = jnp.where(cols >= offset[:, None], seen - 1 - before, seen[-1] - before + seen - 1)
    spread = (is_free[None, :] > 0) & (rank < params.start_nodes[:, None])
    rest = (params.start_replicas - params.start_nodes)[:, None]
    extra = jnp.where(spread & (rank == 0), rest, 0)
    multi = ~busy & (params.start_nodes > 1) & (seen[-1] >= params.start_nodes)
    return jnp.where(multi[:, None], x + spread.astype(x.dtype) + extra, one_node)


def _fitness(x: Any, params: EvoParams) -> Any:
    """log M_p of one placement int32[J, N] (float32), -inf if it is infeasible."""
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    n_jobs = x.shape[0]
    a1, r1 = params.table.shape[1:3]
    nodes = jnp.sum(x > 0, axis=1)
    reps = jnp.sum(x, axis=1)
    ni, ri = jnp.minimum(nodes, a1 - 1), jnp.minimum(reps, r1 - 1)
    speedup = params.table[jnp.arange(n_jobs), ni, ri, SPEEDUP]
    valid = (nodes < a1) & (reps < r1) & (speedup >= 0)
    # Seeds are scored unrepaired, so check every rule (repaired children pass).
    multi = (x > 0) & (nodes > 1)[:, None]
    feasible = jnp.all(jnp.sum(x, axis=0) <= params.capacity) & jnp.all(x >= 0)
    feasible &= ~params.interference | jnp.all(jnp.sum(multi, axis=0) <= 1)
    moved = params.has_current & jnp.any(x != params.current, axis=1)
    value = jnp.maximum(speedup, 0.0) * jnp.where(moved, params.restart_factor, 1.0)
    log_y = jnp.log(value + EPS)
    w = params.weight
    w_sum = jnp.sum(w)
    tiny = jnp.finfo(jnp.float32).tiny
    p = params.p
    safe_p = jnp.where(p == 0, 1.0, p)
    # M_p = (sum w y^p / W)^(1/p): log M_p = (logsumexp(p log y, b=w) - log W) / p.
    power = (logsumexp(safe_p * log_y, b=w) - jnp.log(jnp.maximum(w_sum, tiny))) / safe_p
    geometric = jnp.sum(w * log_y) / jnp.maximum(w_sum, tiny)
    log_mean = jnp.where(w_sum > 0, jnp.where(p == 0, geometric, power), 0.0)
    return jnp.where(jnp.all(valid) & feasible, log_mean, -jnp.inf)


def score(population: Any, params: EvoParams) -> Any:
    """Fitness float32[P] of a population int32[P, J, N] (log power mean)."""
    jax = _jax()
    return jax.vmap(_fitness, in_axes=(0, None))(population, params)


def _draws(key: Any, size: int, n_jobs: int) -> Any:
    """All uniforms one generation needs, in one draw (one RNG kernel compiles once).

    Row ``i < size`` serves individual i; row ``size`` is shared.  Columns: the
    ``MUTATE_DRAWS`` blocks of J for :func:`mutate`, a block of J for crossover,
    then ``PER_INDIVIDUAL_DRAWS`` scalars (4 tournament contenders, whether to
    cross over, the priority shift).
    """
    jax = _jax()

    import jax.numpy as jnp

    width = (MUTATE_DRAWS + 1) * n_jobs + PER_INDIVIDUAL_DRAWS
    # Two 16-bit uniforms per random 32-bit word halve the RNG work, which is a
    # large share of a generation; 2^-16 resolution is ample for these rates.
    bits = jax.random.bits(key, (size + 1, -(-width // 2)), jnp.uint32)
    halves = jnp.concatenate([bits & UINT16_MASK, bits >> 16], axis=1)[:, :width]
    return halves.astype(jnp.float32) * (1.0 / (UINT16_MASK + 1))


def _offspring(u: Any, x: Any, params: EvoParams, config: EvoConfig) -> Any:
    """Mutate, repair, grow and repair a population int32[P, J, N] (uniforms of :func:`_draws`).

    Growing after a first repair fills the capacity that the repair freed and
    restarts the jobs it zeroed, so crossover children stay competitive.
    """
    jax = _jax()

    size, n_jobs = x.shape[:2]
    u_mut = u[:size, : MUTATE_DRAWS * n_jobs].reshape(size, MUTATE_DRAWS, n_jobs)
    order = _priorities(u[size, :n_jobs], u[:size, -1])
    fix = jax.vmap(repair, in_axes=(0, 0, None))
    x = fix(jax.vmap(mutate, in_axes=(0, 0, None, None))(u_mut, x, params, config), order, params)
    x = jax.vmap(grow, in_axes=(0, 0, None, None))(u_mut, x, params, config)
    return fix(x, order, params)


def init(seeds: Any, params: EvoParams, config: EvoConfig) -> EvoState:
    """Initial state: copies of the seeds int32[S, J, N] (the current placement, an incumbent).

    The seeds are not repaired here (an infeasible one scores -inf and loses
    its place to its repaired offspring in the first generation), so a run
    compiles the mutation and repair operators only once, in :func:`step`.
    """
    import jax.numpy as jnp

    size = config.population_size
    population = seeds[jnp.arange(size) % seeds.shape[0]]
    return EvoState(population, score(population, params), jnp.zeros((), jnp.int32))


def ask(key: Any, state: EvoState, params: EvoParams, config: EvoConfig) -> Any:
    """Children int32[P, J, N]: tournament, crossover over jobs, mutation, repair."""
    import jax.numpy as jnp

    pop, fit = state.population, state.fitness
    size, n_jobs = pop.shape[:2]
    u = _draws(key, size, n_jobs)
    tail = u[:size, (MUTATE_DRAWS + 1) * n_jobs :]
    contenders = jnp.floor(tail[:, :4].T.reshape(2, 2, size) * size).astype(jnp.int32)
    first, second = contenders[:, 0], contenders[:, 1]
    parents = jnp.where(fit[first] >= fit[second], first, second)  # [2, P] binary tournaments
    cross = tail[:, 4] < config.crossover_probability
    mix = u[:size, MUTATE_DRAWS * n_jobs : (MUTATE_DRAWS + 1) * n_jobs] < 0.5
    from_b = mix & cross[:, None]
    children = jnp.where(from_b[:, :, None], pop[parents[1]], pop[parents[0]])
    return _offspring(u, children, params, config)


def tell(state: EvoState, children: Any, fitness: Any) -> EvoState:
    """(mu + lambda) elitism: keep the best P of parents and children."""
    jax = _jax()
    import jax.numpy as jnp

    pool = jnp.concatenate([state.population, children])
    pool_fit = jnp.concatenate([state.fitness, fitness])
    best_fit, idx = jax.lax.top_k(pool_fit, state.population.shape[0])
    return EvoState(pool[idx], best_fit, state.generation + 1)


def step(key: Any, state: EvoState, params: EvoParams, config: EvoConfig) -> EvoState:
    """One generation; its key is ``fold_in(key, state.generation)``."""
    jax = _jax()

    gen_key = jax.random.fold_in(key, state.generation)
    children = ask(gen_key, state, params, config)
    return tell(state, children, score(children, params))


def evolve(
    key: Any, state: EvoState, params: EvoParams, until: Any, config: EvoConfig, length: int
) -> EvoState:
    """Run ``length`` scanned generations, skipping those at or past generation ``until``.

    Keys depend only on ``key`` and the generation number, so running G
    generations in one call or in chunks gives the same population.
    """
    jax = _jax()

    def body(st: EvoState, _: Any) -> tuple[EvoState, None]:
        nxt = jax.lax.cond(
            st.generation < until, lambda s: step(key, s, params, config), lambda s: s, st
        )
        return nxt, None

    final, _ = jax.lax.scan(body, state, None, length=length)
    return final


# --------------------------------------------------------------------------- compiling
def _signature(tree: Any) -> tuple:
    return tuple((tuple(np.shape(a)), np.asarray(a).dtype.str) for a in tree)


@functools.lru_cache(maxsize=COMPILE_CACHE_SIZE)
def _compiled(config: EvoConfig, length: int, params_sig: tuple, seeds_sig: tuple) -> tuple:
    """Ahead-of-time compiled (init, evolve) for these static shapes; cached."""
    jax = _jax()

    def struct(sig: tuple) -> list:
        return [jax.ShapeDtypeStruct(shape, np.dtype(dt)) for shape, dt in sig]

    key = jax.eval_shape(lambda: jax.random.key(0))
    params = EvoParams(*struct(params_sig))
    (seeds,) = struct(seeds_sig)
    start = time.perf_counter()
    init_fn = jax.jit(init, static_argnums=2).lower(seeds, params, config).compile()
    state = jax.eval_shape(functools.partial(init, config=config), seeds, params)
    until = jax.ShapeDtypeStruct((), np.int32)
    evolve_fn = (
        jax.jit(evolve, static_argnums=(4, 5))
        .lower(key, state, params, until, config, length)
        .compile()
    )
    return init_fn, evolve_fn, time.perf_counter() - start


# --------------------------------------------------------------------------- solver
def _check_problem(problem: Any) -> None:
    if not isinstance(problem, Problem):
        raise InvalidProblem(f"problem must be a solvers.Problem, got {type(problem).__name__}")


def _check_time_limit(time_limit: Any) -> None:
    if time_limit is None:
        return
    ok = isinstance(time_limit, (int, float, np.integer, np.floating)) and not isinstance(
        time_limit, bool
    )
    if not ok or not math.isfinite(time_limit) or time_limit <= 0:
        raise InvalidProblem(f"time_limit must be a positive number of seconds, got {time_limit!r}")


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InvalidProblem(f"{name} must be an integer >= {low}, got {value!r}")
    if value >= INT_OPTION_LIMIT:
        raise InvalidProblem(f"{name} must be < 2**63, got {value!r}")
    return int(value)


def _check_incumbent(problem: Problem, incumbent: Any) -> np.ndarray | None:
    if incumbent is None:
        return None
    arr = np.asarray(incumbent)
    shape = (problem.num_jobs, problem.num_nodes)
    if arr.shape != shape:
        raise InvalidProblem(f"incumbent must have shape {shape}, got {arr.shape}")
    if arr.size and (
        not np.issubdtype(arr.dtype, np.number)
        or not np.all(np.isfinite(arr))
        or np.any(arr < 0)
        or np.any(arr != np.round(arr))
    ):
        raise InvalidProblem("incumbent must hold non-negative integer replica counts")
    return arr.astype(np.int64)


def solve_evolutionary(
    problem: Problem,
    *,
    population_size: int = DEFAULT_POPULATION_SIZE,
    generations: int = DEFAULT_GENERATIONS,
    seed: int = 0,
    incumbent: np.ndarray | None = None,
    time_limit: float | None = None,
) -> Result:
    """Genetic algorithm over placement matrices (module docstring), in JAX.

    Args:
        problem: the allocation problem.
        population_size: individuals per generation (>= 2; default 100, as Pollux).
        generations: generations to run (>= 0; default 100, as Pollux).
        seed: seed of the PRNG key; the same seed gives the same answer.
        incumbent: optional placement int[J, N] (for example the MILP's) that
            seeds half of the initial population, and is returned if it is
            feasible and nothing better is found.  An infeasible one scores
            -inf and only lives on through its repaired offspring.
        time_limit: wall seconds for the whole call, compilation included.  The
            generations then run in ``TIME_CHECKS`` chunks, the clock is checked
            before each, and the search stops at the first check past the limit
            (status ``TIME_LIMIT``).  When no seed is feasible the first chunk
            runs regardless, so that the answer is a searched one.  Without a
            limit all generations run as one compiled call.

    Returns:
        A :class:`Result` with status ``FEASIBLE`` (or ``TIME_LIMIT``), the best
        placement found (never worse than the current placement or the
        incumbent when those are feasible), its objective recomputed by
        :func:`solvers.evaluate`, ``bound = gap = nan``; ``build_seconds``
        covers encoding and compiling, ``solve_seconds`` the search and
        decoding; ``stats`` holds ``compile_seconds`` (0 when the compiled
        program was cached), ``cache_hit``, ``generations``,
        ``population_size``, ``seed`` and ``padded_shape``.

    Raises:
        InvalidProblem: for a bad problem, option or incumbent.
        ImportError: if jax is not installed.
    """
    start = time.perf_counter()
    _check_problem(problem)
    population_size = _check_int("population_size", population_size, 2)
    generations = _check_int("generations", generations, 0)
    seed = _check_int("seed", seed, 0)
    _check_time_limit(time_limit)
    inc = _check_incumbent(problem, incumbent)
    jax = _jax()

    params, seeds = encode(problem, inc)
    encoded = time.perf_counter()
    config = EvoConfig(population_size=population_size)
    length = generations if time_limit is None else max(1, -(-generations // TIME_CHECKS))
    hits_before = _compiled.cache_info().hits
    init_fn, evolve_fn, compile_seconds = _compiled(
        config, length, _signature(params), _signature([seeds])
    )
    cache_hit = _compiled.cache_info().hits > hits_before
    if cache_hit:
        compile_seconds = 0.0
    built = time.perf_counter()

    key = jax.random.key(seed)
    state = init_fn(seeds, params)
    until = np.int32(generations)
    timed_out = False
    done = 0
    # Without a feasible seed, one chunk runs even past the limit, so that the
    # answer is a searched one rather than the empty placement.
    must_run = not np.isfinite(float(np.max(state.fitness)))
    while done < generations:
        late = time_limit is not None and time.perf_counter() - start >= time_limit
        if late and not (must_run and done == 0):
            timed_out = True
            break
        state = evolve_fn(key, state, params, until)
        done = min(done + length, generations)
        if time_limit is not None:
            jax.block_until_ready(state)
    fitness = np.asarray(state.fitness)
    ranked = np.argsort(-fitness, kind="stable")[:FINAL_CANDIDATES]
    ranked = ranked[fitness[ranked] > -np.inf]
    best_found = np.asarray(state.population[ranked])  # only these leave the device

    j, n = problem.num_jobs, problem.num_nodes
    candidates = [x[:j, :n].astype(np.int64) for x in best_found]
    seeds_ok = [x for x in (problem.current, inc) if x is not None and not violations(problem, x)]
    candidates += seeds_ok
    if not candidates:  # no generation ran and no seed is feasible; holding nothing is
        candidates.append(np.zeros_like(problem.current))  # always feasible
    objectives = [evaluate(problem, x) for x in candidates]
    best = int(np.argmax(objectives))
    placement = np.array(candidates[best], dtype=np.int64)
    broken = violations(problem, placement)
    solved = time.perf_counter()
    status = Status.TIME_LIMIT if timed_out else Status.FEASIBLE
    message = f"{done} generations x population {population_size}"
    if broken:  # a repair bug: never return an infeasible placement as a solution
        logger.error("evolutionary solver produced an infeasible placement: %s", broken)
        status, placement = Status.ERROR, problem.current.copy()
        message = "internal error: infeasible placement: " + "; ".join(broken)
    objective = objectives[best] if not broken else float("nan")
    return Result(
        placement=placement,
        status=status,
        objective=float(objective),
        bound=float("nan"),
        gap=float("nan"),
        build_seconds=built - start,
        solve_seconds=solved - built,
        solver="evolutionary",
        message=message,
        stats={
            "compile_seconds": compile_seconds,
            "encode_seconds": encoded - start,
            "cache_hit": cache_hit,
            "generations": done,
            "population_size": population_size,
            "seed": seed,
            "padded_shape": tuple(int(s) for s in seeds.shape[1:]),
        },
    )
