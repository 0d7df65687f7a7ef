"""A job's configurations on a cluster: the (nodes, replicas) pairs it may take and their speedups.

Used by :func:`pollux_opt.model.allocate.to_problem` to encode jobs, and to
decode a placement's batch configuration from the same cached evaluation.
On a typed cluster each node type gets its own pairs (on that type's nodes,
under that type's batch limits) and its speedups on the job's common base.

Which pairs: every one, or Sia's configuration set (Jayaram Subramanya et al.,
SOSP 2023): on one node, a power-of-two replica count up to the node size
(1, 2, 4, ..., and the full node); beyond one node, whole nodes only (2, 3,
... nodes of the type, all their replicas).  The artifact lists them for 4-
and 8-GPU nodes (``sia-simulator/sia.py``, ``CONFIGS_4GPU`` and
``CONFIGS_8GPU``: 1, 2, 4 then 4 per node; 1, 2, 4, 8 then 8 per node);
:func:`sia_configurations` is that rule for any node size and
:func:`typed_configurations` lists it for every type.  With ``c`` replicas
per node and ``n`` nodes that is ``floor(log2 c) + 1 (+1 if c is not a power
of two) + (n - 1)`` configurations per type instead of every pair, which
keeps Sia's integer program small.

The allocator's :attr:`~pollux_opt.model.Options.shapes` chooses between
every pair (``"all"``) and Sia's set (``"sia"``); ``"auto"``, the default, is
Sia's set on a cluster of several node types and every pair on one type.
Why Sia's set on several types: a job resized one or two replicas at a time
restarts at every step, and on a typed cluster every round also weighs a
move to another type; with Sia's set each resize is at least a doubling or a
whole node (``docs/node-types.md``, section 7; the "Heterogeneous
cluster" table of ``docs/results.md`` compares type-aware Pollux with both
sets).  The set applies to jobs with goodput models; explicit speedup tables
are used as given, as with ``spread_penalty``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import accumulate

import numpy as np

from solvers import MAX_CPUS, InvalidProblem

from pollux_opt.model.batch import BatchChoice, BatchConfig
from pollux_opt.model.cluster import Cluster
from pollux_opt.model.domains import Integer, check, shown
from pollux_opt.model.goodput import (
    DistinctAllocations,
    GoodputModel,
    SearchCache,
    distinct_allocations,
    memo_beside_search_cache,
)
from pollux_opt.model.job import Job
from pollux_opt.model.options import Options
from pollux_opt.model.typed import TypedGoodput, TypedTable

__all__ = [
    "batch_config", "candidate_pairs", "job_configs", "model_configs", "model_table", "node_replica_pairs",
    "placeable_table", "resolve_shapes", "sia_configurations", "sia_shape_mask", "table_configs", "top_sums",
    "type_model", "type_tops", "typed_configurations",
]

log = logging.getLogger(__name__)

#: Speedup tables cached across rounds: a scheduler calls allocate() every
#: interval with mostly unchanged (frozen, hashable) goodput models, and
#: evaluating a model at every (nodes, replicas) pair dominates a round's cost.
_SPEEDUP_CACHE_SIZE = 4096
#: Replica slots of a node (the solvers' bound on a node's capacity) and node counts.
_SLOTS = Integer(gt=0, le=MAX_CPUS)
_NODES = Integer(gt=0)


@memo_beside_search_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def model_table(
    model: GoodputModel,
    pairs: tuple[tuple[int, int], ...],
    base: tuple[int, int],
    fixed_batch_size: int | None,
    cache: SearchCache | None = None,
) -> tuple[dict[tuple[int, int], float], BatchChoice | None]:
    """Speedups and best batch configurations of a goodput model at the given pairs.

    Returns ``({pair: speedup}, choice)``: the speedups of the feasible
    (speedup > 0) pairs, and the model's :class:`BatchChoice` at ``pairs``
    (arrays in the order of ``pairs``; None when there are none).  The choice
    is kept so that decoding a placement (:func:`batch_config`) reuses it
    instead of optimizing again; ``GoodputModel.optimize`` treats every pair
    independently, so it equals a one-pair call.  ``cache``: the batch
    search's (:meth:`GoodputModel.optimize`), kept by the caller across rounds.
    """
    if not pairs:
        return {}, None
    choice = model.optimize_distinct(_allocations(pairs, base), fixed_batch_size=fixed_batch_size, cache=cache)
    if not choice.feasible[-1]:
        nn, kk = zip(*pairs, base)
        model.speedup(nn, kk, base=base, fixed_batch_size=fixed_batch_size)  # raises its clear error
    spd, keep = _feasible_speedups(choice)
    table = dict(zip([pairs[i] for i in keep], spd[keep].tolist()))
    return table, choice


def _feasible_speedups(choice: BatchChoice) -> tuple[np.ndarray, np.ndarray]:
    """(float64[P] speedups over the base, int64 positions of those > 0) of a choice at pairs then base."""
    spd = choice.goodput[:-1] / choice.goodput[-1]
    return spd, np.flatnonzero(spd > 0)


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _allocations(pairs: tuple[tuple[int, int], ...], base: tuple[int, int]) -> DistinctAllocations:
    """The distinct allocations of ``pairs`` then ``base`` (read-only arrays), cached: they
    depend on the pairs only, and a scheduler asks for the same few pair lists every round.
    The base goes last (one vectorised search instead of two)."""
    found = distinct_allocations([p[0] for p in pairs] + [base[0]], [p[1] for p in pairs] + [base[1]])
    for a in found[:3]:
        a.flags.writeable = False
    return found


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _pair_index(pairs: tuple[tuple[int, int], ...]) -> dict[tuple[int, int], int]:
    """{pair: position in pairs}; a scheduler uses few distinct pair lists, so this is shared."""
    return {p: i for i, p in enumerate(pairs)}


def batch_config(model: GoodputModel, pairs: tuple[tuple[int, int], ...], base: tuple[int, int],
                  fixed_batch_size: int | None, pair: tuple[int, int],
                  cache: SearchCache | None = None) -> BatchConfig | None:
    """The cached best configuration of ``model`` at ``pair`` (None if not a feasible cached pair)."""
    if not pairs:
        return None
    table, choice = model_table(model, pairs, base, fixed_batch_size, cache)
    if pair not in table:
        return None
    return choice.config(_pair_index(pairs)[pair])


def top_sums(cluster: Cluster) -> tuple[int, ...]:
    """``top[n - 1]``: the capacity of the cluster's ``n`` largest nodes together."""
    return tuple(accumulate(sorted((n.cpus for n in cluster.nodes), reverse=True)))


def _replica_range(job: Job, top: tuple[int, ...], max_nodes: int, model: GoodputModel | None = None
                   ) -> tuple[int, int, int]:
    """``(lo, hi, nodes)``: the replica counts and the node count a job may take
    (``top`` from :func:`top_sums`).

    The upper end is what the job can use, never a node's size: its
    ``max_replicas``, the cluster's largest ``nodes`` nodes together, and for
    a goodput model the largest replica count with a batch: choosing its own
    batch size, ``max_batch_size // min_local_bsz`` (beyond it every
    configuration is infeasible); at a fixed batch size B, B replicas (beyond,
    a replica would hold no sample of the batch).  ``model``: the goodput
    model whose limits apply (default: the job's own, if it is one).
    """
    nodes = min(max_nodes, len(top))
    hi = min(job.max_replicas, top[nodes - 1])
    model = job.speedup if model is None and isinstance(job.speedup, GoodputModel) else model
    if model is not None:
        limits = model.limits
        usable = limits.max_batch_size // limits.min_local_bsz if job.fixed_batch_size is None else job.fixed_batch_size
        hi = min(hi, usable)
    return max(job.min_replicas, 1), hi, min(nodes, max(hi, 0))


def candidate_pairs(job: Job, top: tuple[int, ...], max_nodes: int, model: GoodputModel | None = None, *,
                     sia: bool = False, held: tuple[int, int] | None = None) -> tuple[tuple[int, int], ...]:
    """(num_nodes, num_replicas) pairs a goodput-model job may take on this cluster and options.

    A pair needs ``num_nodes <= min(max_nodes, #nodes)``, replicas within the
    job's usable range (:func:`_replica_range`), and replicas that fit on the
    ``num_nodes`` largest nodes; with ``sia``, it must also be one of Sia's
    configurations or ``held``, the job's current (nodes, replicas) on these
    nodes (:func:`_sia_pairs`).
    """
    lo, hi, nodes = _replica_range(job, top, max_nodes, model)
    pairs = node_replica_pairs(lo, hi, top[:nodes])
    return _sia_pairs(pairs, top, held) if sia else pairs


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _sia_pairs(pairs: tuple[tuple[int, int], ...], top: tuple[int, ...], held: tuple[int, int] | None
               ) -> tuple[tuple[int, int], ...]:
    """``pairs`` reduced to Sia's configurations on nodes of capacity sums ``top`` and
    ``held`` (:func:`sia_shape_mask`), cached: the goodput
    is then evaluated at those pairs only."""
    if not pairs:
        return pairs
    keep = sia_shape_mask(*_pair_arrays(pairs), top, held).tolist()
    return tuple(p for p, ok in zip(pairs, keep) if ok)


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def node_replica_pairs(lo: int, hi: int, top: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """Every ``(nodes, replicas)`` pair with ``lo <= replicas <= hi`` that the ``nodes``
    largest nodes hold (``top``: :func:`top_sums`), in (nodes, replicas) order, cached:
    a scheduler asks for the same few ranges every round."""
    return tuple((n, k) for n in range(1, len(top) + 1) for k in range(max(n, lo), min(hi, top[n - 1]) + 1))


def placeable_table(job: Job, top: tuple[int, ...], max_nodes: int, table=None) -> dict[tuple[int, int], float]:
    """The pairs of an explicit speedup table (default: the job's own) the job may take
    (as :func:`candidate_pairs` enumerates them), found by checking the table's own
    pairs: the cost grows with the table, not with the cluster."""
    lo, hi, nodes = _replica_range(job, top, max_nodes)
    table = job.speedup if table is None else table
    return {
        (nn, k): s for (nn, k), s in table.items() if nn <= nodes and max(nn, lo) <= k <= min(hi, top[nn - 1])
    }


def table_configs(table: dict[tuple[int, int], float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nodes int64[C], replicas int64[C], speedup float64[C]) of a speedup table, in (nodes, replicas) order."""
    items = sorted(table.items())
    return (
        np.array([nn for (nn, _), _ in items], dtype=np.int64),
        np.array([k for (_, k), _ in items], dtype=np.int64),
        np.array([float(s) for _, s in items], dtype=np.float64),
    )


@memo_beside_search_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def model_configs(
    model: GoodputModel,
    pairs: tuple[tuple[int, int], ...],
    base: tuple[int, int],
    fixed_batch_size: int | None,
    spread_penalty: float,
    cache: SearchCache | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nodes int64[C], replicas int64[C], speedup float64[C]) of a goodput model's feasible pairs
    (read-only arrays), cached: a scheduler's rounds encode mostly unchanged models.

    ``pairs`` come from :func:`candidate_pairs`, in (nodes, replicas) order,
    as :func:`table_configs` orders a table.  Each speedup is discounted by
    ``1 - spread_penalty (N - 1)``: among spreads a goodput model cannot tell
    apart, fewer nodes win."""
    if pairs:
        nn, kk = _pair_arrays(pairs)
        spd, keep = _feasible_speedups(model_table(model, pairs, base, fixed_batch_size, cache)[1])
        nodes = nn[keep]
        configs = (nodes, kk[keep], spd[keep] * (1.0 - spread_penalty * (nodes - 1)))
    else:
        configs = table_configs({})
    for a in configs:
        a.flags.writeable = False
    return configs


@lru_cache(maxsize=_SPEEDUP_CACHE_SIZE)
def _pair_arrays(pairs: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, np.ndarray]:
    """(nodes int64[C], replicas int64[C]) of ``pairs`` (read-only)."""
    nn = np.array([n for n, _ in pairs], dtype=np.int64)
    kk = np.array([k for _, k in pairs], dtype=np.int64)
    nn.flags.writeable = kk.flags.writeable = False
    return nn, kk


def type_tops(cluster: Cluster) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``((type, top), ...)``: :func:`top_sums` of each node type's nodes, in type order."""
    return tuple((t, top_sums(Cluster(cluster.of_type(t)))) for t in cluster.types)


def type_model(job: Job, type_name: str) -> tuple[GoodputModel | None, tuple[int, int]]:
    """The goodput model of ``job`` on ``type_name`` and its base there (None: a table, or no model there)."""
    if isinstance(job.speedup, TypedGoodput):
        model = job.speedup.model(type_name)
        return model, (job.speedup.base(type_name) if model is not None else job.base)
    return (job.speedup if isinstance(job.speedup, GoodputModel) else None), job.base


def _type_ratio(job: Job, model: GoodputModel, pairs, base, types: tuple[str, ...],
                cache: SearchCache | None = None) -> float | None:
    """A typed job's goodput at its base on one type over its speedup base
    (:meth:`TypedGoodput.base_goodput`): the factor that puts the type's
    speedups on the common base; None where the type's base is infeasible."""
    if not isinstance(job.speedup, TypedGoodput):
        return 1.0
    choice = model_table(model, pairs, base, job.fixed_batch_size, cache)[1] if pairs else None
    if choice is None or not choice.feasible[-1]:
        return None
    ref = float(choice.goodput[-1])
    common = job.speedup.base_goodput(job.fixed_batch_size, tuple(t for t in types if t in job.speedup.types))
    return ref / common


def job_configs(job: Job, tops, options: Options, cache: SearchCache | None = None, *, sia: bool = False,
                 current: tuple[str, int, int] | None = None
                 ) -> list[tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """``[(type index, (nodes, replicas, speedups)), ...]``: the job's configurations on each node type
    (``cache``: as in :func:`model_table`; ``sia`` and ``current``, the job's
    (type, nodes, replicas): as ``sia`` and ``held`` in :func:`candidate_pairs`)."""
    out = []
    types = tuple(t for t, _ in tops)
    for i, (t, top) in enumerate(tops):
        model, base = type_model(job, t)
        if isinstance(job.speedup, TypedTable):
            table = job.speedup.table(t)
            if table is not None:
                out.append((i, table_configs(placeable_table(job, top, options.max_nodes_per_job, table))))
            continue
        if model is None and isinstance(job.speedup, TypedGoodput):
            continue  # no model on this type: the job does not run there
        if model is None:
            out.append((i, table_configs(placeable_table(job, top, options.max_nodes_per_job))))
            continue
        held = current[1:] if current is not None and current[0] == t else None
        pairs = candidate_pairs(job, top, options.max_nodes_per_job, model, sia=sia, held=held)
        ratio = _type_ratio(job, model, pairs, base, types, cache) if pairs else 1.0
        if ratio is None:
            log.debug("job %s: no feasible base on type %s; the type is left out", job.id, t)
            continue
        nodes, reps, spd = model_configs(model, pairs, base, job.fixed_batch_size, options.spread_penalty, cache)
        if isinstance(job.speedup, TypedGoodput):
            ratio *= job.speedup.factor(t)
        out.append((i, (nodes, reps, spd if ratio == 1.0 else spd * ratio)))
    return out


def sia_configurations(replicas_per_node: int, num_nodes: int) -> tuple[tuple[int, int], ...]:
    """Sia's ``(nodes, replicas)`` configurations of one node type, smallest first.

    One node: 1, 2, 4, ... (powers of two below ``replicas_per_node``) and
    ``replicas_per_node`` itself; then ``(n, n * replicas_per_node)`` for
    n = 2 .. ``num_nodes``.

    Raises:
        InvalidProblem: a count that is not a positive integer.
    """
    c = check("replicas_per_node", replicas_per_node, _SLOTS)
    n = check("num_nodes", num_nodes, _NODES)
    one = []
    k = 1
    while k < c:
        one.append((1, k))
        k *= 2
    one.append((1, c))
    return tuple(one) + tuple((m, m * c) for m in range(2, n + 1))


def resolve_shapes(shapes: str, typed: bool) -> str:
    """``"all"`` or ``"sia"``: the option's value, with ``"auto"`` resolved for a
    cluster that is ``typed`` (several node types) or not."""
    if shapes == "auto":
        return "sia" if typed else "all"
    return shapes


def sia_shape_mask(nodes: np.ndarray, replicas: np.ndarray, top: tuple[int, ...],
                   current: tuple[int, int] | None = None) -> np.ndarray:
    """bool[C]: which of the configurations ``(nodes[c], replicas[c])`` of one node
    type are Sia's (:func:`sia_configurations`), or the job's ``current``
    (nodes, replicas) on that type (a running job may always stay as it is).

    ``top`` is the type's :func:`top_sums`; the
    node size is its largest node's (as Sia's policy reads it), so on a type
    of unequal nodes a multi-node configuration needs that many nodes of the
    largest size.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    replicas = np.asarray(replicas, dtype=np.int64)
    mask = np.zeros(nodes.shape, dtype=bool)
    for n, k in sia_configurations(int(top[0]), len(top)) + ((current,) if current is not None else ()):
        mask |= (nodes == n) & (replicas == k)
    return mask


def typed_configurations(types: Mapping[str, tuple[int, int]]) -> tuple[tuple[str, int, int], ...]:
    """``(type, nodes, replicas)`` of every type, in the mapping's order.

    Args:
        types: ``{type: (num_nodes, replicas_per_node)}``, e.g. from
            :class:`pollux_opt.model.cluster_types.ClusterTypes` (count, replicas_per_node).

    Raises:
        InvalidProblem: no types, or a bad count (naming the type).
    """
    if not types:
        raise InvalidProblem("types must name at least one node type, got {}")
    out = []
    for name, shape in types.items():
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or len(shape) != 2:
            raise InvalidProblem(f"types[{name!r}] must be (num_nodes, replicas_per_node), got {shown(shape)}")
        try:
            configs = sia_configurations(shape[1], shape[0])
        except InvalidProblem as exc:
            raise InvalidProblem(f"types[{name!r}]: {exc}") from None
        out.extend((name, nodes, k) for nodes, k in configs)
    return tuple(out)
