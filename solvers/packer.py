"""Where a job's replicas go on nodes of known room: the array solvers' one packer.

The greedy solver's steps (:mod:`solvers.greedy`) and the MILP's greedy
packing of an LP's choices (:mod:`solvers.milp.greedy_pack`) place a job's
replicas alike: on one node, on the node of least room that holds them (best
fit; ties: the lowest index, :func:`best_fit`); over several nodes, on the
roomiest nodes (:func:`roomiest`), one replica each and the rest filling the
roomiest first (:func:`spread`), so that the nodes left free stay as whole as
they can.
"""

from __future__ import annotations

import numpy as np

__all__ = ["best_fit", "roomiest", "spread"]


def best_fit(room: np.ndarray, reps: int, usable: np.ndarray | None = None) -> int:
    """The first node of least room that holds ``reps`` replicas (-1 if none).

    Args:
        room: int64[N] free replica slots per node.
        usable: bool[N] the nodes the job may use (None: every node).
    """
    fits = room >= reps
    if usable is not None:
        fits &= usable
    at = np.flatnonzero(fits)
    return int(at[np.argmin(room[at])]) if at.size else -1


def roomiest(room: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """int64 positions of the ``usable`` (bool[N]) nodes, most room first (ties: the lowest index)."""
    nodes = np.flatnonzero(usable)
    return nodes[np.argsort(-room[nodes], kind="stable")]


def spread(room: np.ndarray, reps: int) -> np.ndarray:
    """int64 replicas per node of ``reps`` over nodes of room ``room`` (each >= 1, in the order given):
    one on each, the rest filling the first nodes up to their room.  The shares sum to less than
    ``reps`` where the nodes cannot hold them."""
    extra = room - 1
    before = np.cumsum(extra) - extra
    return 1 + np.clip(reps - room.size - before, 0, extra)
