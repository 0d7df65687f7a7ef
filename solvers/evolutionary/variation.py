"""Variation of allocation genomes: mutate and grow, and the genome the search breeds.

:class:`AllocationGenome` is the :class:`~solvers.evolutionary.search.Genome`
of the allocation problem.  After the search's tournament and crossover over
jobs, each child goes through

- :func:`mutate`: reset a job to its current placement (so that "do not
  move" stays reachable: moving a running job costs its restart factor) and
  zero one occupied entry of a job,
- the clip and capacity steps of :func:`~solvers.evolutionary.repair.repair`,
- :func:`grow`: randomly increase entries where capacity is free (idle jobs
  always try, so that jobs a repair dropped restart at once),
- a full :func:`~solvers.evolutionary.repair.repair`,

and its fitness is taken from that last repair, which reads each job's
speedup off the table anyway.  Each stage's output is stored once
(:func:`_fence`) so that XLA does not recompute earlier stages inside later
ones.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

from .encoding import PaddedProblem, log_mean, score
from .repair import cumsum_nodes, fit_capacity, repair_with_speedup
from .search import SEARCH_INDIVIDUAL_DRAWS, Draws, import_jax

__all__ = ["AllocationGenome", "first_from", "grow", "mutate"]

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
#: Rows of ``Draws.gene``, the uniforms per child and job, that the genome
#: reads: :func:`mutate` uses RESET, ZERO_NODE, ZERO; :func:`grow` OWN,
#: GROW_NODE, AMOUNT, GROW (the search's crossover row follows them).
RESET, ZERO_NODE, ZERO, OWN, GROW_NODE, AMOUNT, GROW = range(7)
GENE_DRAWS = 7
#: Column of ``Draws.individual`` with the rotation of the repair priority
#: (after the search's tournament and crossover columns).
SHIFT = SEARCH_INDIVIDUAL_DRAWS
INDIVIDUAL_DRAWS = 1


@dataclasses.dataclass(frozen=True)
class AllocationGenome:
    """The allocation problem's genome: mutation rates and the breeding of one child (hashable, jit-static).

    Rates are expected counts of jobs per child; the per-job probability is the
    count divided by the number of (unpadded) jobs, capped at 1.
    ``matmul_priority``: the repair's priority sums may use the float32 matmul
    (exact only while jobs x capacity stays below
    :data:`~solvers.evolutionary.repair.FLOAT32_EXACT`; the solver turns it off above).
    """

    reset_jobs: float = RESET_JOBS
    zero_jobs: float = ZERO_JOBS
    increase_jobs: float = INCREASE_JOBS
    own_node_probability: float = OWN_NODE_PROBABILITY
    matmul_priority: bool = True
    gene_draws: ClassVar[int] = GENE_DRAWS
    individual_draws: ClassVar[int] = INDIVIDUAL_DRAWS

    def score(self, population: Any, params: PaddedProblem) -> Any:
        """Fitness float32[P] of placements int[P, N, J] (:func:`solvers.evolutionary.encoding.score`)."""
        return score(population, params)

    def vary(self, d: Draws, x: Any, params: PaddedProblem) -> tuple[Any, Any]:
        """Children int32[P, N, J] and their fitness float32[P] from crossed-over ones.

        :func:`mutate`; the clip and capacity steps of repair; :func:`grow`,
        which so fills the capacity that step freed and restarts the jobs it
        dropped; and a full repair.  (A full repair before growing too was no
        better, at 20 % more time; no repair before growing costs a third
        less time, but the children that crossover left in conflict then
        mostly lose their jobs, and the mean gap to the optimum of 16 x 4-CPU
        clusters with 40 jobs grew from about 1 % to about 2 %.)
        """
        jax = import_jax()
        import jax.numpy as jnp

        n_jobs = x.shape[2]
        shift = (d.individual[:, SHIFT] * n_jobs).astype(jnp.int32)
        per_child = functools.partial(jax.vmap, in_axes=(0, 0, None, None))
        per_shift = functools.partial(jax.vmap, in_axes=(0, None, 0, None))
        x = _fence(per_child(mutate)(d.gene, x, params, self), params)
        # Interference is left to the final repair: settling it here too was no
        # better, at 5 % more time.
        capacity = functools.partial(fit_capacity, interference=False, matmul=self.matmul_priority)
        x = _fence(per_shift(capacity)(x, d.rank, shift, params), params)
        x = _fence(per_child(grow)(d.gene, x, params, self), params)
        repaired = functools.partial(repair_with_speedup, matmul=self.matmul_priority)
        x, speedup = per_shift(repaired)(x, d.rank, shift, params)
        x = _fence(x, params)
        return x, jax.vmap(log_mean, in_axes=(0, 0, None))(speedup, x, params)


def _fence(x: Any, params: PaddedProblem) -> Any:
    """``x``, computed once and stored before any of its consumers runs.

    XLA fuses cheap elementwise producers into each of their consumers, so
    every consumer of a stage's output (the next stage's node counts, loads,
    priority sums, ...) would recompute the whole chain of earlier stages; on
    CPU that made a generation about 1.5x slower.  A conditional is a fusion
    boundary: its predicate ``num_jobs >= 0`` is always true but unknown to
    the compiler, and the other branch never runs.  (XLA's CPU pipeline drops
    ``lax.optimization_barrier`` before fusion, so that does not help.)
    """
    jax = import_jax()
    import jax.numpy as jnp

    return jax.lax.cond(params.num_jobs >= 0, lambda v: v, jnp.zeros_like, x)


def first_from(mask: Any, offset: Any) -> tuple[Any, Any]:
    """Per job of bool[N, J]: the first True node at or after ``offset[j]`` (cyclic).

    Returns (node int32[J], whether the job has any True).  With a random
    offset in ``[0, N)`` this is a cheap random pick that needs one random
    number per job: the cyclic distances from the offset are distinct, so one
    plain minimum over them finds the node.
    """
    jax = import_jax()
    import jax.numpy as jnp

    n = mask.shape[0]
    rows = jnp.arange(n, dtype=jnp.int32)[:, None]
    ahead = rows - offset[None, :]  # in (-n, n): a compare is cheaper than a remainder
    distance = jnp.min(jnp.where(mask, jnp.where(ahead < 0, ahead + n, ahead), n), axis=0)
    return jax.lax.rem(offset + distance, n), distance < n


def mutate(u: Any, x: Any, params: PaddedProblem, genome: AllocationGenome) -> Any:
    """Mutate one placement int32[N, J]: reset jobs to the current placement, zero entries.

    ``u`` float32[GENE_DRAWS + 1, J] are its rows of ``Draws.gene`` (it reads
    ``RESET``, ``ZERO_NODE``, ``ZERO``).  The result may be infeasible;
    :func:`~solvers.evolutionary.repair.repair` follows.
    """
    import jax.numpy as jnp

    n_nodes = x.shape[0]
    rows = jnp.arange(n_nodes, dtype=jnp.int32)[:, None]
    jobs = jnp.maximum(params.num_jobs, 1).astype(jnp.float32)
    reset = u[RESET] < jnp.minimum(genome.reset_jobs / jobs, 1.0)
    x = jnp.where(reset[None, :], params.current, x)
    node, has = first_from(x > 0, (u[ZERO_NODE] * n_nodes).astype(jnp.int32))
    hit = (u[ZERO] < jnp.minimum(genome.zero_jobs / jobs, 1.0)) & has
    return jnp.where(rows == jnp.where(hit, node, -1)[None, :], 0, x)


def grow(u: Any, x: Any, params: PaddedProblem, genome: AllocationGenome) -> Any:
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
    :func:`~solvers.evolutionary.repair.repair` follows.  ``u``
    float32[GENE_DRAWS + 1, J] are its rows of ``Draws.gene`` (it reads
    ``OWN``, ``GROW_NODE``, ``AMOUNT``, ``GROW``).
    """
    jax = import_jax()
    import jax.numpy as jnp

    n_nodes = x.shape[0]
    rows = jnp.arange(n_nodes, dtype=jnp.int32)[:, None]
    jobs = jnp.maximum(params.num_jobs, 1).astype(jnp.float32)
    free = params.capacity - jnp.sum(x, axis=1)
    busy = jnp.any(x > 0, axis=0)
    offset = (u[GROW_NODE] * n_nodes).astype(jnp.int32)
    own = (u[OWN] < genome.own_node_probability) & busy
    mask = (free[:, None] > 0) & (~own[None, :] | (x > 0))
    node, has = first_from(mask, offset)
    room = free[node]
    low = jnp.where(busy, 1, jnp.minimum(params.start_replicas, room))
    amount = low + (u[AMOUNT] * jnp.maximum(room - low + 1, 0)).astype(jnp.int32)
    can = params.start_nodes > 0
    wants = can & (~busy | (u[GROW] < jnp.minimum(genome.increase_jobs / jobs, 1.0)))
    at = jnp.where(wants & has, node, -1)
    one_node = x + jnp.where(rows == at[None, :], amount[None, :], 0)
    # Most problems have no job that only runs across nodes: skip their starts.
    return jax.lax.cond(
        jnp.any(params.start_nodes > 1), _multi_node_starts, lambda *args: args[-1], x, free, offset, params, one_node
    )


def _multi_node_starts(x: Any, free: Any, offset: Any, params: PaddedProblem, one_node: Any) -> Any:
    """:func:`grow`'s result where idle jobs that only run across nodes start on
    ``start_nodes`` free nodes from ``offset`` (cyclic), else ``one_node``."""
    import jax.numpy as jnp

    n_nodes = x.shape[0]
    rows = jnp.arange(n_nodes, dtype=jnp.int32)[:, None]
    busy = jnp.any(x > 0, axis=0)
    can = params.start_nodes > 0
    # Rank of each free node in cyclic order from the offset.
    is_free = (free > 0).astype(jnp.int32)
    seen = cumsum_nodes(is_free)  # free nodes among 0..n
    before = jnp.where(offset > 0, seen[jnp.maximum(offset - 1, 0)], 0)[None, :]
    rank = jnp.where(
        rows >= offset[None, :], seen[:, None] - 1 - before, seen[-1] - before + seen[:, None] - 1
    )
    spread = (is_free[:, None] > 0) & (rank < params.start_nodes[None, :])
    rest = (params.start_replicas - params.start_nodes)[None, :]
    start = spread.astype(jnp.int32) + jnp.where(spread & (rank == 0), rest, 0)
    multi = can & ~busy & (params.start_nodes > 1) & (seen[-1] >= params.start_nodes)
    return jnp.where(multi[None, :], x + start, one_node)
