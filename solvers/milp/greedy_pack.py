"""Typed rounds: a greedy packing of fixed choices, tried before the packing MIP.

When the LP relaxation of a typed round chooses integrally (one option,
keep or "hold nothing" per job) and only its packing is fractional, any
placement realising those choices is worth the LP optimum, a bound on the
model, so it is optimal (:func:`solvers.milp.highs.run_highs`).  Finding one
is a small bin-packing problem per node type, which :func:`pack_choices`
tries greedily before HiGHS solves it as a MIP: kept jobs stay where they
run; multi-node jobs go first, most replicas first, each on the fewest
nodes of most room that hold it (one replica each, the rest filling the
roomiest first; with interference avoidance a node hosts at most one
multi-node job); then single-node jobs, most replicas first, each on the
first node of least room that fits it (best fit decreasing).  If that
fails, single-node jobs go first.  When both fail, the packing MIP runs.
"""

from __future__ import annotations

import numpy as np

from ..problem import Problem
from .options import OptionTable
from .packing import PackingGraph

__all__ = ["pack_choices"]


def pack_choices(problem: Problem, table: OptionTable, graph: PackingGraph, values: dict) -> np.ndarray | None:
    """int64[J, N] a placement realising the choices (``y``, ``k``) of ``values``, None if the greedy fails.

    ``values`` are a solution's rounded variable values by name, as
    :func:`~solvers.milp.warmstart.decode_placement` reads them; only the
    choices are read.  The greedy runs twice at most: multi-node jobs first,
    then (if that fails) single-node jobs first.  The caller checks the
    placement's feasibility.
    """
    kept = np.flatnonzero(np.asarray(values["k"]) > 0.5)
    options = graph.opt[np.asarray(values["y"]) > 0.5]
    multi = options[table.hi[options] > 1]
    single = options[table.hi[options] == 1]
    multi = multi[np.lexsort((table.job[multi], -table.reps[multi]))].tolist()
    single = single[np.lexsort((table.job[single], -table.reps[single]))].tolist()
    for multi_first in (True, False):
        placement = _greedy(problem, table, kept, multi, single, multi_first)
        if placement is not None:
            return placement
    return None


def _greedy(problem: Problem, table: OptionTable, kept: np.ndarray, multi: list, single: list, multi_first: bool):
    """One greedy pass (see the module docstring): the placement, or None where a job finds no room."""
    placement = np.zeros_like(problem.current)
    for j in table.keep[kept].tolist():
        placement[j] = problem.current[j]
    room = problem.capacity - placement.sum(axis=0)
    slot_free = np.ones(problem.num_nodes, dtype=bool)
    if problem.interference_avoidance:
        multi_kept = table.keep[kept[table.keep_nodes[kept] > 1]]
        slot_free &= ~np.any(placement[multi_kept] > 0, axis=0)
    for phase in (True, False) if multi_first else (False, True):
        if phase and not all(_place_multi(problem, table, o, placement, room, slot_free) for o in multi):
            return None
        if not phase and not all(_place_single(problem, table, o, placement, room) for o in single):
            return None
    return placement


def _place_single(problem: Problem, table: OptionTable, o: int, placement, room) -> bool:
    """Put single-node option ``o`` on the first node of least room that fits it (arrays updated); False if none."""
    k = int(table.reps[o])
    fits = np.flatnonzero((room >= k) & (problem.node_type == table.type[o]))
    if fits.size == 0:
        return False
    n = fits[np.argmin(room[fits])]
    placement[table.job[o], n] += k
    room[n] -= k
    return True


def _place_multi(problem: Problem, table: OptionTable, o: int, placement, room, slot_free) -> bool:
    """Put multi-node option ``o`` on the fewest roomiest nodes of its type (arrays updated); False if none hold it."""
    k, lo, hi = int(table.reps[o]), int(table.lo[o]), int(table.hi[o])
    usable = (room > 0) & (problem.node_type == table.type[o])
    if problem.interference_avoidance:
        usable &= slot_free
    nodes = np.flatnonzero(usable)
    nodes = nodes[np.argsort(-room[nodes], kind="stable")]  # roomiest first, then by index
    count = max(lo, int(np.searchsorted(np.cumsum(room[nodes]), k)) + 1)  # fewest nodes whose room holds K
    if count > min(hi, k, nodes.size):
        return False
    chosen = nodes[:count]
    extra = np.minimum(room[chosen] - 1, k - count)  # beyond one replica each, the roomiest filled first
    before = np.concatenate([[0], np.cumsum(extra)[:-1]])
    share = 1 + np.minimum(extra, np.maximum(k - count - before, 0))
    if int(share.sum()) != k:
        return False
    placement[table.job[o], chosen] += share
    room[chosen] -= share
    slot_free[chosen] = False
    return True

