"""The node states of the packing graph (:mod:`solvers.milp.packing`): what the holding nodes keep.

A *holding* node holds a running job that may stay in place (a keep of the
:class:`~solvers.milp.options.OptionTable`); each of its states is one subset
of those jobs kept (with interference avoidance, at most one of them spanning
several nodes), named by the residual capacity it leaves and whether its
multi-node slot is taken.
"""

from __future__ import annotations

import numpy as np

from ..problem import Problem
from .budget import TooLarge
from .options import OptionTable

__all__ = ["holding_states", "kept_pieces"]


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


def holding_states(
    problem: Problem, table: OptionTable, slots: bool, most: int
) -> tuple[np.ndarray, list, list, list]:
    """(holding nodes int64[H], and per state t: node position, residual r_t, slot taken l_t).

    A holding node's states are the subsets of the jobs that may stay on it
    (each keeps or leaves); with ``slots`` at most one of them spans several
    nodes.  Raises :class:`~solvers.milp.budget.TooLarge` beyond ``most`` states.
    Nodes with the same capacity and kept pieces have the same states (computed once).
    """
    holding, _, shapes = kept_pieces(problem, table)
    state_node, state_res, state_slot = [], [], []
    known: dict = {}
    for i, (cap_n, pieces) in enumerate(zip(problem.capacity[holding].tolist(), shapes)):
        key = (cap_n, pieces)
        states = known.get(key)
        if states is None:
            states = known[key] = _node_states(cap_n, pieces, slots, most)
        if len(state_node) + len(states[0]) > most:
            raise TooLarge(f"holding nodes have over MAX_COLUMNS = {most} states")
        state_node += [i] * len(states[0])
        state_res += states[0]
        state_slot += states[1]
    return holding, state_node, state_res, state_slot


def _node_states(cap_n: int, pieces: tuple, slots: bool, most: int) -> tuple[list, list]:
    """(residuals, slot taken) of the sorted states of a node of ``cap_n`` CPUs keeping ``pieces``.

    ``pieces`` are (replicas, multi-node) of the jobs that may stay on it, in keep order.
    """
    if slots:
        single = _subset_sums([c for c, multi in pieces if not multi], cap_n, most)
        states = {(u, False) for u in single}
        states |= {(u + v, True) for v in (c for c, multi in pieces if multi) for u in single if u + v <= cap_n}
    else:
        states = {(u, False) for u in _subset_sums([c for c, _ in pieces], cap_n, most)}
    ordered = sorted(states)
    return [cap_n - u for u, _ in ordered], [taken for _, taken in ordered]


def kept_pieces(problem: Problem, table: OptionTable) -> tuple[np.ndarray, list, list]:
    """(holding nodes int64[H], per holding node its pieces, and those without the keep position).

    A holding node holds a job that may stay (a keep); its pieces, in keep
    order, are the tuples (keep position, replicas there, multi-node) and
    (replicas there, multi-node).
    """
    cur = problem.current[table.keep]  # [Kp, N]
    node, q = np.nonzero((cur > 0).T)  # by node, then keep position
    first = np.flatnonzero(np.r_[True, node[1:] != node[:-1]]) if node.size else np.zeros(0, dtype=np.int64)
    holding = node[first]
    size = cur[q, node].tolist()
    multi = (table.keep_nodes > 1)[q].tolist()
    pieces, sized = list(zip(q.tolist(), size, multi)), list(zip(size, multi))
    bounds = np.append(first, node.size).tolist()
    kept = [pieces[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
    shapes = [tuple(sized[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return holding.astype(np.int64), kept, shapes
