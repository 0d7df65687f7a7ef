"""Node placements for shapes chosen without a placement model: the policies' packers.

The rule-based policies (fixed, Tiresias, Optimus) choose how many replicas
each job gets; :func:`pack` and :func:`take` choose where, consolidating each
job on as few nodes as it fits (the consolidated placement of Tiresias, Gu et
al., NSDI 2019: spreading a job's replicas over more nodes than it needs
slows its gradient synchronisation): a job goes on the one node that fits it
most tightly (best fit) if any; else on the fewest nodes, those with the most
free slots filled whole and the rest on the node that fits it most tightly,
so that the nodes left free stay whole for the next job.  Ties go to the node
listed first in the cluster.

Sia's policy chooses a configuration, a node count with its replicas, and
:func:`pack_configurations` places it as given: a multi-node configuration
on that many whole free nodes (Sia's are whole nodes), a one-node one best
fit as above.
"""

from __future__ import annotations

import logging
from typing import Iterable, Mapping, Sequence

from solvers import InvalidProblem

from pollux_opt.model import Cluster

__all__ = ["best_fit", "fewest_nodes", "pack", "pack_configurations", "take"]

log = logging.getLogger(__name__)


def best_fit(free: Mapping[str, int], want: int, rank: Mapping[str, int], nodes: Iterable[str]) -> str | None:
    """Of ``nodes``, the one with the fewest free slots (``free``) that holds ``want``
    replicas (ties: the first by ``rank``); None if none holds them."""
    fits = [n for n in nodes if free[n] >= want]
    return min(fits, key=lambda n: (free[n], rank[n])) if fits else None


def take(free: dict[str, int], want: int, rank: Mapping[str, int]) -> dict[str, int] | None:
    """Place ``want`` replicas on the nodes of ``free`` and take them from it.

    Args:
        free: node id -> free slots; decreased by the placement returned.
        want: replicas to place (>= 1).
        rank: node id -> position in the cluster (breaks ties).

    Returns:
        node id -> replicas; None (``free`` unchanged) if they do not fit in total.
    """
    if sum(free.values()) < want:
        return None
    out: dict[str, int] = {}
    left = want
    by_free = sorted(free, key=lambda nid: (-free[nid], rank[nid]))
    for nid in by_free:
        best = best_fit(free, left, rank, [n for n in by_free if n not in out])
        if best is not None:  # the rest on the node that fits it most tightly
            out[best] = left
            free[best] -= left
            return out
        out[nid] = free[nid]  # no node holds the rest: fill the one with the most free slots
        left -= free[nid]
        free[nid] = 0
    raise AssertionError("unreachable: the free slots hold the job")  # pragma: no cover


def fewest_nodes(cluster: Cluster, replicas: int) -> int:
    """Fewest nodes of ``cluster`` that hold ``replicas`` (its largest nodes, whole)."""
    held = 0
    for count, cpus in enumerate(sorted((n.cpus for n in cluster.nodes), reverse=True), start=1):
        held += cpus
        if held >= replicas:
            return count
    return len(cluster.nodes)


def _fits(free: Mapping[str, int], placement: Mapping[str, int]) -> bool:
    return all(free[n] >= c for n, c in placement.items())


def _reserve(free: dict[str, int], placement: Mapping[str, int]) -> dict[str, int]:
    for n, c in placement.items():
        free[n] -= c
    return dict(placement)


def pack(
    cluster: Cluster,
    wanted: Mapping[str, int],
    current: Mapping[str, Mapping[str, int]],
    order: Sequence[str],
) -> dict[str, dict[str, int]]:
    """Node placements for replica counts ``wanted`` (job id -> replicas).

    A job whose current placement already holds ``wanted[j]`` replicas on as
    few nodes as it needs (:func:`fewest_nodes`) keeps it (no restart).  Then,
    in ``order``, one whose placement holds them on more nodes moves to
    :func:`take`'s placement if that has fewer nodes, and keeps its own
    otherwise; the others are placed by :func:`take`.

    Raises:
        InvalidProblem: the counts do not fit in the cluster.
    """
    free = {n.id: n.cpus for n in cluster.nodes}
    out: dict[str, dict[str, int]] = {}
    held = {j: {n: c for n, c in current.get(j, {}).items() if c} for j in order}
    spread: list[str] = []  # jobs that hold their count on more nodes than they need
    for j in order:
        cur, k = held[j], wanted.get(j, 0)
        if not k or sum(cur.values()) != k or not _fits(free, cur):
            continue
        if len(cur) <= fewest_nodes(cluster, k):
            out[j] = _reserve(free, cur)
        else:
            spread.append(j)
    rank = {nid: i for i, nid in enumerate(cluster.node_ids)}
    for j in spread:
        cur = held[j]
        moved = take(dict(free), wanted[j], rank)
        fewer = moved is not None and len(moved) < len(cur)
        if fewer or _fits(free, cur):
            out[j] = _reserve(free, moved if fewer else cur)
    for j in order:
        k = wanted.get(j, 0)
        if j in out or k <= 0:
            continue
        place = take(free, k, rank)
        if place is None:
            raise InvalidProblem(f"pack: job {j!r} wants {k} replicas, only {sum(free.values())} free")
        out[j] = place
    return out


def pack_configurations(cluster: Cluster, nodes: list[str], wanted: Mapping[str, tuple[int, int]],
                        kept: Mapping[str, Mapping[str, int]], *, strict: bool = True
                        ) -> dict[str, dict[str, int]] | None:
    """Place configurations ``wanted`` ({job: (nodes, replicas)}) on ``nodes`` around the ``kept``
    placements: multi-node jobs on whole free nodes, then the others best fit (:func:`best_fit`),
    largest first.  A job that does not fit: None if ``strict``, else it is left
    out (a node size that is not a power of two can fragment)."""
    caps = {n.id: n.cpus for n in cluster.nodes}
    free = {nid: caps[nid] for nid in nodes}
    rank = {nid: i for i, nid in enumerate(nodes)}
    out = {}
    for j, p in kept.items():
        for nid, k in p.items():
            free[nid] -= k
        out[j] = dict(p)
    rest = sorted((j for j in wanted if j not in kept), key=lambda j: (-wanted[j][0], -wanted[j][1], j))
    for j in rest:
        n, k = wanted[j]
        if n > 1:
            whole = [nid for nid in nodes if free[nid] == caps[nid]][:n]
            if len(whole) < n or sum(caps[nid] for nid in whole) < k:
                if strict:
                    return None
                log.warning("sia: job %s (%d nodes, %d replicas) does not fit; it waits", j, n, k)
                continue
            left, p = k, {}
            for nid in whole:
                p[nid] = min(left, caps[nid])
                left -= p[nid]
        else:
            best = best_fit(free, k, rank, nodes)
            if best is None:
                if strict:
                    return None
                log.warning("sia: job %s (%d replicas) does not fit on one node; it waits", j, k)
                continue
            p = {best: k}
        for nid, kk in p.items():
            free[nid] -= kk
        out[j] = p
    return out
