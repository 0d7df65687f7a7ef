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
    "best_batch",
    "fixed_batch",
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


def _grid(lo: np.ndarray, hi: np.ndarray, points: int, geometric: bool) -> np.ndarray:
    """int64[..., points] non-decreasing candidates in [lo, hi] including both ends.

    The linear grid hits every integer of [lo, hi] when ``hi - lo <= points - 1``.
    """
    t = np.linspace(0.0, 1.0, points)
    lo_f, hi_f = lo[..., None].astype(np.float64), hi[..., None].astype(np.float64)
    if geometric:
        values = lo_f * (hi_f / lo_f) ** t
    else:
        values = lo_f + (hi_f - lo_f) * t
    return np.clip(np.rint(values).astype(np.int64), lo[..., None], hi[..., None])


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
    """
    lim = limits
    steps = np.arange(lim.max_accum_steps + 1, dtype=np.int64)
    per_sample = replicas.astype(np.int64)[:, None] * (steps + 1)[None, :]  # (P, S)
    lo = np.maximum(lim.min_local_bsz, -(-lim.init_batch_size // per_sample))
    hi = np.minimum(lim.max_local_bsz, lim.max_batch_size // per_sample)
    ok = lo <= hi
    lo = np.where(ok, lo, lim.min_local_bsz)
    hi = np.where(ok, hi, lim.min_local_bsz)
    n3, k3 = nodes[:, None, None], replicas[:, None, None]
    s3 = steps[None, :, None].astype(np.float64)
    for npass in range(MAX_REFINE_PASSES):
        first = npass == 0
        points = GRID_POINTS if first else REFINE_POINTS
        exact = hi - lo <= points - 1
        if first and not exact.all():
            cand = np.where(
                exact[..., None], _grid(lo, hi, points, False), _grid(lo, hi, points, True)
            )
        else:
            cand = _grid(lo, hi, points, False)
        g = goodput(n3, k3, cand.astype(np.float64), s3)
        g = np.where(ok[..., None], g, -np.inf)
        j = np.argmax(g, axis=-1)
        best_m = np.take_along_axis(cand, j[..., None], axis=-1)[..., 0]
        best_g = np.take_along_axis(g, j[..., None], axis=-1)[..., 0]
        if exact.all():
            break
        # argmax takes the first maximum, so cand[j - 1] < cand[j]; the upper
        # end is the first candidate strictly above cand[j] (grids may repeat).
        below = np.take_along_axis(cand, np.maximum(j - 1, 0)[..., None], axis=-1)[..., 0]
        above_idx = np.minimum((cand <= best_m[..., None]).sum(axis=-1), points - 1)
        above = np.take_along_axis(cand, above_idx[..., None], axis=-1)[..., 0]
        lo = np.where(exact, best_m, below)
        hi = np.where(exact, best_m, above)
    else:  # pragma: no cover - the bracket provably shrinks well within the cap
        logger.warning("batch search stopped after %d refinement passes", MAX_REFINE_PASSES)
    s_idx = np.argmax(best_g, axis=-1)
    m = np.take_along_axis(best_m, s_idx[:, None], axis=-1)[:, 0]
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
