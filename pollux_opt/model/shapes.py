"""Which (nodes, replicas) shapes a job may take: every pair, or Sia's configuration set.

Sia (Jayaram Subramanya et al., SOSP 2023) restricts each job to
a small set of *configurations* per node type: on one node, a power-of-two
replica count up to the node size (1, 2, 4, ..., and the full node); beyond
one node, whole nodes only (2, 3, ... nodes of the type, all their replicas).
The artifact lists them for 4- and 8-GPU nodes (``sia-simulator/sia.py``,
``CONFIGS_4GPU`` and ``CONFIGS_8GPU``: 1, 2, 4 then 4 per node; 1, 2, 4, 8
then 8 per node); :func:`sia_configurations` is that rule for any node size.

The allocator's :attr:`~pollux_opt.model.Options.shapes` chooses between
every pair (``"all"``) and Sia's set (``"sia"``); ``"auto"``, the default, is
Sia's set on a cluster of several node types and every pair on one type.
Why Sia's set on several types: a job resized one or two replicas at a time
restarts at every step, and on a heterogeneous cluster every round also
weighs a move to another type; with Sia's set each resize is at least a
doubling or a whole node (``docs/heterogeneity.md``, section 7; the
"Heterogeneous cluster" table of ``docs/results.md`` compares type-aware
Pollux with both sets).  The set applies to jobs with goodput models;
explicit speedup tables are used as given, as with ``spread_penalty``.
"""

from __future__ import annotations

import numpy as np

from solvers import MAX_CPUS

from pollux_opt.model.domains import Choice, Integer, check

__all__ = ["SHAPES", "resolve_shapes", "sia_configurations", "sia_shape_mask"]

#: The values of :attr:`~pollux_opt.model.Options.shapes`.
SHAPES = Choice(("auto", "all", "sia"))

_SLOTS = Integer(gt=0, le=MAX_CPUS)
_NODES = Integer(gt=0)


def sia_configurations(replicas_per_node: int, num_nodes: int) -> tuple[tuple[int, int], ...]:
    """Sia's ``(nodes, replicas)`` configurations of one node type, smallest first.

    One node: 1, 2, 4, ... (powers of two below ``replicas_per_node``) and
    ``replicas_per_node`` itself; then ``(n, n * replicas_per_node)`` for
    n = 2 .. ``num_nodes``.

    Raises:
        InvalidProblem: a count that is not a positive integer.
    """
    c = check("replicas_per_node", replicas_per_node, _SLOTS)
    n = check("num_nodes", num_nodes, _NODES)
    one = []
    k = 1
    while k < c:
        one.append((1, k))
        k *= 2
    one.append((1, c))
    return tuple(one) + tuple((m, m * c) for m in range(2, n + 1))


def resolve_shapes(shapes: str, typed: bool) -> str:
    """``"all"`` or ``"sia"``: the option's value, with ``"auto"`` resolved for a
    cluster that is ``typed`` (several node types) or not."""
    if shapes == "auto":
        return "sia" if typed else "all"
    return shapes


def sia_shape_mask(nodes: np.ndarray, replicas: np.ndarray, top: tuple[int, ...],
                   current: tuple[int, int] | None = None) -> np.ndarray:
    """bool[C]: which of the configurations ``(nodes[c], replicas[c])`` of one node
    type are Sia's (:func:`sia_configurations`), or the job's ``current``
    (nodes, replicas) on that type (a running job may always stay as it is).

    ``top`` is the type's :func:`~pollux_opt.model.configs._top_sums`; the
    node size is its largest node's (as Sia's policy reads it), so on a type
    of unequal nodes a multi-node configuration needs that many nodes of the
    largest size.
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    replicas = np.asarray(replicas, dtype=np.int64)
    mask = np.zeros(nodes.shape, dtype=bool)
    for n, k in sia_configurations(int(top[0]), len(top)) + ((current,) if current is not None else ()):
        mask |= (nodes == n) & (replicas == k)
    return mask
