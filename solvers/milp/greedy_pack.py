"""Typed rounds: a greedy packing of fixed choices, tried before the packing MIP.

When the LP relaxation of a typed round chooses integrally (one option,
keep or "hold nothing" per job) and only its packing is fractional, any
placement realising those choices is worth the LP optimum, a bound on the
model, so it is optimal (:func:`solvers.milp.highs.run_highs`).  Finding one
is a small bin-packing problem per node type, which :func:`pack_choices`
tries greedily before HiGHS solves it as a MIP: kept jobs stay where they
run; multi-node jobs go first, most replicas first, each on the fewest
nodes of most room that hold it (with interference avoidance a node hosts
at most one multi-node job); then single-node jobs, most replicas first,
each on the first node of least room that fits it (best fit decreasing).
A job's replicas go where :mod:`solvers.packer` puts them, as in the greedy
solver's steps; what is this module's own is the choices it packs (the LP's,
fixed) and the order it packs them in.  If that
fails, single-node jobs go first.  When both fail, the packing MIP runs.

:func:`repair_choices` serves the LP dive of the large formulation when
fixing the LP's whole choices leaves no room (:meth:`solvers.milp.highs_model.HighsModel.dive`):
it rounds a fractional LP answer to each job's choice of largest value and
packs it the same way, giving a job without room the option that loses
least worth (on a free node, or where a single-node job shrinks to a
smaller option of its own).
"""

from __future__ import annotations

import numpy as np

from ..packer import best_fit, roomiest, spread
from ..problem import Problem
from .options import OptionTable
from .packing import PackingGraph

__all__ = ["pack_choices", "repair_choices"]


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
    placement, room, slot_free = _with_kept(problem, table, kept)
    for phase in (True, False) if multi_first else (False, True):
        if phase and not all(_place_multi(problem, table, o, placement, room, slot_free) for o in multi):
            return None
        if not phase and not all(_place_single(problem, table, o, placement, room) for o in single):
            return None
    return placement


def _place_single(problem: Problem, table: OptionTable, o: int, placement, room) -> bool:
    """Put single-node option ``o`` on the first node of least room that fits it (arrays updated); False if none."""
    n = _single_node(problem, table, o, room)
    if n < 0:
        return False
    _put(table, o, n, placement, room)
    return True


def _single_node(problem: Problem, table: OptionTable, o: int, room) -> int:
    """The first node of least room that fits single-node option ``o`` (-1 if none)."""
    return best_fit(room, int(table.reps[o]), problem.node_type == table.type[o])


def _place_multi(problem: Problem, table: OptionTable, o: int, placement, room, slot_free) -> bool:
    """Put multi-node option ``o`` on the fewest roomiest nodes of its type (arrays updated); False if none hold it."""
    k, lo, hi = int(table.reps[o]), int(table.lo[o]), int(table.hi[o])
    usable = (room > 0) & (problem.node_type == table.type[o])
    if problem.interference_avoidance:
        usable &= slot_free
    nodes = roomiest(room, usable)
    count = max(lo, int(np.searchsorted(np.cumsum(room[nodes]), k)) + 1)  # fewest nodes whose room holds K
    if count > min(hi, k, nodes.size):
        return False
    chosen = nodes[:count]
    share = spread(room[chosen], k)
    if int(share.sum()) != k:
        return False
    placement[table.job[o], chosen] += share
    room[chosen] -= share
    slot_free[chosen] = False
    return True


def repair_choices(problem: Problem, table: OptionTable, graph: PackingGraph, values: dict) -> tuple | None:
    """(placement int64[J, N], its utility sum, settled) that rounds a fractional LP answer ``values``, or None.

    Each job takes its choice of largest LP value (an offered option, keeping
    its placement, or nothing); kept jobs stay where they run, then the jobs
    given an option are placed as :func:`pack_choices` places them (multi-node
    first, most replicas first).  A job whose option finds no room takes the
    single-node option that loses least worth (:func:`_make_room`), else the
    first of its other offered options that fits, most worth first, else
    holds nothing.  The utility sum is on the model's scale
    (``table.scale``); ``settled`` (bool arrays by name, ``y`` and ``k``)
    marks the choices of the jobs placed as the LP chose them.  None when
    the placement breaks a constraint (it should not: every piece is placed
    where it fits).
    """
    from ..placement import violations_and_values

    keep_share, best_share, best_opt, option_share = _lp_choices(problem, table, graph, values)
    nothing = 1.0 - keep_share - option_share
    kept = np.flatnonzero(keep_share[table.keep] >= np.maximum(best_share, nothing)[table.keep])
    placed = (best_opt >= 0) & (best_share > keep_share) & (best_share >= nothing)
    placed[table.keep[kept]] = False
    placement, room, slot_free = _with_kept(problem, table, kept)
    first = best_opt[placed]
    first = first[np.lexsort((table.job[first], -table.reps[first], table.hi[first] == 1))].tolist()
    alternatives = _by_worth(table, graph)
    singles: dict = {}  # job -> (single-node option, node) of the jobs placed so on one node
    changed = np.zeros(problem.num_jobs, dtype=bool)  # placed otherwise than the LP chose
    for o in first:
        j = int(table.job[o])
        if _place(problem, table, o, placement, room, slot_free, singles):
            continue
        changed[j] = True
        shrunk = _make_room(problem, table, alternatives, o, placement, room, singles)
        if shrunk is None:
            any(_place(problem, table, a, placement, room, slot_free, singles) for a in alternatives[j] if a != o)
        elif shrunk >= 0:
            changed[shrunk] = True
    broken, job_x = violations_and_values(problem, placement)
    if broken:
        return None
    scale = table.scale
    w = problem.weight if scale.weight_scale == 1 else problem.weight * scale.weight_scale
    settled = {"y": ~changed[table.job[graph.opt]], "k": np.ones(table.keep.size, dtype=bool)}
    return placement, float(np.sum(w * scale(job_x))), settled


def _lp_choices(problem: Problem, table: OptionTable, graph: PackingGraph, values: dict) -> tuple:
    """float64[J] LP value of each job's keep, float64[J] of its largest option, int64[J] that option
    (-1: none) and float64[J] the job's LP value summed over its offered options."""
    jobs = problem.num_jobs
    keep_share = np.zeros(jobs)
    keep_share[table.keep] = np.asarray(values["k"], dtype=np.float64)
    y = np.asarray(values["y"], dtype=np.float64)
    job = table.job[graph.opt]
    order = np.lexsort((-y, job))
    top = order[np.r_[True, job[order][1:] != job[order][:-1]]] if order.size else order
    best_share, best_opt = np.zeros(jobs), np.full(jobs, -1, dtype=np.int64)
    best_share[job[top]], best_opt[job[top]] = y[top], graph.opt[top]
    return keep_share, best_share, best_opt, np.bincount(job, weights=y, minlength=jobs)


def _with_kept(problem: Problem, table: OptionTable, kept: np.ndarray) -> tuple:
    """(placement of the kept jobs ``kept`` (positions in ``table.keep``), room per node, nodes without a multi-node job)."""
    placement = np.zeros_like(problem.current)
    jobs = table.keep[kept]
    placement[jobs] = problem.current[jobs]
    room = problem.capacity - placement.sum(axis=0)
    slot_free = np.ones(problem.num_nodes, dtype=bool)
    if problem.interference_avoidance:
        multi_kept = table.keep[kept[table.keep_nodes[kept] > 1]]
        slot_free &= ~np.any(placement[multi_kept] > 0, axis=0)
    return placement, room, slot_free


def _by_worth(table: OptionTable, graph: PackingGraph) -> dict:
    """Job -> its offered options, most worth first."""
    opt = graph.opt[np.lexsort((-table.worth[graph.opt], table.job[graph.opt]))]
    out: dict = {}
    for j, o in zip(table.job[opt].tolist(), opt.tolist()):
        out.setdefault(j, []).append(o)
    return out


def _place(problem: Problem, table: OptionTable, o: int, placement, room, slot_free, singles: dict) -> bool:
    """Place option ``o`` as :func:`_greedy` does, recording a single-node one in ``singles``; False if no room."""
    if table.hi[o] > 1:
        return _place_multi(problem, table, o, placement, room, slot_free)
    n = _single_node(problem, table, o, room)
    if n < 0:
        return False
    _put(table, o, n, placement, room)
    singles[int(table.job[o])] = (o, n)
    return True


def _put(table: OptionTable, o: int, n: int, placement, room, sign: int = 1) -> None:
    """Add (``sign`` -1: remove) single-node option ``o`` on node ``n``."""
    k = int(table.reps[o]) * sign
    placement[table.job[o], n] += k
    room[n] -= k


def _make_room(problem: Problem, table: OptionTable, alternatives: dict, o: int, placement, room, singles: dict):
    """Place the job of option ``o`` (no room for ``o``) on a single-node option, losing least worth.

    Candidates: each single-node option of the job (``alternatives``, most
    worth first) on a node where it fits, at a loss of its worth below
    ``o``'s; or where it fits once a single-node job there drops to a
    smaller option of its own, at that job's loss too.  Returns that job
    (-1 when none had to shrink), or None (nothing changed) if there is no candidate.
    """
    best = None  # (worth lost, option, node, other job's option, its smaller option)
    for a in alternatives[int(table.job[o])]:
        if table.hi[a] > 1:
            continue
        k, kind, own = int(table.reps[a]), int(table.type[a]), float(table.worth[o] - table.worth[a])
        n = _single_node(problem, table, a, room)
        if n >= 0 and (best is None or own < best[0]):
            best = (own, a, n, None, None)
        for other, n in singles.values():
            free = int(room[n] + table.reps[other])
            if table.type[other] != kind or free < k:
                continue
            smaller = _largest_fitting(table, alternatives[int(table.job[other])], kind, free - k)
            loss = None if smaller is None else own + float(table.worth[other] - table.worth[smaller])
            if loss is not None and (best is None or loss < best[0]):
                best = (loss, a, n, other, smaller)
    if best is None:
        return None
    _, a, n, other, smaller = best
    if other is not None:
        _put(table, other, n, placement, room, -1)
        _put(table, smaller, n, placement, room)
        singles[int(table.job[smaller])] = (smaller, n)
    _put(table, a, n, placement, room)
    singles[int(table.job[a])] = (a, n)
    return -1 if other is None else int(table.job[other])


def _largest_fitting(table: OptionTable, options: list, kind: int, reps: int):
    """The first (most worth) single-node option of type ``kind`` among ``options`` with at most ``reps`` replicas."""
    for a in options:
        if table.hi[a] == 1 and table.type[a] == kind and table.reps[a] <= reps:
            return a
    return None
