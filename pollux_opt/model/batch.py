"""Batch configurations: the limits a job sets, the configuration it runs, and how the best one is chosen.

A job with ``K`` replicas runs micro-batches of ``m`` samples per replica
(``local_bsz``) and ``s`` extra gradient-accumulation micro-batches
(``accum_steps``) per optimizer step, a total batch ``M = K m (s + 1)``.

* :class:`BatchLimits`: the ranges of ``M``, ``m`` and ``s`` a job allows.
* :class:`BatchConfig`: one configuration (what an :class:`~pollux_opt.model.allocation.Allocation`
  gives a job, what a policy decides, what the runtime executes).
* :class:`BatchChoice`: the best configuration for each of many allocations,
  as arrays (:meth:`pollux_opt.model.goodput.GoodputModel.optimize`);
  :meth:`BatchChoice.config` picks one as a :class:`BatchConfig`.
* :func:`best_batch` and :func:`fixed_batch`: the choice itself (Pollux,
  OSDI 2021, section 3.3): the goodput-optimal ``(m, s)``, or a fixed total
  batch split for throughput.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model.validate import as_count

__all__ = [
    "DEFAULT_MAX_ACCUM_STEPS",
    "BatchChoice",
    "BatchConfig",
    "BatchLimits",
    "SearchStart",
    "best_batch",
    "fixed_batch",
    "search_finish",
    "search_start",
]

logger = logging.getLogger(__name__)

#: ``goodput(nodes, replicas, local_bsz, accum_steps)`` over broadcasting float64 arrays.
GoodputFunction = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]

#: Default cap on gradient-accumulation steps (project choice: lets one replica
#: reach 16 times its largest micro-batch, enough to reach a typical maximum
#: batch from a small share of the cluster without huge step times).
DEFAULT_MAX_ACCUM_STEPS = 15

#: Points of the first search grid over local batch sizes: linear (so every
#: integer is tried) when the feasible range has at most this many integers,
#: geometric over wider ranges (batch-size effects are multiplicative).
GRID_POINTS = 64

#: Points of each later linear refinement grid (>= 3).  A bracket of at most
#: ``REFINE_POINTS - 1`` integers is covered exactly by one such grid.
REFINE_POINTS = 16

#: Safety cap on refinement passes; the bracket shrinks by a factor of about
#: ``(REFINE_POINTS - 1) / 2`` per pass, so a 2**63-wide range needs < 25 passes.
MAX_REFINE_PASSES = 64


@dataclass(frozen=True)
class BatchLimits:
    """Limits on the batch configuration a job may use.

    Attributes:
        init_batch_size: M0, the smallest total batch (samples) and the batch the
            job's hyper-parameters were tuned for.
        max_batch_size: largest total batch M (samples), >= M0.
        min_local_bsz: smallest micro-batch per replica (samples), >= 1.
        max_local_bsz: largest micro-batch per replica (samples, e.g. memory
            bound), >= min_local_bsz; ``None`` means ``max_batch_size`` and is
            replaced by it on construction.
        max_accum_steps: largest number s of extra accumulation micro-batches, >= 0.
    """

    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int = 1
    max_local_bsz: int | None = None
    max_accum_steps: int = DEFAULT_MAX_ACCUM_STEPS

    def __post_init__(self) -> None:
        m0 = as_count("init_batch_size", self.init_batch_size, 1)
        mmax = as_count("max_batch_size", self.max_batch_size, 1)
        if mmax < m0:
            raise InvalidProblem(f"max_batch_size must be >= init_batch_size ({m0}), got {mmax}")
        lo = as_count("min_local_bsz", self.min_local_bsz, 1)
        hi = mmax if self.max_local_bsz is None else as_count("max_local_bsz", self.max_local_bsz, 1)
        if lo > hi:
            raise InvalidProblem(f"min_local_bsz must be <= max_local_bsz ({hi}), got {lo}")
        steps = as_count("max_accum_steps", self.max_accum_steps, 0)
        for name, value in (
            ("init_batch_size", m0), ("max_batch_size", mmax), ("min_local_bsz", lo),
            ("max_local_bsz", hi), ("max_accum_steps", steps),
        ):
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class BatchConfig:
    """One batch configuration of a job.

    Attributes:
        local_bsz: micro-batch per replica m, samples.
        accum_steps: extra gradient-accumulation micro-batches s per optimizer step.
        batch_size: total batch ``M = K m (s + 1)`` on the replica count K the
            configuration was chosen for, samples; None where it is not tied
            to one (the runtime's executable configuration: see
            :meth:`total_batch`).
        goodput: predicted goodput at the allocation it was chosen for,
            M0-equivalent samples / s; None where no model predicted it.
    """

    local_bsz: int
    accum_steps: int = 0
    batch_size: int | None = None
    goodput: float | None = None

    def total_batch(self, num_replicas: int) -> int:
        """Total batch ``K m (s + 1)`` on ``num_replicas`` replicas, samples."""
        return num_replicas * self.local_bsz * (self.accum_steps + 1)


@dataclass(frozen=True)
class BatchChoice:
    """Best batch configuration per allocation; every field has the broadcast shape
    of the (num_nodes, num_replicas) arguments.

    An allocation with no feasible configuration has ``goodput = throughput =
    efficiency = 0`` and ``local_bsz = accum_steps = batch_size = 0``, so that its
    speedup is 0 (as for a job holding nothing).

    Attributes:
        goodput: float64, throughput * efficiency, M0-equivalent samples / s.
        throughput: float64, samples / s.
        efficiency: float64, statistical efficiency E(M) (1 when the batch is fixed).
        local_bsz: int64, micro-batch per replica m, samples.
        accum_steps: int64, extra accumulation micro-batches s.
        batch_size: int64, total batch M = K * m * (s + 1), samples.
    """

    goodput: np.ndarray
    throughput: np.ndarray
    efficiency: np.ndarray
    local_bsz: np.ndarray
    accum_steps: np.ndarray
    batch_size: np.ndarray

    @property
    def feasible(self) -> np.ndarray:
        """bool array: the allocation admits a configuration within the limits."""
        return self.local_bsz > 0

    def config(self, index=()) -> BatchConfig:
        """The configuration of the allocation at ``index`` (``()``, the default,
        for a choice of scalar shape) as a :class:`BatchConfig`; all zeros
        where infeasible."""
        return BatchConfig(
            local_bsz=int(self.local_bsz[index]), accum_steps=int(self.accum_steps[index]),
            batch_size=int(self.batch_size[index]), goodput=float(self.goodput[index]),
        )


def _unit_grid(points: int) -> np.ndarray:
    """float64[points]: ``points`` evenly spaced values from 0 to 1 (read-only)."""
    t = np.linspace(0.0, 1.0, points)
    t.flags.writeable = False
    return t


#: The search grids' positions in [0, 1], by number of points.
_UNIT_GRIDS = {points: _unit_grid(points) for points in (GRID_POINTS, REFINE_POINTS)}


def _grid(lo: np.ndarray, hi: np.ndarray, points: int, geometric: bool) -> np.ndarray:
    """int64[..., points] non-decreasing candidates in [lo, hi] including both ends.

    The linear grid hits every integer of [lo, hi] when ``hi - lo <= points - 1``.
    """
    t = _UNIT_GRIDS[points] if points in _UNIT_GRIDS else _unit_grid(points)
    lo_f, hi_f = lo[..., None].astype(np.float64), hi[..., None].astype(np.float64)
    if geometric:
        values = lo_f * (hi_f / lo_f) ** t
    else:
        values = lo_f + (hi_f - lo_f) * t
    return np.clip(np.rint(values).astype(np.int64), lo[..., None], hi[..., None])


def _first_grid(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """int64[R, GRID_POINTS]: the first search grid of each row's interval [lo, hi]:
    linear where it covers every integer of the interval, geometric elsewhere."""
    exact = hi - lo <= GRID_POINTS - 1
    cand = _grid(lo, hi, GRID_POINTS, False)
    if not exact.all():
        wide = np.flatnonzero(~exact)
        cand[wide] = _grid(lo[wide], hi[wide], GRID_POINTS, True)
    return cand


@dataclass(frozen=True)
class SearchStart:
    """The first pass of :func:`best_batch`'s search, before any goodput is known.

    It depends only on the limits and the allocations, so that a caller may
    evaluate (and keep) the throughput at its candidates apart from the
    efficiency.  Rows are the (allocation, s) pairs with a feasible interval
    of m, in flat (P, S) order.

    Attributes:
        ok: bool[P, S], the (allocation, s) pairs with a feasible m.
        rows: int64[R], flat indices of the feasible pairs.
        lo, hi: int64[R], each row's interval of m, samples.
        nodes, replicas, steps: float64[R, 1], each row's N, K and s.
        cand: int64[R, GRID_POINTS], the first grid of candidate m.
    """

    ok: np.ndarray
    rows: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    nodes: np.ndarray
    replicas: np.ndarray
    steps: np.ndarray
    cand: np.ndarray

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        return sum(getattr(self, f).nbytes for f in ("ok", "rows", "lo", "hi", "nodes", "replicas", "steps", "cand"))


def search_start(limits: BatchLimits, nodes: np.ndarray, replicas: np.ndarray) -> SearchStart:
    """The :class:`SearchStart` of float64[P] allocations under ``limits``."""
    lim = limits
    steps = np.arange(lim.max_accum_steps + 1, dtype=np.int64)
    per_sample = replicas.astype(np.int64)[:, None] * (steps + 1)[None, :]  # (P, S)
    lo = np.maximum(lim.min_local_bsz, -(-lim.init_batch_size // per_sample))
    hi = np.minimum(lim.max_local_bsz, lim.max_batch_size // per_sample)
    ok = lo <= hi
    rows = np.flatnonzero(ok)
    lo, hi = lo.reshape(-1)[rows], hi.reshape(-1)[rows]

    def per_row(a: np.ndarray) -> np.ndarray:
        return np.broadcast_to(a, ok.shape).reshape(-1)[rows, None]

    return SearchStart(
        ok=ok, rows=rows, lo=lo, hi=hi, nodes=per_row(nodes[:, None]), replicas=per_row(replicas[:, None]),
        steps=per_row(steps.astype(np.float64)[None, :]), cand=_first_grid(lo, hi),
    )


def best_batch(
    goodput: GoodputFunction, limits: BatchLimits, nodes: np.ndarray, replicas: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """int64[P] (m, s) maximising ``goodput`` for float64[P] allocations; (0, 0) if infeasible.

    ``goodput(nodes, replicas, m, s)`` is evaluated on float64 arrays that
    broadcast (see :meth:`pollux_opt.model.goodput.GoodputModel.goodput`).

    For fixed (N, K, s) the feasible m form an interval [lo, hi] and goodput is
    quasi-concave in m: ``G >= g`` iff ``m - g * T(m) * (phi + K (s+1) m) >= 0``,
    and ``T`` (a sum of a linear term and a gamma-norm of an affine function) and
    ``phi + K (s+1) m`` are positive, non-decreasing and convex, so their
    product is convex and the superlevel sets are intervals.  So the best of a
    grid is bracketed by its neighbours, and shrinking the bracket with
    finer grids until a grid covers it exactly finds the integer optimum.

    Each (allocation, s) row is searched on its own: goodput is evaluated
    only on the rows with a feasible interval, and a row leaves the search
    once a grid has covered its bracket exactly.  The same as
    :func:`search_finish` of :func:`search_start` with the goodput at its
    first grid.
    """
    start = search_start(limits, nodes, replicas)
    first = goodput(start.nodes, start.replicas, start.cand.astype(np.float64), start.steps)
    return search_finish(goodput, limits, start, first)


def search_finish(
    goodput: GoodputFunction, limits: BatchLimits, start: SearchStart, first: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`best_batch`'s answer from its first pass: ``first`` is float64[R, GRID_POINTS],
    the goodput at ``start.cand``; later passes evaluate ``goodput``."""
    ok = start.ok
    # Rows without a feasible m keep min_local_bsz at goodput -inf.
    best_m = np.full(ok.shape, limits.min_local_bsz, dtype=np.int64)
    best_g = np.full(ok.shape, -np.inf)
    rows, lo, hi, cand, g = start.rows, start.lo, start.hi, start.cand, first
    n_row, k_row, s_row = start.nodes, start.replicas, start.steps
    for npass in range(MAX_REFINE_PASSES):
        if rows.size == 0:
            break
        points = GRID_POINTS if npass == 0 else REFINE_POINTS
        exact = hi - lo <= points - 1
        if npass > 0:
            cand = _grid(lo, hi, points, False)
            g = goodput(n_row, k_row, cand.astype(np.float64), s_row)
        at = np.arange(rows.size)
        j = np.argmax(g, axis=-1)
        m_j = cand[at, j]
        best_m.reshape(-1)[rows] = m_j
        best_g.reshape(-1)[rows] = g[at, j]
        if exact.all():
            break
        # argmax takes the first maximum, so cand[j - 1] < cand[j]; the upper
        # end is the first candidate strictly above cand[j] (grids may repeat).
        wide = np.flatnonzero(~exact)
        cand, j, m_j, at = cand[wide], j[wide], m_j[wide], at[:wide.size]
        lo = cand[at, np.maximum(j - 1, 0)]
        hi = cand[at, np.minimum((cand <= m_j[:, None]).sum(axis=-1), points - 1)]
        rows, n_row, k_row, s_row = rows[wide], n_row[wide], k_row[wide], s_row[wide]
    else:  # pragma: no cover - the bracket provably shrinks well within the cap
        logger.warning("batch search stopped after %d refinement passes", MAX_REFINE_PASSES)
    s_idx = np.argmax(best_g, axis=-1)
    m = best_m[np.arange(s_idx.size), s_idx]
    feasible = ok.any(axis=-1)
    return np.where(feasible, m, 0), np.where(feasible, s_idx, 0)


def fixed_batch(limits: BatchLimits, replicas: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """int64[P] (m, s) for a fixed total batch; (0, 0) where s would exceed the cap."""
    lim = limits
    k = replicas.astype(np.int64)
    per_replica = -(-batch_size // k)
    s = -(-per_replica // lim.max_local_bsz) - 1
    m = np.maximum(-(-per_replica // (s + 1)), lim.min_local_bsz)
    feasible = s <= lim.max_accum_steps
    return np.where(feasible, m, 0), np.where(feasible, s, 0)
