"""Stage 6 of the MILP: from placements to model values (warm starts) and back (decoding).

:func:`warm_start_values` writes a feasible placement as values of the
model's variables, which HiGHS takes as its starting solution;
:func:`decode_placement` turns the rounded values of a solution back into a
placement.  Every integer solution decodes to a feasible placement worth at
least its utility sum, and every feasible placement the model can express
encodes to a solution of equal utility sum, which is what makes the model
exact.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..problem import Problem
from .options import OptionTable
from .packing import CLOSE, ITEM, MULTI, SINK, SKIP, PackingGraph, choosing_jobs, entry_vertices

__all__ = ["decode_placement", "start_placement", "warm_start_values"]


def start_placement(problem: Problem, table: OptionTable, slots: bool) -> np.ndarray:
    """int64[J, N]: the current placement, less what the model cannot keep.

    Jobs whose current shape is no longer allowed hold nothing.  With ``slots``
    (at most one multi-node job per node), where two multi-node jobs share a
    node the later ones hold nothing.
    """
    start = np.zeros_like(problem.current)
    multi = table.keep_nodes > 1
    if not slots:
        multi[:] = False
    single = table.keep[~multi]
    start[single] = problem.current[single]
    multi_jobs = table.keep[multi]
    row, node = np.nonzero(problem.current[multi_jobs])
    ends = np.searchsorted(row, np.arange(multi_jobs.size + 1)).tolist()
    node = node.tolist()
    taken: set = set()  # nodes holding an earlier multi-node job
    for i, j in enumerate(multi_jobs.tolist()):
        on = node[ends[i] : ends[i + 1]]
        if taken.isdisjoint(on):
            taken.update(on)
            start[j] = problem.current[j]
    return start


def _kept_in(problem: Problem, table: OptionTable, placement: np.ndarray) -> np.ndarray:
    """bool[Kp]: running jobs whose row of ``placement`` equals their current placement."""
    return np.all(placement[table.keep] == problem.current[table.keep], axis=1)


def warm_start_values(problem: Problem, table: OptionTable, graph: PackingGraph, placement: np.ndarray) -> dict | None:
    """Variable values (by name) of a feasible ``placement``, or None if the model cannot express it.

    Unchanged running jobs are kept (k = 1); each moved or started job takes
    the offered option with its replicas and node count; each node's path
    takes its multi-node segment first, then its single-node jobs by
    decreasing size, then closes (skip arcs on layers it has no segment of).
    """
    kept = _kept_in(problem, table, placement) & (placement[table.keep].sum(axis=1) > 0)
    values = {"y": np.zeros(graph.opt.size), "k": kept.astype(np.float64), "g": defaultdict(float)}
    values["z"] = (placement.sum(axis=1)[choosing_jobs(problem, table, graph)] == 0).astype(np.float64)
    moving = np.ones(problem.num_jobs, dtype=bool)
    moving[table.keep[kept]] = False
    if not _set_options(values["y"], problem, table, graph, placement, moving):
        return None
    used = problem.current[table.keep[kept]].sum(axis=0)  # int64[N] CPUs of the kept jobs
    taken = np.zeros(problem.num_nodes, dtype=bool)  # bool[N] a kept multi-node job is on the node
    if graph.slots:
        for j in table.keep[kept & (table.keep_nodes > 1)].tolist():
            taken |= problem.current[j] > 0
    node = graph.holding[graph.state_node]
    h = (problem.capacity[node] - used[node] == graph.state_res) & (taken[node] == graph.state_slot)
    if np.bincount(graph.state_node[h], minlength=graph.holding.size).tolist() != [1] * graph.holding.size:
        return None
    values["h"] = h.astype(np.float64)
    flow = _path_flow(problem, graph, placement * moving[:, None], used, taken, values["g"])
    if flow is None:
        return None
    values["f"] = flow
    return values


def _set_options(y: np.ndarray, problem: Problem, table: OptionTable, graph: PackingGraph, placement, moving) -> bool:
    """Set ``y`` float64[O'] to 1 at the offered option of each moving job that holds replicas.

    False if some such job's shape (with its node type) is in no offered option.
    """
    reps, nodes = placement.sum(axis=1), (placement > 0).sum(axis=1)
    o_job, o_reps, o_lo, o_hi = (a[graph.opt] for a in (table.job, table.reps, table.lo, table.hi))
    o_type = table.type[graph.opt]
    kind = problem.placement_types(placement)[0] if problem.typed else np.zeros(problem.num_jobs, dtype=np.int64)
    for j in np.flatnonzero(moving & (reps > 0)).tolist():
        fits = np.flatnonzero(
            (o_job == j)
            & (o_reps == reps[j])
            & (o_lo <= nodes[j])
            & (o_hi >= nodes[j])
            & ((o_hi > 1) == (nodes[j] > 1))
            & (o_type == kind[j])
        )
        if fits.size == 0:
            return False
        y[fits[0]] = 1.0
    return True


def _path_flow(
    problem: Problem, graph: PackingGraph, moved: np.ndarray, used: np.ndarray, taken: np.ndarray, g: dict
) -> np.ndarray | None:
    """float64[A] arc flow of one path per node with free capacity, adding segments to ``g``.

    ``moved`` int64[J, N] is the placement of the moving jobs only; None if a
    node's pieces follow no path of the graph.
    """
    nodes = (moved > 0).sum(axis=1)
    keys = zip(graph.arc_tail.tolist(), graph.arc_kind.tolist(), graph.arc_size.tolist(), graph.arc_job.tolist())
    arc_of = {key: a for a, key in enumerate(keys)}
    multi_pos = {(j, t): i for i, (j, t) in enumerate(zip(graph.multi_jobs.tolist(), graph.multi_type.tolist()))}
    flow = np.zeros(graph.arc_tail.size)
    for n in range(problem.num_nodes):
        residual = int(problem.capacity[n] - used[n])
        if residual == 0:
            continue
        kind = int(problem.node_type[n])
        pieces = moved[:, n]
        multi = [(j, int(pieces[j])) for j in np.flatnonzero((pieces > 0) & (nodes > 1)).tolist()]
        singles = sorted((int(pieces[j]) for j in np.flatnonzero((pieces > 0) & (nodes == 1))), reverse=True)
        v = graph.entry(residual, bool(taken[n]), kind)
        steps = []
        if graph.slots:
            if len(multi) > 1 or (multi and taken[n]):
                return None
            steps += [(MULTI, s, -1) for _, s in multi]
            for j, s in multi:
                if (j, kind) not in multi_pos:
                    return None
                g[multi_pos[j, kind], s] += 1.0
        else:
            on = dict((multi_pos.get((j, kind), -1), s) for j, s in multi)
            steps += [(MULTI, on[t], t) if t in on else (SKIP, 0, -1) for t in graph.type_pairs[kind]]
        steps += [(ITEM, s, -1) for s in singles] + [(CLOSE, 0, -1)]
        for kind, size, jpos in steps:
            a = arc_of.get((v, kind, size, jpos))
            if a is None:
                return None
            flow[a] += 1
            v = int(graph.arc_head[a])
    return flow


def decode_placement(problem: Problem, table: OptionTable, graph: PackingGraph, values: dict) -> np.ndarray:
    """int64[J, N] placement from the rounded variable values of a solution.

    The arc flow is split into one path per node: each node starts at its entry
    vertex and follows any arc with flow left until it closes.  Pieces on the
    path are handed out by size: single-node jobs to item arcs, multi-node
    segments to multi arcs (to the layer's own job without interference avoidance).
    """
    placement = np.zeros_like(problem.current)
    kept = table.keep[values["k"] > 0]
    placement[kept] = problem.current[kept]
    chosen = graph.opt[values["y"] > 0]
    single = chosen[table.hi[chosen] == 1]
    singles = defaultdict(list)  # (type, size) -> single-node jobs waiting for an item arc
    for j, t, k in zip(table.job[single].tolist(), table.type[single].tolist(), table.reps[single].tolist()):
        singles[t, k].append(j)
    segments = defaultdict(list)  # (type, size) -> multi-node jobs waiting for a multi arc
    for (i, s), count in values["g"].items():
        segments[int(graph.multi_type[i]), s] += [int(graph.multi_jobs[i])] * int(count)
    flow_values = np.asarray(values["f"])
    used = np.flatnonzero(flow_values > 0)
    flow = dict(zip(used.tolist(), flow_values[used].tolist()))  # arc -> flow left (arcs with flow only)
    out = defaultdict(list)  # vertex -> arcs leaving it that carry flow, in arc order
    for a, t in zip(used.tolist(), graph.arc_tail[used].tolist()):
        out[t].append(a)
    kinds, sizes, jobs, heads, types = (
        x.tolist() for x in (graph.arc_kind, graph.arc_size, graph.arc_job, graph.arc_head, graph.arc_type)
    )
    multi_jobs = graph.multi_jobs.tolist()
    rows, cols, adds = [], [], []  # the pieces handed out: placement[rows, cols] += adds
    for n, v in _entries(problem, graph, values["h"] > 0):
        while v != SINK:
            arcs = out[v]
            while arcs and flow[arcs[0]] <= 0:  # the first arc with flow left (flows only decrease)
                del arcs[0]
            if not arcs:  # inconsistent flow: stop here; the feasibility check reports it
                break
            a = arcs[0]
            flow[a] -= 1
            kind, size, jpos, key = kinds[a], sizes[a], jobs[a], (types[a], sizes[a])
            if kind == ITEM and singles[key]:
                j = singles[key].pop()
            elif kind == MULTI and jpos >= 0:
                j = multi_jobs[jpos]
            elif kind == MULTI and segments[key]:
                j = segments[key].pop()
            else:
                j = -1
            if j >= 0:
                rows.append(j), cols.append(n), adds.append(size)
            v = heads[a]
    at = (np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64))
    np.add.at(placement, at, np.asarray(adds, dtype=np.int64))
    return placement


def _entries(problem: Problem, graph: PackingGraph, h: np.ndarray) -> list[tuple[int, int]]:
    """(node, entry vertex) of every node with free capacity: free nodes, then holding ones in their state ``h``."""
    free = np.delete(np.arange(problem.num_nodes), graph.holding)
    node = np.concatenate([free, graph.holding[graph.state_node[h]]])
    residual = np.concatenate([problem.capacity[free], graph.state_res[h]])
    taken = np.concatenate([np.zeros(free.size, dtype=bool), graph.state_slot[h]])
    entry = entry_vertices(graph, residual, taken, problem.node_type[node])
    keep = residual > 0
    return list(zip(node[keep].tolist(), entry[keep].tolist()))
