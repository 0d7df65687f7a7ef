"""Evolutionary solver: a genetic algorithm over placement matrices, in JAX.

Pollux (Qiao et al., OSDI 2021, section 4.2) allocates with a genetic algorithm
over allocation matrices (population 100, 100 generations per round, NSGA-II in
numpy).  This module keeps that search space and kind of operators but runs the
whole search as compiled XLA programs: the population is scored with ``vmap``
and the generations are a ``lax.scan``.

Individuals are placement matrices (replicas of job j on node n), stored
node-major as ``X`` int32[N, J]: jobs along the minor axis.  Most operators
work per job (a job's node count and replica count are reductions over nodes,
its random numbers and table lookups are per job and broadcast over nodes),
which XLA's CPU backend vectorizes along the minor axis, and the priority
sums of :func:`repair` are then a plain matmul.  The search is written as
pure functions over an immutable :class:`EvoState` with explicit PRNG keys,
in the style of evosax and optax:

* :func:`init` (seeds) -> state: copies of the seeds, the current placement
  and an optional incumbent (such as the MILP's);
* :func:`ask` (key, state) -> children: binary tournament selection, uniform
  crossover over jobs (each job's column comes whole from one parent), then

  - :func:`mutate`: reset a job to its current placement (so that "do not
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
  and :func:`evolve` scans it.  ``step`` takes the children's fitness from
  their last repair, which reads each job's speedup off the table anyway, and
  stores each stage's output once (:func:`_fence`) so that XLA does not
  recompute earlier stages inside later ones.

All random numbers of a generation come from one small threefry draw expanded
by a counter-based hash (:func:`draws`).

:func:`repair` makes any non-negative integer matrix feasible by only ever
*removing* replicas, in an order that keeps each fixed constraint fixed:

1. clip each entry to its node's capacity;
2. capacity: jobs in a random priority order keep what still fits on a node
   (the replicas that higher-priority jobs hold on a node are one matmul with
   a 0/1 "ranks before" matrix, shared by the population: one random job
   ranking per generation, rotated by a random shift per child);
3. interference avoidance: on each node only the highest-priority job that
   spans several nodes stays (the others leave that node; a job can only span
   fewer nodes afterwards, so no node gains a multi-node job);
4. configurations (:func:`_project`): a job whose (nodes, replicas) pair is
   allowed stays as is; any other becomes the best-speedup allowed pair
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
import time
from typing import Any, NamedTuple

import numpy as np

from ._checks import check_problem, check_time_limit
from ._errors import InvalidProblem
from ._problem import EPS, Problem, evaluate, violations
from ._result import Result, Status

__all__ = [
    "EvoConfig",
    "EvoParams",
    "EvoState",
    "Draws",
    "encode",
    "init",
    "ask",
    "tell",
    "score",
    "repair",
    "mutate",
    "grow",
    "draws",
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
#: Expected number of jobs per child whose placement is reset to the current one.
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
#: Rows of ``Draws.job``, the uniforms per child and job: :func:`mutate` uses
#: RESET, ZERO_NODE, ZERO; :func:`grow` OWN, GROW_NODE, AMOUNT, GROW; the
#: crossover MIX.
RESET, ZERO_NODE, ZERO, OWN, GROW_NODE, AMOUNT, GROW, MIX = range(8)
DRAWS_PER_JOB = 8
#: Columns of ``Draws.individual``: four tournament contenders, then CROSS
#: (whether to cross over) and SHIFT (the rotation of the repair priority).
CONTENDERS, CROSS, SHIFT = 4, 4, 5
DRAWS_PER_INDIVIDUAL = 6
#: Each random 32-bit word gives two 16-bit uniforms (2^-16 resolution is ample
#: for these rates).
UINT16_MASK = 0xFFFF
#: Multipliers of the lowbias32 integer hash (C. Wellons, "Prospecting for hash
#: functions", 2018), and the counter step between derived words (the 32-bit
#: golden ratio, as in splitmix).
MIX_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)
MIX_INCREMENT = 0x9E3779B9
#: Up to this many (padded) jobs the priority prefix sums of :func:`repair`
#: are a matmul with a J x J matrix (O(J^2) per node, no data movement); above
#: it the jobs are gathered into priority order for an O(J log J) associative
#: scan.  On the 2-core machine the matmul was 2x faster at 104 jobs and 1.7x
#: at 200 (64 nodes).
MATMUL_PRIORITY_MAX = 512
#: Up to this many (padded) nodes, cumulative sums over nodes are an unrolled
#: chain of adds (XLA fuses it into one vectorized loop); above, an associative scan.
UNROLLED_CUMSUM_MAX = 64
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


class EvoState(NamedTuple):
    """Immutable state of the search: a population and where it stands."""

    population: Any  # int32[P, N, J]: node-major placements
    fitness: Any  # float32[P]: log power mean, -inf if infeasible
    generation: Any  # int32[]: generations done (keys are folded with it)


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


def _round_up(n: int, bucket: int) -> int:
    return max(bucket, -(-n // bucket) * bucket)


def encode(problem: Problem, incumbent: np.ndarray | None = None) -> tuple[EvoParams, np.ndarray]:
    """Encode a problem as padded numpy :class:`EvoParams` plus seeds int32[2, N, J].

    The seeds (node-major, like every placement here) are the current
    placement and the incumbent (the current placement again when none is
    given, so the shapes never depend on it); entries of the incumbent above a
    node's capacity are clipped to it, which :func:`repair` would do first.
    """
    j_real, n_real = problem.num_jobs, problem.num_nodes
    a_real, r_real = problem.table_shape
    jp, np_ = _round_up(j_real, JOB_BUCKET), _round_up(n_real, NODE_BUCKET)
    a1, r1 = _round_up(a_real + 1, TABLE_BUCKET), _round_up(r_real + 1, TABLE_BUCKET)

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
        seeds[1, :n_real, :j_real] = np.minimum(incumbent.T, problem.capacity[:, None])
    return params, seeds


# --------------------------------------------------------------------------- operators
def _cumsum_nodes(x: Any) -> Any:
    """Inclusive cumulative sum of int[N, ...] over nodes (axis 0).

    Up to ``UNROLLED_CUMSUM_MAX`` nodes an unrolled chain of adds of whole
    rows, which XLA fuses into one loop along the rows (alone, 2x faster on
    CPU than a triangular matmul and 7x faster than XLA's cumsum); above that
    an associative scan (a long unrolled chain would take long to compile).
    """
    jax = _jax()
    import jax.numpy as jnp

    if x.shape[0] > UNROLLED_CUMSUM_MAX:
        return jax.lax.associative_scan(jnp.add, x, axis=0)
    sums = [x[0]]
    for row in range(1, x.shape[0]):
        sums.append(sums[-1] + x[row])
    return jnp.stack(sums)


def _first_from(mask: Any, offset: Any) -> tuple[Any, Any]:
    """Per job of bool[N, J]: the first True node at or after ``offset[j]`` (cyclic).

    Returns (node int32[J], whether the job has any True).  With a random
    offset in ``[0, N)`` this is a cheap random pick that needs one random
    number per job: the cyclic distances from the offset are distinct, so one
    plain minimum over them finds the node.
    """
    jax = _jax()
    import jax.numpy as jnp

    n = mask.shape[0]
    rows = jnp.arange(n, dtype=jnp.int32)[:, None]
    ahead = rows - offset[None, :]  # in (-n, n): a compare is cheaper than a remainder
    distance = jnp.min(jnp.where(mask, jnp.where(ahead < 0, ahead + n, ahead), n), axis=0)
    return jax.lax.rem(offset + distance, n), distance < n


def _remove_excess(x: Any, target: Any) -> Any:
    """Lower each job of int32[N, J] to ``target[j]`` replicas, keeping >= 1 per used node.

    Replicas go from the lowest-numbered nodes first; ``target`` must lie in
    ``[nodes_j, sum_j]``.
    """
    import jax.numpy as jnp

    budget = jnp.maximum(x - 1, 0)
    excess = jnp.sum(x, axis=0) - target
    before = _cumsum_nodes(budget) - budget
    return x - jnp.clip(excess[None, :] - before, 0, budget)


def _lookup(params: EvoParams, nodes: Any, replicas: Any) -> Any:
    """float32[J, 3]: each job's table channels at (nodes, replicas), clipped into the table."""
    import jax.numpy as jnp

    n_jobs, a1, r1 = params.table.shape[:3]
    return params.table[
        jnp.arange(n_jobs), jnp.clip(nodes, 0, a1 - 1), jnp.clip(replicas, 0, r1 - 1)
    ]


def _project(x: Any, params: EvoParams) -> tuple[Any, Any]:
    """Project every job of int32[N, J] onto an allowed (nodes, replicas) pair.

    A job whose pair is allowed is kept.  Otherwise the best-speedup allowed
    pair among these reductions is taken (ties: fewest nodes): (C) keep only
    the largest entry, (B) drop the smallest entry, (A) keep every node --
    each with the best allowed replica count not above what the kept nodes
    hold (``best_value``/``best_replicas`` are prefix maxima over replicas) --
    or (D) nothing.  Sorting would find the best of all subsets of nodes, but
    costs more than the rest of a generation together.

    Returns the projected placement and each job's speedup float32[J] (read
    off the table on the way, so that scoring a child needs no second lookup).
    """
    jax = _jax()
    import jax.numpy as jnp

    n_nodes = x.shape[0]
    a1, r1 = params.table.shape[1:3]
    rows = jnp.arange(n_nodes, dtype=jnp.int32)[:, None]
    used = x > 0
    nodes = jnp.sum(used, axis=0, dtype=jnp.int32)
    reps = jnp.sum(x, axis=0)
    # The smallest used and the largest entry with their nodes (first on ties),
    # each from one plain minimum of value * N + node.
    big = jnp.iinfo(jnp.int32).max
    low_key = jnp.min(jnp.where(used, x * n_nodes + rows, big), axis=0)
    high_key = jnp.max(x * n_nodes + (n_nodes - 1 - rows), axis=0)
    low, smallest = jax.lax.div(low_key, n_nodes), jax.lax.rem(low_key, n_nodes)
    high, largest = jax.lax.div(high_key, n_nodes), n_nodes - 1 - jax.lax.rem(high_key, n_nodes)

    here = _lookup(params, nodes, reps)
    ok = (nodes < a1) & (reps < r1) & (here[:, SPEEDUP] >= 0)
    one = _lookup(params, jnp.ones_like(nodes), high)
    fewer = _lookup(params, nodes - 1, reps - low)
    values = jnp.stack(
        [
            jnp.where(nodes >= 1, one[:, BEST_VALUE], -jnp.inf),  # (C)
            jnp.where((nodes >= 2) & (nodes - 1 < a1), fewer[:, BEST_VALUE], -jnp.inf),  # (B)
            jnp.where((nodes >= 1) & (nodes < a1), here[:, BEST_VALUE], -jnp.inf),  # (A)
            jnp.zeros(nodes.shape, jnp.float32),  # (D)
        ]
    )
    choice = jnp.argmax(values, axis=0)
    replicas = jnp.stack([one, fewer, here, jnp.zeros_like(here)])[..., BEST_REPLICAS]
    target = jnp.take_along_axis(replicas, choice[None], axis=0)[0].astype(jnp.int32)
    # Per job: ``only`` is the one node kept (C), none (node n_nodes: D) or -1
    # for all nodes (A, and allowed jobs, whose excess is then 0); ``drop`` is
    # the node dropped (B) or -1.
    only = jnp.where(ok | (choice == 2), -1, jnp.where(choice == 0, largest, n_nodes))
    drop = jnp.where(~ok & (choice == 1), smallest, -1)
    keep = ((rows == only[None, :]) | (only[None, :] < 0)) & (rows != drop[None, :])
    projected = _remove_excess(jnp.where(keep, x, 0), jnp.where(ok, reps, target))
    speedup = jnp.where(ok, here[:, SPEEDUP], jnp.max(values, axis=0))
    return projected, speedup


def _before(xc: Any, rank: Any, shift: Any) -> Any:
    """int32[N, J]: replicas that jobs of higher priority hold on each node.

    Job ``j``'s priority is ``(rank[j] - shift) mod J`` (0 first): the ranking
    ``rank`` (a permutation) rotated by ``shift``.  With ``S`` the sums over
    the jobs ranked before ``j`` (one matmul), those of higher priority are
    ``S - head`` if ``rank[j] >= shift``, else ``S + total - head``, where
    ``head`` holds the jobs ranked before ``shift``: so one ranking shared by
    the whole population (one matrix) serves every rotation.
    """
    jax = _jax()
    import jax.numpy as jnp

    n_jobs = xc.shape[1]
    wrapped = rank < shift
    head = jnp.sum(jnp.where(wrapped[None, :], xc, 0), axis=1)
    total = jnp.sum(xc, axis=1)
    if n_jobs <= MATMUL_PRIORITY_MAX:
        earlier = (rank[:, None] < rank[None, :]).astype(jnp.float32)  # [k, j]: k ranks before j
        # Exact: 0/1 weights, integer sums <= J x capacity, far below 2^24.
        ranked_before = jnp.round(xc.astype(jnp.float32) @ earlier).astype(jnp.int32)
    else:
        order = jnp.argsort(rank)  # the jobs in rank order; ranked[:, rank] undoes it
        ranked = xc[:, order]
        ranked_before = (jax.lax.associative_scan(jnp.add, ranked, axis=1) - ranked)[:, rank]
    return ranked_before - head[:, None] + jnp.where(wrapped[None, :], total[:, None], 0)


def _capacity(
    x: Any, rank: Any, shift: Any, params: EvoParams, *, interference: bool = True
) -> Any:
    """Steps 1-3 of :func:`repair` on int[N, J]: clip, capacity, and interference
    avoidance unless ``interference`` (static) is false."""
    import jax.numpy as jnp

    n_jobs = x.shape[1]
    cap = params.capacity[:, None]
    xc = jnp.clip(x.astype(jnp.int32), 0, cap)
    used = xc > 0
    multi = used & (jnp.sum(used, axis=0) > 1)[None, :]
    # Capacity: a job keeps on each node what the higher-priority jobs left free.
    xp = jnp.clip(cap - _before(xc, rank, shift), 0, xc)
    # Interference: only the first multi-node job in priority order stays on a
    # node (which jobs span several nodes is decided before the capacity step).
    if not interference:
        return xp
    priority = (rank - shift) % n_jobs
    first = jnp.min(jnp.where(multi, priority[None, :], n_jobs), axis=1)
    return jnp.where(params.interference & multi & (priority[None, :] > first[:, None]), 0, xp)


def _repair(x: Any, rank: Any, shift: Any, params: EvoParams) -> tuple[Any, Any]:
    """:func:`repair`, also returning the jobs' speedups float32[J] (see :func:`_project`)."""
    return _project(_capacity(x, rank, shift, params), params)


def repair(x: Any, rank: Any, params: EvoParams, shift: Any = 0) -> Any:
    """Make one placement int[N, J] feasible by removing replicas (module docstring).

    The job priority that settles capacity and interference conflicts is
    ``(rank - shift) mod J`` (0 first), for ``rank`` int32[J] a permutation
    of the jobs and ``shift`` int32[] in ``[0, J)``: :func:`ask` draws one
    ranking per generation and one shift per child.  The interference step
    looks at which jobs span several nodes before the capacity step; that can
    only remove more, never leave a node with two multi-node jobs (a job's
    node count never grows during repair).  Returns int32[N, J].
    """
    return _repair(x, rank, shift, params)[0]


def mutate(u: Any, x: Any, params: EvoParams, config: EvoConfig) -> Any:
    """Mutate one placement int32[N, J]: reset jobs to the current placement, zero entries.

    ``u`` float32[DRAWS_PER_JOB, J] are its uniform random numbers (rows
    ``RESET``, ``ZERO_NODE``, ``ZERO``).  The result may be infeasible;
    :func:`repair` follows.
    """
    import jax.numpy as jnp

    n_nodes = x.shape[0]
    rows = jnp.arange(n_nodes, dtype=jnp.int32)[:, None]
    jobs = jnp.maximum(params.num_jobs, 1).astype(jnp.float32)
    reset = u[RESET] < jnp.minimum(config.reset_jobs / jobs, 1.0)
    x = jnp.where(reset[None, :], params.current, x)
    node, has = _first_from(x > 0, (u[ZERO_NODE] * n_nodes).astype(jnp.int32))
    hit = (u[ZERO] < jnp.minimum(config.zero_jobs / jobs, 1.0)) & has
    return jnp.where(rows == jnp.where(hit, node, -1)[None, :], 0, x)


def grow(u: Any, x: Any, params: EvoParams, config: EvoConfig) -> Any:
    """Randomly increase entries of one placement int32[N, J] where capacity is free.

    A busy job adds ``U{1..free}`` replicas on one node with free capacity: one
    of its own nodes with probability ``own_node_probability``, else any.  An
    idle job starts on its start pair (``start_nodes``, ``start_replicas``): on
    one free node with ``U{start_replicas..free}`` replicas, or, for a job
    that only runs across nodes, with one replica on each of the first
    ``start_nodes`` free nodes from a random offset and the rest on the first.
    Idle jobs always try (with p <= 0 one idle job dominates the power mean);
    busy ones with the rate ``increase_jobs``; jobs with no allowed pair
    (``start_nodes`` 0) never.  Several jobs may pick the same node:
    :func:`repair` follows.  ``u`` float32[DRAWS_PER_JOB, J] (rows ``OWN``,
    ``GROW_NODE``, ``AMOUNT``, ``GROW``).
    """
    import jax.numpy as jnp

    n_nodes = x.shape[0]
    rows = jnp.arange(n_nodes, dtype=jnp.int32)[:, None]
    jobs = jnp.maximum(params.num_jobs, 1).astype(jnp.float32)
    free = params.capacity - jnp.sum(x, axis=1)
    busy = jnp.any(x > 0, axis=0)
    offset = (u[GROW_NODE] * n_nodes).astype(jnp.int32)
    own = (u[OWN] < config.own_node_probability) & busy
    mask = (free[:, None] > 0) & (~own[None, :] | (x > 0))
    node, has = _first_from(mask, offset)
    room = free[node]
    low = jnp.where(busy, 1, jnp.minimum(params.start_replicas, room))
    amount = low + (u[AMOUNT] * jnp.maximum(room - low + 1, 0)).astype(jnp.int32)
    can = params.start_nodes > 0
    wants = can & (~busy | (u[GROW] < jnp.minimum(config.increase_jobs / jobs, 1.0)))
    at = jnp.where(wants & has, node, -1)
    one_node = x + jnp.where(rows == at[None, :], amount[None, :], 0)
    # Multi-node starts: rank of each free node in cyclic order from the offset.
    is_free = (free > 0).astype(jnp.int32)
    seen = _cumsum_nodes(is_free)  # free nodes among 0..n
    before = jnp.where(offset > 0, seen[jnp.maximum(offset - 1, 0)], 0)[None, :]
    rank = jnp.where(
        rows >= offset[None, :], seen[:, None] - 1 - before, seen[-1] - before + seen[:, None] - 1
    )
    spread = (is_free[:, None] > 0) & (rank < params.start_nodes[None, :])
    rest = (params.start_replicas - params.start_nodes)[None, :]
    start = spread.astype(jnp.int32) + jnp.where(spread & (rank == 0), rest, 0)
    multi = can & ~busy & (params.start_nodes > 1) & (seen[-1] >= params.start_nodes)
    return jnp.where(multi[None, :], x + start, one_node)


def _log_mean(speedup: Any, x: Any, params: EvoParams) -> Any:
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
    geometric = jnp.sum(w * log_y) / jnp.maximum(w_sum, tiny)
    return jnp.where(w_sum > 0, jnp.where(p == 0, geometric, power), 0.0)


def _fitness(x: Any, params: EvoParams) -> Any:
    """log M_p of one placement int[N, J] (float32), -inf if it is infeasible."""
    import jax.numpy as jnp

    a1, r1 = params.table.shape[1:3]
    x = x.astype(jnp.int32)
    nodes = jnp.sum(x > 0, axis=0)
    reps = jnp.sum(x, axis=0)
    speedup = _lookup(params, nodes, reps)[:, SPEEDUP]
    valid = (nodes < a1) & (reps < r1) & (speedup >= 0)
    # Seeds are scored unrepaired, so check every rule (children are scored
    # from their repair, in step).
    multi = (x > 0) & (nodes > 1)[None, :]
    feasible = jnp.all(jnp.sum(x, axis=1) <= params.capacity) & jnp.all(x >= 0)
    feasible &= ~params.interference | jnp.all(jnp.sum(multi, axis=1) <= 1)
    log_mean = _log_mean(speedup, x, params)
    return jnp.where(jnp.all(valid) & feasible, log_mean, -jnp.inf)


def score(population: Any, params: EvoParams) -> Any:
    """Fitness float32[P] of a population int[P, N, J]: log power mean, -inf if infeasible."""
    jax = _jax()
    return jax.vmap(_fitness, in_axes=(0, None))(population, params)


def _mix32(x: Any) -> Any:
    """The lowbias32 hash of uint32 (see ``MIX_MULTIPLIERS``): a bijection whose
    every output bit depends on every input bit."""
    x = x ^ (x >> 16)
    x = x * np.uint32(MIX_MULTIPLIERS[0])
    x = x ^ (x >> 15)
    x = x * np.uint32(MIX_MULTIPLIERS[1])
    return x ^ (x >> 16)


class Draws(NamedTuple):
    """The random numbers of one generation (:func:`draws`)."""

    job: Any  # float32[P, DRAWS_PER_JOB, J]: uniforms per child and job
    individual: Any  # float32[P, DRAWS_PER_INDIVIDUAL]: tournament, crossover, shift
    rank: Any  # int32[J]: the generation's job ranking (a random permutation)


def draws(key: Any, size: int, n_jobs: int) -> Draws:
    """All random numbers of one generation, from one threefry draw of ``(size + 1) x 4`` words.

    Threefry costs about 10 ns per 32-bit word on CPU, a large share of a
    generation if every random number came from it.  So it gives each child
    (and row ``size``: the ranking) one base word and three more words, and a
    counter-based stream derives the rest: word ``c`` of a row is
    :func:`_mix32` of ``base + c * MIX_INCREMENT`` (as in splitmix).  Each
    word gives two 16-bit uniforms.
    """
    jax = _jax()
    import jax.numpy as jnp

    words_per_individual = -(-DRAWS_PER_INDIVIDUAL // 2)
    per_job = -(-DRAWS_PER_JOB // 2)
    bits = jax.random.bits(key, (size + 1, 1 + words_per_individual), jnp.uint32)
    counter = np.arange(1, per_job * n_jobs + 1, dtype=np.uint32) * np.uint32(MIX_INCREMENT)
    words = _mix32(bits[:, :1] + counter[None, :])  # [P + 1, per_job * J]
    job_words = words[:size].reshape(size, per_job, n_jobs)
    job_halves = jnp.concatenate([job_words & UINT16_MASK, job_words >> 16], axis=1)
    tail = bits[:size, 1:]
    halves = jnp.concatenate([tail & UINT16_MASK, tail >> 16], axis=1)
    scale = np.float32(1.0 / (UINT16_MASK + 1))
    order = jnp.argsort(words[size, :n_jobs])
    return Draws(
        job=job_halves[:, :DRAWS_PER_JOB].astype(jnp.float32) * scale,
        individual=halves[:, :DRAWS_PER_INDIVIDUAL].astype(jnp.float32) * scale,
        rank=jnp.argsort(order).astype(jnp.int32),
    )


def init(seeds: Any, params: EvoParams, config: EvoConfig) -> EvoState:
    """Initial state: copies of the seeds int32[S, N, J] (the current placement, an incumbent).

    The seeds are not repaired here (an infeasible one scores -inf and loses
    its place to its repaired offspring in the first generation), so a run
    compiles the mutation and repair operators only once, in :func:`step`.
    """
    import jax.numpy as jnp

    size = config.population_size
    population = seeds[jnp.arange(size) % seeds.shape[0]]
    return EvoState(population, score(population, params), jnp.zeros((), jnp.int32))


def _fence(x: Any, params: EvoParams) -> Any:
    """``x``, computed once and stored before any of its consumers runs.

    XLA fuses cheap elementwise producers into each of their consumers, so
    every consumer of a stage's output (the next stage's node counts, loads,
    priority sums, ...) would recompute the whole chain of earlier stages; on
    CPU that made a generation about 1.5x slower.  A conditional is a fusion
    boundary: its predicate ``num_jobs >= 0`` is always true but unknown to
    the compiler, and the other branch never runs.  (XLA's CPU pipeline drops
    ``lax.optimization_barrier`` before fusion, so that does not help.)
    """
    jax = _jax()
    import jax.numpy as jnp

    return jax.lax.cond(params.num_jobs >= 0, lambda v: v, jnp.zeros_like, x)


def _breed(key: Any, state: EvoState, params: EvoParams, config: EvoConfig) -> tuple[Any, Any]:
    """Children int32[P, N, J] and their fitness float32[P] (see :func:`ask`)."""
    jax = _jax()
    import jax.numpy as jnp

    pop, fit = state.population, state.fitness
    size, n_jobs = pop.shape[0], pop.shape[2]
    d = draws(key, size, n_jobs)
    contenders = (d.individual[:, :CONTENDERS].T.reshape(2, 2, size) * size).astype(jnp.int32)
    first, second = contenders[:, 0], contenders[:, 1]
    parents = jnp.where(fit[first] >= fit[second], first, second)  # [2, P] binary tournaments
    cross = d.individual[:, CROSS] < config.crossover_probability
    from_b = (d.job[:, MIX] < 0.5) & cross[:, None]
    x = jnp.where(from_b[:, None, :], pop[parents[1]], pop[parents[0]])
    shift = (d.individual[:, SHIFT] * n_jobs).astype(jnp.int32)
    per_child = functools.partial(jax.vmap, in_axes=(0, 0, None, None))
    per_shift = functools.partial(jax.vmap, in_axes=(0, None, 0, None))
    x = _fence(per_child(mutate)(d.job, x, params, config), params)
    # Interference is left to the final repair: settling it here too was no
    # better, at 5 % more time.
    capacity = functools.partial(_capacity, interference=False)
    x = _fence(per_shift(capacity)(x, d.rank, shift, params), params)
    x = _fence(per_child(grow)(d.job, x, params, config), params)
    x, speedup = per_shift(_repair)(x, d.rank, shift, params)
    x = _fence(x, params)
    return x, jax.vmap(_log_mean, in_axes=(0, 0, None))(speedup, x, params)


def ask(key: Any, state: EvoState, params: EvoParams, config: EvoConfig) -> Any:
    """Children int32[P, N, J]: tournament, crossover over jobs, mutation, repair.

    Each child takes each job whole from one of two tournament winners (with
    probability ``crossover_probability``, else all from the first), then
    :func:`mutate`; the clip and capacity steps of :func:`repair`;
    :func:`grow`, which so fills the capacity that step freed and restarts
    the jobs it dropped; and a full :func:`repair`.  (A full repair before
    growing too was no better, at 20 % more time; no repair before growing
    costs a third less time, but the children that crossover left in
    conflict then mostly lose their jobs, and the mean gap to the optimum of
    16 x 4-CPU clusters with 40 jobs grew from about 1 % to about 2 %.)
    """
    return _breed(key, state, params, config)[0]


def tell(state: EvoState, children: Any, fitness: Any) -> EvoState:
    """(mu + lambda) elitism: keep the best P of parents and children."""
    jax = _jax()
    import jax.numpy as jnp

    pool = jnp.concatenate([state.population, children])
    pool_fit = jnp.concatenate([state.fitness, fitness])
    best_fit, idx = jax.lax.top_k(pool_fit, state.population.shape[0])
    return EvoState(pool[idx], best_fit, state.generation + 1)


def step(key: Any, state: EvoState, params: EvoParams, config: EvoConfig) -> EvoState:
    """One generation, ask + score + tell, with the key ``fold_in(key, state.generation)``.

    The children's fitness comes from their last repair (equal to
    :func:`score` of the children, without a second pass over them).
    """
    jax = _jax()

    gen_key = jax.random.fold_in(key, state.generation)
    children, fitness = _breed(gen_key, state, params, config)
    return tell(state, children, fitness)


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
    check_problem(problem)
    population_size = _check_int("population_size", population_size, 2)
    generations = _check_int("generations", generations, 0)
    seed = _check_int("seed", seed, 0)
    check_time_limit(time_limit)
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
    candidates = [x[:n, :j].T.astype(np.int64) for x in best_found]
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
            "padded_shape": (int(seeds.shape[2]), int(seeds.shape[1])),  # (J, N)
        },
    )
