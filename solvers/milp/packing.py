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

__all__ = ["CLOSE", "ITEM", "MULTI", "SINK", "SKIP", "PackingGraph", "choosing_jobs", "groups", "packing_graph"]

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

    Vertices of the packing graph are numbered ``layer * (C + 1) + level``.
    """

    opt: np.ndarray  # int64[O'] options offered (indices into the OptionTable), sorted
    excluded_rc: float  # smallest reduced cost among options not offered (inf if none)
    multi_jobs: np.ndarray  # int64[Jm] jobs with an offered multi-node option
    seg_max: np.ndarray  # int64[Jm] largest segment a multi-node job may put on one node
    holding: np.ndarray  # int64[H] nodes holding a job that may stay
    state_node: np.ndarray  # int64[T] position in ``holding`` of each node state
    state_res: np.ndarray  # int64[T] residual capacity r_t of the state
    state_slot: np.ndarray  # bool[T] the state's multi-node slot is taken
    slots: bool  # interference avoidance: layers F and I; else one layer per multi-node job, then I
    levels: int  # C, the largest capacity (capped at the most any node can host)
    layers: int  # number of layers (the last is the items-only layer I)
    free_supply: dict  # vertex -> number of non-holding nodes entering there
    arc_tail: np.ndarray  # int64[A] vertex
    arc_head: np.ndarray  # int64[A] vertex, SINK for close arcs
    arc_kind: np.ndarray  # int64[A] ITEM, MULTI, CLOSE or SKIP
    arc_size: np.ndarray  # int64[A] replicas the arc adds (0 for close and skip)
    arc_job: np.ndarray  # int64[A] position in multi_jobs of a layered segment arc, else -1

    def entry(self, residual: int, slot_taken: bool) -> int:
        """Vertex where a node with ``residual`` > 0 capacity enters the graph."""
        layer = self.layers - 1 if slot_taken else 0
        return _vertex(layer, self.levels - min(residual, self.levels), self.levels)


def _vertex(layer: int, level: int, levels: int) -> int:
    """Vertex id of (layer, level) in a graph whose largest capacity is ``levels``."""
    return layer * (levels + 1) + level


def _subset_sums(values: list[int], limit: int, most: int) -> list[int]:
    """Sorted distinct sums of subsets of ``values`` that are <= ``limit``.

    Raises:
        TooLarge: beyond ``most`` sums (a node with many kept jobs of distinct sizes).
    """
    sums = {0}
    for v in values:
        sums |= {s + v for s in sums if s + v <= limit}
        if len(sums) > most:
            raise TooLarge(f"a holding node has over MAX_COLUMNS = {most} states")
    return sorted(sums)


def _holding_states(
    problem: Problem, table: OptionTable, slots: bool, most: int
) -> tuple[np.ndarray, list, list, list]:
    """(holding nodes int64[H], and per state t: node position, residual r_t, slot taken l_t).

    A holding node's states are the subsets of the jobs that may stay on it
    (each keeps or leaves); with ``slots`` at most one of them spans several
    nodes.  Raises :class:`~solvers.milp.budget.TooLarge` beyond ``most`` states.
    """
    cur = problem.current
    on_node = cur[table.keep] > 0  # [Kp, N]
    holding = np.flatnonzero(on_node.any(axis=0))
    keep_multi = table.keep_nodes > 1
    state_node, state_res, state_slot = [], [], []
    for i, n in enumerate(holding.tolist()):
        here = np.flatnonzero(on_node[:, n])
        cap_n = int(problem.capacity[n])
        if slots:
            single = _subset_sums(cur[table.keep[here[~keep_multi[here]]], n].tolist(), cap_n, most)
            states = {(u, False) for u in single}
            multi_here = cur[table.keep[here[keep_multi[here]]], n].tolist()
            states |= {(u + v, True) for v in multi_here for u in single if u + v <= cap_n}
        else:
            states = {(u, False) for u in _subset_sums(cur[table.keep[here], n].tolist(), cap_n, most)}
        if len(state_node) + len(states) > most:
            raise TooLarge(f"holding nodes have over MAX_COLUMNS = {most} states")
        for u, taken in sorted(states):
            state_node.append(i)
            state_res.append(cap_n - u)
            state_slot.append(taken)
    return holding, state_node, state_res, state_slot


def _out_arcs(v: int, levels: int, last: int, slots: bool, seg_max: np.ndarray, item_sizes: list) -> list:
    """(head, kind, size, job position) of the arcs leaving vertex ``v``."""
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
) -> np.ndarray:
    """int64[A, 5] arcs (tail, head, kind, size, job position) reachable from ``starts``, sorted.

    Raises:
        TooLarge: beyond ``budget.max_arcs`` arcs (counted before any vertex's arcs are listed).
        OutOfTime: past ``budget``'s deadline.
    """
    budget = budget or Budget()
    arcs = []
    frontier, seen = sorted(starts), set(starts)
    visited = 0
    while frontier:
        v = frontier.pop()
        if len(arcs) + _out_degree(v, levels, last, slots, seg_max, item_sizes) > budget.max_arcs:
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
    levels = int(problem.capacity.max()) if problem.num_nodes else 0
    is_multi = table.hi[opt] > 1
    multi_jobs = np.unique(table.job[opt][is_multi])
    seg = np.zeros(problem.num_jobs, dtype=np.int64)
    np.maximum.at(seg, table.job[opt][is_multi], (table.reps[opt] - table.lo[opt] + 1)[is_multi])  # K - (N - 1)
    levels = _capped_levels(levels, seg, table.job[opt][~is_multi], table.reps[opt][~is_multi])
    seg_max = np.minimum(seg[multi_jobs], levels)
    budget = budget or Budget()
    holding, state_node, state_res, state_slot = _holding_states(problem, table, slots, budget.max_columns)

    layers = (2 if multi_jobs.size else 1) if slots else multi_jobs.size + 1
    last = layers - 1
    item_sizes = np.unique(table.reps[opt][~is_multi]).tolist()
    free_supply: dict = defaultdict(int)
    for cap_n in np.delete(problem.capacity, holding).tolist():
        free_supply[_vertex(0, levels - min(cap_n, levels), levels)] += 1
    starts = set(free_supply) | {
        _vertex(last if taken else 0, levels - min(res, levels), levels)
        for res, taken in zip(state_res, state_slot)
        if res > 0
    }
    arc = _reachable_arcs(starts, levels, last, slots, seg_max, item_sizes, budget)
    return PackingGraph(
        opt=opt,
        excluded_rc=float(excluded_rc),
        multi_jobs=multi_jobs,
        seg_max=seg_max,
        holding=holding,
        state_node=np.array(state_node, dtype=np.int64),
        state_res=np.array(state_res, dtype=np.int64),
        state_slot=np.array(state_slot, dtype=bool),
        slots=slots,
        levels=levels,
        layers=layers,
        free_supply=dict(free_supply),
        arc_tail=arc[:, 0],
        arc_head=arc[:, 1],
        arc_kind=arc[:, 2],
        arc_size=arc[:, 3],
        arc_job=arc[:, 4],
    )


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
