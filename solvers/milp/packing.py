r"""Stage 3 of the MILP: node states and the arc-flow packing graph of one model.

Nodes that nobody keeps a job on are interchangeable, so the model does not
say *which* node gets what: it counts how many nodes take each *path* of a
small arc-flow graph (Valério de Carvalho's bin-packing formulation, one unit
of flow per node), a path listing the pieces the node hosts.  Only nodes that
hold a job which may stay in place (*holding* nodes) are named, and only
through their residual capacity after the jobs kept on them: each holding node
is in one *state* t = (residual r_t, multi-node slot taken l_t).

Graph.  Vertices are (layer, level v in 0..C) plus a sink, C the largest node
capacity, capped at the most a node can ever host: the sum over jobs of each
job's largest piece (a node holds at most one piece of each job).  A node
with residual r enters at level C - min(r, C), climbs one arc per piece it
hosts and closes into the sink.  With interference avoidance the
layers are F (fresh: the multi-node slot is free) and I (items only):

    multi  (F, v) -> (I, v + m)                  m replicas of some multi-node job
    item   (F, v) -> (I, v + k), (I, v) -> (I, v + k)   a single-node job of K = k
    close  (F, v) -> sink, (I, v) -> sink

so a node hosts at most one multi-node segment, none if a multi-node job stays
on it (it enters in I).  Without interference avoidance there is one layer per
multi-node job, then I: ``skip`` (j, v) -> (j+1, v) and ``segment``
(j, v) -> (j+1, v+m) of that job only, so a job's segments lie on distinct nodes.

Node types.  With several node types the graph is one such graph per type
(its own levels, layers and vertices, numbered after the previous type's),
each arc of one type: nodes of type t enter and climb type t's graph only,
and its item and segment arcs carry pieces of options of type t.  A
multi-node job's segments are counted per (job, type) pair (*multi pair*).
Without types this is the graph above, to the vertex.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..problem import Problem
from .budget import Budget, TooLarge
from .options import OptionTable
from .states import holding_states

__all__ = [
    "CLOSE",
    "ITEM",
    "MULTI",
    "SINK",
    "SKIP",
    "PackingGraph",
    "choosing_jobs",
    "entry_vertices",
    "groups",
    "packing_graph",
]

#: Arc kinds of the packing graph: a single-node job, a multi-node segment, the
#: end of a node's path, and (without interference avoidance) passing a job's layer.
ITEM, MULTI, CLOSE, SKIP = 0, 1, 2, 3

#: Vertex id of the sink of the packing graph.
SINK = -1

#: The levels are capped at the most a node can host only beyond this many:
#: below, the graph is small anyway, and the exact formulation's model (so
#: its tie-breaking between equal optima) stays as it was.
CAP_LEVELS_ABOVE = 64

#: The arc budget and deadline are checked every this many vertices.
CHECK_EVERY = 1024


@dataclass(frozen=True)
class PackingGraph:
    """Index sets of one model: the options it offers, node states and the packing graph.

    Vertices of type t's graph are numbered ``offset_t + layer * (C_t + 1) + level``
    (``offset_0 = 0``: without types, ``layer * (C + 1) + level``).
    """

    opt: np.ndarray  # int64[O'] options offered (indices into the OptionTable), sorted
    excluded_rc: float  # smallest reduced cost among options not offered (inf if none)
    multi_jobs: np.ndarray  # int64[Jm] job of each multi pair (job, type) with an offered multi-node option
    multi_type: np.ndarray  # int64[Jm] type of each multi pair (sorted by job, then type)
    seg_max: np.ndarray  # int64[Jm] largest segment a multi pair may put on one node
    holding: np.ndarray  # int64[H] nodes holding a job that may stay
    state_node: np.ndarray  # int64[T] position in ``holding`` of each node state
    state_res: np.ndarray  # int64[T] residual capacity r_t of the state
    state_slot: np.ndarray  # bool[T] the state's multi-node slot is taken
    slots: bool  # interference avoidance: layers F and I; else one layer per multi pair, then I
    levels: int  # C of type 0, the largest capacity (capped at the most any node can host)
    layers: int  # layers of type 0 (the last is the items-only layer I)
    free_supply: dict  # vertex -> number of non-holding nodes entering there
    arc_tail: np.ndarray  # int64[A] vertex
    arc_head: np.ndarray  # int64[A] vertex, SINK for close arcs
    arc_kind: np.ndarray  # int64[A] ITEM, MULTI, CLOSE or SKIP
    arc_size: np.ndarray  # int64[A] replicas the arc adds (0 for close and skip)
    arc_job: np.ndarray  # int64[A] position in multi_jobs of a layered segment arc, else -1
    arc_type: np.ndarray  # int64[A] node type of the arc's graph
    state_type: np.ndarray  # int64[T] node type of each state's node
    type_levels: tuple  # C_t per type
    type_layers: tuple  # layers per type
    type_offset: tuple  # first vertex of each type's graph
    type_pairs: tuple  # per type, the positions in multi_jobs of its multi pairs (its layers' jobs)

    def entry(self, residual: int, slot_taken: bool, kind: int = 0) -> int:
        """Vertex where a node of type ``kind`` with ``residual`` > 0 capacity enters the graph."""
        levels = self.type_levels[kind]
        layer = self.type_layers[kind] - 1 if slot_taken else 0
        return self.type_offset[kind] + _vertex(layer, levels - min(residual, levels), levels)


def entry_vertices(graph: PackingGraph, residual: np.ndarray, taken: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """int64[...] :meth:`PackingGraph.entry` of each (residual > 0, slot taken, node type), vectorised."""
    levels = np.asarray(graph.type_levels, dtype=np.int64)[kind]
    layer = np.where(taken, np.asarray(graph.type_layers, dtype=np.int64)[kind] - 1, 0)
    offset = np.asarray(graph.type_offset, dtype=np.int64)[kind]
    return offset + layer * (levels + 1) + levels - np.minimum(residual, levels)


def _vertex(layer: int, level: int, levels: int) -> int:
    """Vertex id of (layer, level) in a graph whose largest capacity is ``levels``."""
    return layer * (levels + 1) + level


def _out_arcs(v: int, levels: int, last: int, slots: bool, seg_max: np.ndarray, item_sizes: list) -> list:
    """(head, kind, size, layer) of the arcs leaving vertex ``v`` of one type's graph (local numbering)."""
    layer, level = divmod(v, levels + 1)
    room = levels - level
    if layer < last and not slots:  # layer of multi-node job ``layer``: pass, or add its segment
        outs = [(_vertex(layer + 1, level, levels), SKIP, 0, -1)]
        sizes = range(1, min(room, seg_max[layer]) + 1)
        return outs + [(_vertex(layer + 1, level + s, levels), MULTI, s, layer) for s in sizes]
    outs = []
    if layer < last:  # fresh node, multi-node slot free
        sizes = range(1, min(room, seg_max.max()) + 1)
        outs += [(_vertex(last, level + s, levels), MULTI, s, -1) for s in sizes]
    outs += [(_vertex(last, level + k, levels), ITEM, k, -1) for k in item_sizes if k <= room]
    outs.append((SINK, CLOSE, 0, -1))
    return outs


def _out_degree(v: int, levels: int, last: int, slots: bool, seg_max: np.ndarray, item_sizes: list) -> int:
    """Number of arcs :func:`_out_arcs` would list for ``v`` (without listing them)."""
    layer, level = divmod(v, levels + 1)
    room = levels - level
    if layer < last and not slots:
        return 1 + min(room, int(seg_max[layer]))
    multi = min(room, int(seg_max.max())) if layer < last else 0
    return multi + bisect.bisect_right(item_sizes, room) + 1  # item_sizes is sorted


def _reachable_arcs(
    starts: set,
    levels: int,
    last: int,
    slots: bool,
    seg_max: np.ndarray,
    item_sizes: list,
    budget: Budget | None = None,
    already: int = 0,
) -> np.ndarray:
    """int64[A, 5] arcs (tail, head, kind, size, layer) of one type's graph reachable from ``starts``, sorted.

    Raises:
        TooLarge: beyond ``budget.max_arcs`` arcs with the ``already`` listed
            (counted before any vertex's arcs are listed).
        OutOfTime: past ``budget``'s deadline.
    """
    budget = budget or Budget()
    arcs = []
    frontier, seen = sorted(starts), set(starts)
    visited = 0
    while frontier:
        v = frontier.pop()
        if already + len(arcs) + _out_degree(v, levels, last, slots, seg_max, item_sizes) > budget.max_arcs:
            raise TooLarge(f"packing graph over MAX_ARCS = {budget.max_arcs} arcs")
        visited += 1
        if visited % CHECK_EVERY == 0:
            budget.check()
        for out in _out_arcs(v, levels, last, slots, seg_max, item_sizes):
            arcs.append((v,) + out)
            if out[0] != SINK and out[0] not in seen:
                seen.add(out[0])
                frontier.append(out[0])
    arcs.sort()
    return np.array(arcs, dtype=np.int64).reshape(-1, 5)


def packing_graph(
    problem: Problem,
    table: OptionTable,
    offered: np.ndarray,
    excluded_rc: float = math.inf,
    slots: bool | None = None,
    budget: Budget | None = None,
) -> PackingGraph:
    """Node states and packing graph of a model offering options ``offered`` (pure).

    Args:
        problem: the allocation problem.
        table: its options (:func:`solvers.milp.options.option_table`).
        offered: bool[O] options the model may choose; keeps are always offered.
        excluded_rc: smallest reduced cost of an option not offered (for the bound).
        slots: at most one multi-node job per node (default: the problem's
            interference avoidance).  True without interference avoidance is a
            restriction (every such placement is feasible), used by the
            restricted formulation to avoid the graph with one layer per
            multi-node job.
        budget: arc limit and deadline (:class:`~solvers.milp.budget.Budget`).

    Raises:
        TooLarge, OutOfTime: from :func:`_reachable_arcs`.
    """
    opt = np.flatnonzero(offered)
    slots = problem.interference_avoidance if slots is None else slots
    types = problem.num_types
    o_job, o_type, o_reps, o_lo = table.job[opt], table.type[opt], table.reps[opt], table.lo[opt]
    is_multi = table.hi[opt] > 1
    pair_key = np.unique((o_job * types + o_type)[is_multi])  # multi pairs (job, type)
    multi_jobs, multi_type = pair_key // types, pair_key % types
    seg = np.zeros(pair_key.size, dtype=np.int64)
    pair_of = np.searchsorted(pair_key, (o_job * types + o_type)[is_multi])
    np.maximum.at(seg, pair_of, (o_reps - o_lo + 1)[is_multi])  # K - (N - 1)
    budget = budget or Budget()
    holding, state_node, state_res, state_slot = holding_states(problem, table, slots, budget.max_columns)
    state_node = np.array(state_node, dtype=np.int64)
    state_res, state_slot = np.array(state_res, dtype=np.int64), np.array(state_slot, dtype=bool)
    state_type = problem.node_type[holding[state_node]]
    single = ~is_multi
    graphs = [
        _type_graph(problem, t, slots, seg, (multi_jobs, multi_type), (o_job[single & (o_type == t)], o_reps[single & (o_type == t)]))
        for t in range(types)
    ]
    seg_max = np.minimum(seg, np.array([g.levels for g in graphs], dtype=np.int64)[multi_type])
    offsets = np.concatenate([[0], np.cumsum([g.layers * (g.levels + 1) for g in graphs])]).tolist()
    free_supply: dict = defaultdict(int)
    not_holding = np.delete(np.arange(problem.num_nodes), holding)
    for n, cap_n in zip(not_holding.tolist(), problem.capacity[not_holding].tolist()):
        g, kind = graphs[problem.node_type[n]], int(problem.node_type[n])
        free_supply[offsets[kind] + _vertex(0, g.levels - min(cap_n, g.levels), g.levels)] += 1
    arcs = []
    for t, g in enumerate(graphs):
        levels, last = g.levels, g.layers - 1
        entering = (state_res > 0) & (state_type == t)
        layer = np.where(state_slot[entering], last, 0)
        starts = {v - offsets[t] for v in free_supply if offsets[t] <= v < offsets[t + 1]} | set(
            (layer * (levels + 1) + levels - np.minimum(state_res[entering], levels)).tolist()
        )
        used = sum(a.shape[0] for a in arcs)
        arc = _reachable_arcs(starts, levels, last, slots, seg_max[g.pairs], g.item_sizes, budget, used)
        arcs.append(_globalise(arc, offsets[t], g.pairs, t))
    arc = np.concatenate(arcs) if arcs else np.zeros((0, 6), dtype=np.int64)
    return PackingGraph(
        opt=opt,
        excluded_rc=float(excluded_rc),
        multi_jobs=multi_jobs,
        multi_type=multi_type,
        seg_max=seg_max,
        holding=holding,
        state_node=state_node,
        state_res=state_res,
        state_slot=state_slot,
        slots=slots,
        levels=graphs[0].levels,
        layers=graphs[0].layers,
        free_supply=dict(free_supply),
        arc_tail=arc[:, 0],
        arc_head=arc[:, 1],
        arc_kind=arc[:, 2],
        arc_size=arc[:, 3],
        arc_job=arc[:, 4],
        arc_type=arc[:, 5],
        state_type=state_type,
        type_levels=tuple(g.levels for g in graphs),
        type_layers=tuple(g.layers for g in graphs),
        type_offset=tuple(offsets[:-1]),
        type_pairs=tuple(g.pairs.tolist() for g in graphs),
    )


@dataclass(frozen=True)
class _TypeGraph:
    """Shape of one node type's graph: levels, layers, its multi pairs (layer order) and item sizes."""

    levels: int
    layers: int
    pairs: np.ndarray  # int64 positions in multi_jobs of the type's multi pairs
    item_sizes: list


def _type_graph(problem: Problem, t: int, slots: bool, seg: np.ndarray, multi: tuple, singles: tuple) -> _TypeGraph:
    """The graph shape of node type ``t``; ``multi`` = (job, type) of the multi pairs, ``seg``
    their largest segments, ``singles`` = (job, K) of the type's single-node options."""
    cap = problem.capacity if not problem.typed else problem.capacity[problem.node_type == t]
    pairs = np.flatnonzero(multi[1] == t)
    piece = np.zeros(problem.num_jobs, dtype=np.int64)  # each job's largest segment on type t
    np.maximum.at(piece, multi[0][pairs], seg[pairs])
    levels = _capped_levels(int(cap.max()) if cap.size else 0, piece, singles[0], singles[1])
    layers = (2 if pairs.size else 1) if slots else pairs.size + 1
    return _TypeGraph(levels, layers, pairs, np.unique(singles[1]).tolist())


def _globalise(arc: np.ndarray, offset: int, pairs: np.ndarray, kind: int) -> np.ndarray:
    """int64[A, 6] arcs of one type's graph in the global numbering, with the type as the last column."""
    out = np.empty((arc.shape[0], 6), dtype=np.int64)
    out[:, :5] = arc
    out[:, 0] += offset
    out[:, 1] = np.where(arc[:, 1] == SINK, SINK, arc[:, 1] + offset)
    layered = arc[:, 4] >= 0
    out[layered, 4] = pairs[arc[layered, 4]]
    out[:, 5] = kind
    return out


def _capped_levels(levels: int, seg: np.ndarray, single_job: np.ndarray, single_reps: np.ndarray) -> int:
    """The graph's levels: the largest capacity, capped at the most any node can host.

    A node hosts at most one piece of each job: a single-node job's replicas,
    or one segment (at most K - (N - 1) replicas) of a multi-node job, so no
    solution puts more than the sum over jobs of their largest piece on one
    node; levels beyond that are never climbed.  ``seg`` int64[J] is each
    job's largest segment, ``single_job``/``single_reps`` the single-node options.
    """
    if levels <= CAP_LEVELS_ABOVE:
        return levels
    piece = seg.copy()
    np.maximum.at(piece, single_job, single_reps)
    most = int(np.minimum(piece, levels).sum())
    return max(min(levels, most), CAP_LEVELS_ABOVE)


def groups(keys: np.ndarray, count: int) -> list[list[int]]:
    """``out[i]`` = positions p with ``keys[p] == i``, for i < count (keys >= count are dropped)."""
    keys = np.asarray(keys, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(count + 1)).tolist()
    flat = order.tolist()
    return [flat[bounds[i] : bounds[i + 1]] for i in range(count)]


def choosing_jobs(problem: Problem, table: OptionTable, graph: PackingGraph) -> np.ndarray:
    """int64[Jz]: jobs with an offered option or a keep (those with a z variable), sorted."""
    jobs = np.concatenate([table.job[graph.opt], table.keep])
    return np.flatnonzero(np.bincount(jobs, minlength=problem.num_jobs) > 0)
