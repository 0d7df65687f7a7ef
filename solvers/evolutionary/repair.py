"""Repair: make any non-negative integer placement feasible by only ever removing replicas.

:func:`repair` works on one placement int[N, J] (node-major, see
:mod:`solvers.evolutionary.encoding`) in an order that keeps each fixed
constraint fixed:

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
"""

from __future__ import annotations

from typing import Any

from .encoding import BEST_REPLICAS, BEST_VALUE, SPEEDUP, PaddedProblem, lookup
from .search import import_jax

__all__ = ["FLOAT32_EXACT", "cumsum_nodes", "fit_capacity", "repair", "repair_with_speedup"]

#: Up to this many (padded) jobs the priority prefix sums of :func:`repair`
#: are a matmul with a J x J matrix (O(J^2) per node, no data movement); above
#: it the jobs are gathered into priority order for an O(J log J) associative
#: scan.  On the 2-core machine the matmul was 2x faster at 104 jobs and 1.7x
#: at 200 (64 nodes).
MATMUL_PRIORITY_MAX = 512
#: float32 represents every integer up to this exactly, so the matmul priority
#: sums are exact while (padded jobs) x (largest capacity) stays below it;
#: above, the solver turns the matmul off (``AllocationGenome.matmul_priority``).
FLOAT32_EXACT = 2**24
#: Up to this many (padded) nodes, cumulative sums over nodes are an unrolled
#: chain of adds (XLA fuses it into one vectorized loop); above, an associative scan.
UNROLLED_CUMSUM_MAX = 64


def cumsum_nodes(x: Any) -> Any:
    """Inclusive cumulative sum of int[N, ...] over nodes (axis 0).

    Up to ``UNROLLED_CUMSUM_MAX`` nodes an unrolled chain of adds of whole
    rows, which XLA fuses into one loop along the rows (alone, 2x faster on
    CPU than a triangular matmul and 7x faster than XLA's cumsum); above that
    an associative scan (a long unrolled chain would take long to compile).
    """
    jax = import_jax()
    import jax.numpy as jnp

    if x.shape[0] > UNROLLED_CUMSUM_MAX:
        return jax.lax.associative_scan(jnp.add, x, axis=0)
    sums = [x[0]]
    for row in range(1, x.shape[0]):
        sums.append(sums[-1] + x[row])
    return jnp.stack(sums)


def _remove_excess(x: Any, target: Any) -> Any:
    """Lower each job of int32[N, J] to ``target[j]`` replicas, keeping >= 1 per used node.

    Replicas go from the lowest-numbered nodes first; ``target`` must lie in
    ``[nodes_j, sum_j]``.
    """
    import jax.numpy as jnp

    budget = jnp.maximum(x - 1, 0)
    excess = jnp.sum(x, axis=0) - target
    before = cumsum_nodes(budget) - budget
    return x - jnp.clip(excess[None, :] - before, 0, budget)


def _project(x: Any, params: PaddedProblem) -> tuple[Any, Any]:
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
    jax = import_jax()
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

    here = lookup(params, nodes, reps)
    ok = (nodes < a1) & (reps < r1) & (here[:, SPEEDUP] >= 0)
    one = lookup(params, jnp.ones_like(nodes), high)
    fewer = lookup(params, nodes - 1, reps - low)
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


def _before(xc: Any, rank: Any, shift: Any, matmul: bool = True) -> Any:
    """int32[N, J]: replicas that jobs of higher priority hold on each node.

    Job ``j``'s priority is ``(rank[j] - shift) mod J`` (0 first): the ranking
    ``rank`` (a permutation) rotated by ``shift``.  With ``S`` the sums over
    the jobs ranked before ``j`` (one matmul), those of higher priority are
    ``S - head`` if ``rank[j] >= shift``, else ``S + total - head``, where
    ``head`` holds the jobs ranked before ``shift``: so one ranking shared by
    the whole population (one matrix) serves every rotation.  ``matmul``
    (static) false forces the scan, whose int32 sums stay exact beyond
    ``FLOAT32_EXACT``.
    """
    jax = import_jax()
    import jax.numpy as jnp

    n_jobs = xc.shape[1]
    wrapped = rank < shift
    head = jnp.sum(jnp.where(wrapped[None, :], xc, 0), axis=1)
    total = jnp.sum(xc, axis=1)
    if matmul and n_jobs <= MATMUL_PRIORITY_MAX:
        earlier = (rank[:, None] < rank[None, :]).astype(jnp.float32)  # [k, j]: k ranks before j
        # Exact: 0/1 weights, integer sums <= J x capacity < FLOAT32_EXACT (checked by the solver).
        ranked_before = jnp.round(xc.astype(jnp.float32) @ earlier).astype(jnp.int32)
    else:
        order = jnp.argsort(rank)  # the jobs in rank order; ranked[:, rank] undoes it
        ranked = xc[:, order]
        ranked_before = (jax.lax.associative_scan(jnp.add, ranked, axis=1) - ranked)[:, rank]
    return ranked_before - head[:, None] + jnp.where(wrapped[None, :], total[:, None], 0)


def fit_capacity(
    x: Any, rank: Any, shift: Any, params: PaddedProblem, *, interference: bool = True, matmul: bool = True
) -> Any:
    """Steps 1-3 of :func:`repair` on int[N, J]: clip, capacity, and interference
    avoidance unless ``interference`` (static) is false (``matmul``: see :func:`_before`)."""
    import jax.numpy as jnp

    n_jobs = x.shape[1]
    cap = params.capacity[:, None]
    xc = jnp.clip(x.astype(jnp.int32), 0, cap)
    used = xc > 0
    multi = used & (jnp.sum(used, axis=0) > 1)[None, :]
    # Capacity: a job keeps on each node what the higher-priority jobs left free.
    xp = jnp.clip(cap - _before(xc, rank, shift, matmul), 0, xc)
    # Interference: only the first multi-node job in priority order stays on a
    # node (which jobs span several nodes is decided before the capacity step).
    if not interference:
        return xp
    priority = (rank - shift) % n_jobs
    first = jnp.min(jnp.where(multi, priority[None, :], n_jobs), axis=1)
    return jnp.where(params.interference & multi & (priority[None, :] > first[:, None]), 0, xp)


def repair_with_speedup(
    x: Any, rank: Any, shift: Any, params: PaddedProblem, *, matmul: bool = True
) -> tuple[Any, Any]:
    """:func:`repair`, also returning the jobs' speedups float32[J] (see :func:`_project`)."""
    return _project(fit_capacity(x, rank, shift, params, matmul=matmul), params)


def repair(x: Any, rank: Any, params: PaddedProblem, shift: Any = 0) -> Any:
    """Make one placement int[N, J] feasible by removing replicas (module docstring).

    The job priority that settles capacity and interference conflicts is
    ``(rank - shift) mod J`` (0 first), for ``rank`` int32[J] a permutation
    of the jobs and ``shift`` int32[] in ``[0, J)``: the search draws one
    ranking per generation (``Draws.rank``) and
    :class:`~solvers.evolutionary.variation.AllocationGenome` one shift per child.  The interference step
    looks at which jobs span several nodes before the capacity step; that can
    only remove more, never leave a node with two multi-node jobs (a job's
    node count never grows during repair).  Returns int32[N, J].
    """
    return repair_with_speedup(x, rank, shift, params)[0]
