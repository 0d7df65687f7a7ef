r"""Stage 3 of the MILP: node states and the arc-flow packing graph of one model.

Nodes that nobody keeps a job on are interchangeable, so the model does not
say *which* node gets what: it counts how many nodes take each *path* of a
small arc-flow graph (Valério de Carvalho's bin-packing formulation, one unit
of flow per node), a path listing the pieces the node hosts.  Only nodes that
hold a job which may stay in place (*holding* nodes) are named, and only
through their residual capacity after the jobs kept on them: each holding node
is in one *state* t = (residual r_t, multi-node slot taken l_t).

Graph.  Vertices are (layer, level v in 0..C) plus a sink, C the largest node
capacity.  A node with residual r enters at level C - r, climbs one arc per
piece it hosts and closes into the sink.  With interference avoidance the
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

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..problem import Problem
from .options import OptionTable

__all__ = ["CLOSE", "ITEM", "MULTI", "SINK", "SKIP", "PackingGraph", "choosing_jobs", "groups", "packing_graph"]

#: Arc kinds of the packing graph: a single-node job, a multi-node segment, the
#: end of a node's path, and (without interference avoidance) passing a job's layer.
ITEM, MULTI, CLOSE, SKIP = 0, 1, 2, 3

#: Vertex id of the sink of the packing graph.
SINK = -1


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
    levels: int  # C, the largest capacity
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
        return _vertex(layer, self.levels - residual, self.levels)


def _vertex(layer: int, level: int, levels: int) -> int:
    """Vertex id of (layer, level) in a graph whose largest capacity is ``levels``."""
    return layer * (levels + 1) + level


def _subset_sums(values: list[int], limit: int) -> list[int]:
    """Sorted distinct sums of subsets of ``values`` that are <= ``limit``."""
    sums = {0}
    for v in values:
        sums |= {s + v for s in sums if s + v <= limit}
    return sorted(sums)


def _holding_states(problem: Problem, table: OptionTable, slots: bool) -> tuple[np.ndarray, list, list, list]:
    """(holding nodes int64[H], and per state t: node position, residual r_t, slot taken l_t).

    A holding node's states are the subsets of the jobs that may stay on it
    (each keeps or leaves); with ``slots`` at most one of them spans several nodes.
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
            single = _subset_sums(cur[table.keep[here[~keep_multi[here]]], n].tolist(), cap_n)
            states = {(u, False) for u in single}
            multi_here = cur[table.keep[here[keep_multi[here]]], n].tolist()
            states |= {(u + v, True) for v in multi_here for u in single if u + v <= cap_n}
        else:
            states = {(u, False) for u in _subset_sums(cur[table.keep[here], n].tolist(), cap_n)}
        for u, taken in sorted(states):
            state_node.append(i)
            state_res.append(cap_n - u)
            state_slot.append(taken)
    return holding, state_node, state_res, state_slot


def _reachable_arcs(
    starts: set, levels: int, last: int, slots: bool, seg_max: np.ndarray, item_sizes: list
) -> np.ndarray:
    """int64[A, 5] arcs (tail, head, kind, size, job position) reachable from ``starts``, sorted."""

    def vertex(layer: int, level: int) -> int:
        return _vertex(layer, level, levels)

    arcs = []
    frontier, seen = sorted(starts), set(starts)
    while frontier:
        v = frontier.pop()
        layer, level = divmod(v, levels + 1)
        room = levels - level
        if layer < last and not slots:  # layer of multi-node job ``layer``: pass, or add its segment
            outs = [(vertex(layer + 1, level), SKIP, 0, -1)]
            sizes = range(1, min(room, seg_max[layer]) + 1)
            outs += [(vertex(layer + 1, level + s), MULTI, s, layer) for s in sizes]
        else:
            outs = []
            if layer < last:  # fresh node, multi-node slot free
                sizes = range(1, min(room, seg_max.max()) + 1)
                outs += [(vertex(last, level + s), MULTI, s, -1) for s in sizes]
            outs += [(vertex(last, level + k), ITEM, k, -1) for k in item_sizes if k <= room]
            outs.append((SINK, CLOSE, 0, -1))
        for out in outs:
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
    """
    opt = np.flatnonzero(offered)
    slots = problem.interference_avoidance if slots is None else slots
    levels = int(problem.capacity.max()) if problem.num_nodes else 0
    is_multi = table.hi[opt] > 1
    multi_jobs = np.unique(table.job[opt][is_multi])
    seg = np.zeros(problem.num_jobs, dtype=np.int64)
    np.maximum.at(seg, table.job[opt][is_multi], (table.reps[opt] - table.lo[opt] + 1)[is_multi])  # K - (N - 1)
    seg_max = np.minimum(seg[multi_jobs], levels)
    holding, state_node, state_res, state_slot = _holding_states(problem, table, slots)

    layers = (2 if multi_jobs.size else 1) if slots else multi_jobs.size + 1
    last = layers - 1
    item_sizes = np.unique(table.reps[opt][~is_multi]).tolist()
    free_supply: dict = defaultdict(int)
    for cap_n in np.delete(problem.capacity, holding).tolist():
        free_supply[_vertex(0, levels - cap_n, levels)] += 1
    starts = set(free_supply) | {
        _vertex(last if taken else 0, levels - res, levels) for res, taken in zip(state_res, state_slot) if res > 0
    }
    arc = _reachable_arcs(starts, levels, last, slots, seg_max, item_sizes)
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
