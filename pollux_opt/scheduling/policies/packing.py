"""Node placements for replica counts chosen without a placement model.

The rule-based policies (fixed, Tiresias, Optimus) choose how many replicas
each job gets; these functions choose where: a job goes on the one node that
fits it most tightly (best fit) if any, else on the nodes with the most free
slots first (fewest nodes).  Ties go to the node listed first in the cluster.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from solvers import InvalidProblem

from pollux_opt.model import Cluster

__all__ = ["pack", "take"]


def take(free: dict[str, int], want: int, rank: Mapping[str, int]) -> dict[str, int] | None:
    """Place ``want`` replicas on the nodes of ``free`` and take them from it.

    Args:
        free: node id -> free slots; decreased by the placement returned.
        want: replicas to place (>= 1).
        rank: node id -> position in the cluster (breaks ties).

    Returns:
        node id -> replicas; None (``free`` unchanged) if they do not fit in total.
    """
    fits = [nid for nid in free if free[nid] >= want]
    if fits:
        best = min(fits, key=lambda nid: (free[nid], rank[nid]))
        free[best] -= want
        return {best: want}
    if sum(free.values()) < want:
        return None
    out: dict[str, int] = {}
    left = want
    for nid in sorted(free, key=lambda nid: (-free[nid], rank[nid])):
        if left == 0:
            break
        got = min(free[nid], left)
        if got:
            out[nid] = got
            free[nid] -= got
            left -= got
    return out


def pack(
    cluster: Cluster,
    wanted: Mapping[str, int],
    current: Mapping[str, Mapping[str, int]],
    order: Sequence[str],
) -> dict[str, dict[str, int]]:
    """Node placements for replica counts ``wanted`` (job id -> replicas).

    A job whose current placement already holds ``wanted[j]`` replicas keeps it
    (no restart); the others, in ``order``, are placed by :func:`take`.

    Raises:
        InvalidProblem: the counts do not fit in the cluster.
    """
    free = {n.id: n.cpus for n in cluster.nodes}
    out: dict[str, dict[str, int]] = {}
    for j in order:
        cur = current.get(j, {})
        k = wanted.get(j, 0)
        if k and sum(cur.values()) == k and all(free[n] >= c for n, c in cur.items()):
            out[j] = dict(cur)
            for n, c in cur.items():
                free[n] -= c
    rank = {nid: i for i, nid in enumerate(cluster.node_ids)}
    for j in order:
        k = wanted.get(j, 0)
        if j in out or k <= 0:
            continue
        place = take(free, k, rank)
        if place is None:
            raise InvalidProblem(f"pack: job {j!r} wants {k} replicas, only {sum(free.values())} free")
        out[j] = place
    return out
