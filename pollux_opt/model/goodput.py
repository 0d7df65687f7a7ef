"""Goodput model of a data-parallel training job (Pollux, OSDI 2021, section 3).

Goodput is the rate of training *progress*: system throughput (samples per
second, :mod:`pollux_opt.model.throughput`) times statistical efficiency
(progress per sample relative to the initial batch size,
:mod:`pollux_opt.model.efficiency`)::

    goodput = throughput * E(M)                  (M0-equivalent) samples / s

:meth:`GoodputModel.optimize` picks, for each allocation, the local batch
size and accumulation steps that maximise goodput within
:class:`~pollux_opt.model.batch.BatchLimits` (:mod:`pollux_opt.model.batch`);
:meth:`GoodputModel.speedup` is the ratio of best goodputs against a base
allocation, the quantity the allocation problem maximises.

References:
    A. Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized
    Deep Learning", OSDI 2021, sections 3 and 4.1.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, NamedTuple, TypeVar

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model.batch import BatchChoice, BatchLimits, SearchStart, fixed_batch, search_finish, search_start
from pollux_opt.model.efficiency import GradientStats, unchecked_efficiency
from pollux_opt.model.throughput import ThroughputParams, unchecked_step_time
from pollux_opt.model.validate import as_allocation, as_count, as_counts, broadcast_args

__all__ = [
    "DistinctAllocations", "GoodputModel", "SearchCache", "distinct_allocations", "isolated_rate", "memo_beside_search_cache",
]

logger = logging.getLogger(__name__)

#: Default bound of a :class:`SearchCache`, bytes (project choice: a first
#: pass holds 0.1-3 MB; on the workload-6 simulation 32 MiB keep 98 % of the
#: hits an unbounded cache has).
SEARCH_CACHE_BYTES = 32 * 2**20


class SearchCache:
    """The throughputs at the first grid of the batch search, kept across calls.

    The first pass of :func:`~pollux_opt.model.batch.best_batch` evaluates
    goodput on a grid fixed by the batch limits and the allocations, where
    throughput depends only on the throughput parameters: a scheduler's
    rounds see a job's gradient statistics change each round but its fitted
    parameters seldom.  Entries are keyed on the parameters' bits, the
    limits and the allocations, so that a hit repeats the same arithmetic
    bit for bit; the least recently used go once the arrays held exceed
    ``max_bytes``.

    Args:
        max_bytes: bound on the bytes of the arrays held (>= 0; 0 keeps none).
    """

    def __init__(self, max_bytes: int = SEARCH_CACHE_BYTES) -> None:
        self.max_bytes = as_count("max_bytes", max_bytes, 0)
        self._entries: OrderedDict[tuple, tuple[SearchStart, np.ndarray, np.ndarray]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held."""
        return self._bytes

    def first_pass(self, model: "GoodputModel", nodes: np.ndarray, replicas: np.ndarray
                   ) -> tuple[SearchStart, np.ndarray, np.ndarray]:
        """``(start, throughput, batch)`` of ``model`` at float64[P] allocations: the
        search's first pass and the throughput (samples / s) and total batch
        (samples) at its candidates, float64[R, GRID_POINTS]."""
        key = (model.throughput_params.as_array().tobytes(), model.limits, nodes.tobytes(), replicas.tobytes())
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return entry
        self.misses += 1
        start = search_start(model.limits, nodes, replicas)
        thr, batch = model._throughput(start.nodes, start.replicas, start.cand.astype(np.float64), start.steps)
        entry = (start, thr, batch)
        for a in (*vars(start).values(), thr, batch):
            a.flags.writeable = False  # shared by every hit
        size = start.nbytes + thr.nbytes + batch.nbytes
        if size <= self.max_bytes:
            self._entries[key] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (s, t, b) = self._entries.popitem(last=False)
                self._bytes -= s.nbytes + t.nbytes + b.nbytes
        return entry


_F = TypeVar("_F", bound=Callable)


def memo_beside_search_cache(maxsize: int) -> Callable[[_F], _F]:
    """``functools.lru_cache`` of a function over every argument but its ``cache`` (a :class:`SearchCache`).

    A search cache changes how fast a result is computed, never the result
    (a hit repeats the same arithmetic bit for bit), so it stays out of the
    key: a memo entry does not keep a finished scheduler's cache (up to
    :data:`SEARCH_CACHE_BYTES`) alive, and schedulers with different caches
    share entries.  The cache given to the call that computes an entry is
    the one its computation uses.  ``cache`` may be passed by position or by
    keyword; every other argument by position, hashable.
    """

    def decorate(fn: _F) -> _F:
        at = list(inspect.signature(fn).parameters).index("cache")
        passed = threading.local()  # the cache of the call in progress, per thread

        @functools.lru_cache(maxsize=maxsize)
        def keyed(*key):
            return fn(*key, cache=getattr(passed, "cache", None))

        @functools.wraps(fn)
        def memoized(*args, cache: SearchCache | None = None):
            if len(args) > at:
                args, cache = args[:at], args[at]
            outer = getattr(passed, "cache", None)
            passed.cache = cache
            try:
                return keyed(*args)
            finally:
                passed.cache = outer

        memoized.cache_info, memoized.cache_clear = keyed.cache_info, keyed.cache_clear
        return memoized  # type: ignore[return-value]

    return decorate


class DistinctAllocations(NamedTuple):
    """Allocations reduced to the distinct (one node or several, K) the model tells apart.

    The model sees the node count only as "one node or several" (see
    unchecked_sync_time), so allocations with the same replicas on 2, 3, ...
    nodes share one answer: each distinct (multi-node, K) is solved once, then
    expanded.
    """

    #: float64[D] nodes (1 or 2) and replicas of each distinct allocation.
    nodes: np.ndarray
    replicas: np.ndarray
    #: int64[P]: the distinct allocation of each given one (flat order).
    inverse: np.ndarray
    #: The shape of the given allocations.
    shape: tuple[int, ...]


def distinct_allocations(num_nodes, num_replicas) -> DistinctAllocations:
    """The :class:`DistinctAllocations` of int array-likes N >= 1, K >= N (checked, broadcast)."""
    nodes, replicas = as_allocation(num_nodes, num_replicas)
    multi = nodes.reshape(-1) > 1
    keys, inverse = np.unique(replicas.reshape(-1) * 2 + multi, return_inverse=True)
    return DistinctAllocations((1 + keys % 2).astype(np.float64), (keys // 2).astype(np.float64),
                               inverse.reshape(-1), nodes.shape)


@dataclass(frozen=True)
class GoodputModel:
    """Throughput model, gradient statistics and batch limits of one job.

    Raises :class:`InvalidProblem` when ``grad_stats.init_batch_size`` differs from
    ``limits.init_batch_size`` (both are M0).
    """

    throughput_params: ThroughputParams
    grad_stats: GradientStats
    limits: BatchLimits

    def __post_init__(self) -> None:
        for name, kind in (
            ("throughput_params", ThroughputParams),
            ("grad_stats", GradientStats),
            ("limits", BatchLimits),
        ):
            if not isinstance(getattr(self, name), kind):
                raise InvalidProblem(f"{name} must be a {kind.__name__}, got {getattr(self, name)!r}")
        if self.grad_stats.init_batch_size != self.limits.init_batch_size:
            raise InvalidProblem(
                f"grad_stats.init_batch_size ({self.grad_stats.init_batch_size}) must equal "
                f"limits.init_batch_size ({self.limits.init_batch_size})"
            )

    # ------------------------------------------------------------ point evaluation
    def _checked(self, num_nodes, num_replicas, local_bsz, accum_steps):
        nodes, replicas = as_allocation(num_nodes, num_replicas)
        m = as_counts("local_bsz", local_bsz, 1)
        s = as_counts("accum_steps", accum_steps, 0)
        arrays = broadcast_args(num_nodes=nodes, num_replicas=replicas, local_bsz=m, accum_steps=s)
        return [a.astype(np.float64) for a in arrays]

    def _throughput(self, nodes, replicas, m, s):
        batch = replicas * m * (s + 1.0)
        return batch / unchecked_step_time(self.throughput_params.as_array(), nodes, replicas, m, s), batch

    def _goodput(self, nodes, replicas, m, s):
        thr, batch = self._throughput(nodes, replicas, m, s)
        stats = self.grad_stats
        return thr * unchecked_efficiency(stats.noise_scale, stats.init_batch_size, batch)

    def throughput(self, num_nodes, num_replicas, local_bsz, accum_steps=0) -> np.ndarray:
        """Samples per second ``M / T`` at the given configuration (limits not applied).

        Arguments are int array-likes (N >= 1, K >= N, m >= 1, s >= 0) that
        broadcast; returns float64 of the broadcast shape.
        """
        return self._throughput(*self._checked(num_nodes, num_replicas, local_bsz, accum_steps))[0]

    def goodput(self, num_nodes, num_replicas, local_bsz, accum_steps=0) -> np.ndarray:
        """Goodput ``throughput * E(M)``, M0-equivalent samples / s (limits not applied).

        Arguments as in :meth:`throughput`; returns float64 of the broadcast shape.
        """
        return self._goodput(*self._checked(num_nodes, num_replicas, local_bsz, accum_steps))

    def optimize(self, num_nodes, num_replicas, *, fixed_batch_size=None,
                 cache: SearchCache | None = None) -> BatchChoice:
        """Best batch configuration for each allocation (Pollux, section 3.3).

        Default (goodput): maximise goodput over integer m in [min_local_bsz,
        max_local_bsz] and s in [0, max_accum_steps] subject to
        ``M0 <= K * m * (s + 1) <= max_batch_size``; an allocation where no (m, s)
        satisfies this (e.g. ``K * min_local_bsz > max_batch_size``, or
        ``K * max_local_bsz * (max_accum_steps + 1) < M0``) is infeasible and gets
        zeros, not nan, so speedups stay finite (see :class:`BatchChoice`).  The
        result is the exact integer optimum (see
        :func:`~pollux_opt.model.batch.best_batch`); ties go to
        the fewest accumulation steps.

        Throughput-only (``fixed_batch_size=B``): the total batch is the user's
        B, spread as ``ceil(B / K)`` samples per replica, split into the fewest
        micro-batches of at most max_local_bsz (then raised to min_local_bsz if
        below it), so ``M >= B`` with equality when K (s + 1) divides B.
        Efficiency is ignored (reported as 1, goodput = throughput); M0 and
        max_batch_size are not applied (B is the user's choice).  Infeasible
        where more than max_accum_steps accumulation steps would be needed.

        Args:
            num_nodes: int array-like N >= 1.
            num_replicas: int array-like K >= N, broadcasting with N.
            fixed_batch_size: optional int B >= 1, total batch in samples.
            cache: optional :class:`SearchCache` of the search's first pass
                (the same answer, to the bit, with or without it).

        Returns:
            A :class:`BatchChoice` with fields of the broadcast shape.
        """
        return self.optimize_distinct(distinct_allocations(num_nodes, num_replicas),
                                      fixed_batch_size=fixed_batch_size, cache=cache)

    def optimize_distinct(self, allocations: "DistinctAllocations", *, fixed_batch_size=None,
                          cache: SearchCache | None = None) -> BatchChoice:
        """:meth:`optimize` at allocations already reduced by :func:`distinct_allocations`."""
        n, k, inverse, shape = allocations
        if fixed_batch_size is None:
            m, s = self._best_batch(n, k, cache)
        else:
            m, s = fixed_batch(self.limits, k, as_count("fixed_batch_size", fixed_batch_size, 1))
        return self._choice(n, k, m, s, fixed_batch_size is not None, inverse, shape)

    def _best_batch(self, n, k, cache: SearchCache | None) -> tuple[np.ndarray, np.ndarray]:
        """:func:`~pollux_opt.model.batch.best_batch` of this model at float64[P] allocations,
        its first pass's throughputs from ``cache`` where given."""
        if cache is None:
            start = search_start(self.limits, n, k)
            first = self._goodput(start.nodes, start.replicas, start.cand.astype(np.float64), start.steps)
        else:
            start, thr, batch = cache.first_pass(self, n, k)
            stats = self.grad_stats
            first = thr * unchecked_efficiency(stats.noise_scale, stats.init_batch_size, batch)  # as _goodput
        return search_finish(self._goodput, self.limits, start, first)

    def _choice(self, n, k, m, s, fixed: bool, inverse, shape) -> BatchChoice:
        """The :class:`BatchChoice` of the chosen (m, s) at the distinct allocations
        ``(n, k)``, expanded by ``inverse`` to ``shape``; zeros where ``m == 0``."""
        feasible = m > 0
        m_eval = np.where(feasible, m, 1).astype(np.float64)  # any valid m; masked below
        thr, batch = self._throughput(n, k, m_eval, s.astype(np.float64))
        if not fixed:
            stats = self.grad_stats
            eff = unchecked_efficiency(stats.noise_scale, stats.init_batch_size, batch)
        else:
            eff = np.ones_like(thr)
        thr = np.where(feasible, thr, 0.0)
        eff = np.where(feasible, eff, 0.0)
        if not feasible.all():
            logger.debug(
                "%d of %d allocations infeasible for %s",
                int((~feasible).sum()), feasible.size, self.limits,
            )
        batch = np.where(feasible, batch, 0).astype(np.int64)
        return BatchChoice(
            goodput=(thr * eff)[inverse].reshape(shape),
            throughput=thr[inverse].reshape(shape),
            efficiency=eff[inverse].reshape(shape),
            local_bsz=m[inverse].reshape(shape),
            accum_steps=s[inverse].reshape(shape),
            batch_size=batch[inverse].reshape(shape),
        )

    def speedup(self, num_nodes, num_replicas, *, base=(1, 1), fixed_batch_size=None) -> np.ndarray:
        """Best goodput at (N, K) over best goodput at ``base`` (Pollux, section 4.1).

        Args:
            num_nodes: int array-like N >= 1.
            num_replicas: int array-like K >= N, broadcasting with N.
            base: (nodes, replicas) of the reference allocation, e.g. a fair share.
            fixed_batch_size: as in :meth:`optimize` (throughput-only speedups).

        Returns:
            float64 array of the broadcast shape; 1 at ``base``, 0 where infeasible.

        Raises:
            InvalidProblem: if ``base`` is not a pair or is itself infeasible.
        """
        if np.ndim(base) != 1 or np.shape(base)[0] != 2:
            raise InvalidProblem(f"base must be a (num_nodes, num_replicas) pair, got {base!r}")
        ref = self.optimize(base[0], base[1], fixed_batch_size=fixed_batch_size)
        if not ref.feasible:
            raise InvalidProblem(
                f"base allocation {tuple(base)!r} has no feasible batch configuration "
                f"under {self.limits}"
            )
        choice = self.optimize(num_nodes, num_replicas, fixed_batch_size=fixed_batch_size)
        return choice.goodput / ref.goodput


def isolated_rate(model: GoodputModel, cpus: float, batch_size: int, max_replicas: int | None,
                  node_cpus: int | None = None) -> float:
    """Progress rate (M0-equivalent iterations / s) of a job of ``model`` on ``cpus`` exclusive CPUs,
    training as its user submitted it: the reference of finish-time fairness (Themis, NSDI 2020).

    The submitted ``batch_size`` split over the replicas, statistical efficiency
    included; ``max_replicas`` (None: none) caps the replicas; linear
    interpolation between integer CPU counts, time-slicing below one CPU.
    ``node_cpus`` (largest node) decides how many nodes K replicas span (one if
    None).  nan where the batch does not fit or ``cpus`` is not positive.
    """
    if not cpus > 0:
        return float("nan")
    m0 = model.limits.init_batch_size
    cap = int(max_replicas) if max_replicas else None

    def rate(k: int) -> float:
        k = max(1, k if cap is None else min(k, cap))
        nodes = 1 if not node_cpus else -(-k // node_cpus)
        choice = model.optimize(nodes, k, fixed_batch_size=int(batch_size))
        if not bool(choice.feasible):
            return float("nan")
        return float(model.goodput(nodes, k, int(choice.local_bsz), int(choice.accum_steps))) / m0

    if cpus < 1:
        return rate(1) * cpus
    lo, hi = int(cpus // 1), -int(-cpus // 1)
    if lo == hi:
        return rate(lo)
    w = cpus - lo
    return (1 - w) * rate(lo) + w * rate(hi)
