"""Online estimates of a job's remaining work from what jobs report (no oracle).

A job's *work* is measured in reference seconds: its progress (M0-equivalent
iterations, :attr:`~pollux_opt.scheduling.loop.JobView.progress`) divided by
its fitted model's progress rate on one replica at the goodput-best batch
(:func:`reference_rate`).  Work in these units is comparable across jobs of
different applications: it is how long the job would take alone on one
replica.

:class:`WorkHistory` learns the distribution of jobs' total work online from
the jobs it saw finish (the work they had attained when they left the views),
and answers, for a job that has attained ``a`` reference seconds, the mean
residual work ``E[W - a | W > a]`` (:meth:`WorkHistory.remaining`): the
expected remaining work of a job like it.

The distribution is that of the completed jobs *like this one*: those whose
models have the same batch limits (the job's model family, which the job
reports with its model), once one of them finished.  All completed jobs (the
pooled distribution, once :data:`MIN_SAMPLES` finished) serve only a job
without a model, or every job with ``by_family=False``: the families' sizes
differ by orders of magnitude, so the pooled jobs, mostly the many short
ones, say little of a family not seen to finish (they put a long job's
remaining work at a fraction of the truth).  A job
beyond every sample, or with no distribution yet, falls back to the Lindy
estimate of a heavy tail (a job that has run ``a`` runs as long again) applied
to its family: the family's jobs are taken to be of one size, twice the most
work any active member has attained, ``W = 2 max a``, so that
``R = W - a``; of a family's jobs, the one furthest along is then the
shortest (SRPT within a family of like jobs), and a family of one job is
least-attained-service (Tiresias' prior-free rule).  :data:`MIN_WORK_S` is
the floor of ``R``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable

import numpy as np

from pollux_opt.model import GoodputModel
from pollux_opt.model.goodput import SearchCache, memo_beside_search_cache
from pollux_opt.scheduling.loop import JobView

__all__ = [
    "MIN_FAMILY_SAMPLES", "MIN_SAMPLES", "MIN_WORK_S", "WorkHistory", "one_node_rates", "reference_rate", "work_done",
]

#: Completed jobs of all families needed before the pooled distribution is
#: trusted (project choice: with fewer, one odd job would set every estimate).
MIN_SAMPLES = 3
#: Completed jobs of the job's own family needed to use their distribution
#: (one: jobs of one model family are taken to be alike).
MIN_FAMILY_SAMPLES = 1
#: Floor of the fallback's remaining work, reference seconds (project choice:
#: one minute of one replica, the order of Pollux's 60 s scheduling interval),
#: so that a job that has not run yet has some work left.
MIN_WORK_S = 60.0
#: Models whose reference rate is cached (a few rounds' worth of active jobs).
_RATE_CACHE_SIZE = 4096


@memo_beside_search_cache(maxsize=_RATE_CACHE_SIZE)
def one_node_rates(model: GoodputModel, replicas: int, cache: SearchCache | None = None) -> tuple[float, float]:
    """Progress per second (M0-equivalent iterations / s) of ``model`` at its
    goodput-best batch size on one replica and on ``replicas`` replicas of one
    node; nan where infeasible.  One batch search at both allocations (each
    answer the same bits as alone); cached per model; ``cache``, a scheduler's
    :class:`SearchCache`, spares the search's first pass while the fitted
    throughput is unchanged (speed only)."""
    choice = model.optimize(1, np.array([1, replicas]), cache=cache)
    init = model.limits.init_batch_size
    one, at = (float(g) / init if bool(ok) else math.nan for g, ok in zip(choice.goodput, choice.feasible))
    return one, at


def reference_rate(model: GoodputModel, cache: SearchCache | None = None) -> float:
    """Progress per second of ``model`` on one replica at its goodput-best batch
    size, the unit of work (:func:`one_node_rates`); nan if that is infeasible."""
    return one_node_rates(model, 1, cache)[0]


def work_done(view: JobView, cache: SearchCache | None = None, *, rate: float | None = None) -> float:
    """Work the job has attained, reference seconds (0 without a usable model);
    ``rate``: its model's :func:`reference_rate` where already known."""
    if view.goodput_model is None or view.progress <= 0:
        return 0.0
    rate = reference_rate(view.goodput_model, cache) if rate is None else rate
    return view.progress / rate if math.isfinite(rate) and rate > 0 else 0.0


def _family(view: JobView) -> Hashable | None:
    """What groups jobs as alike: their model's batch limits (None without a model)."""
    return None if view.goodput_model is None else view.goodput_model.limits


@dataclass
class WorkHistory:
    """Total work of the jobs seen to finish, learned round by round.

    Call :meth:`observe` with every round's views: a job that was active and is
    no longer is counted as finished with the work it last reported (an
    underestimate by at most one interval's progress).

    Attributes:
        by_family: use the distribution of the job's own family once it has
            :data:`MIN_FAMILY_SAMPLES` samples (until then the fallback); false:
            the pooled one.
    """

    by_family: bool = True
    _last: dict[str, tuple[float, Hashable | None]] = field(default_factory=dict, init=False)
    _pooled: list[float] = field(default_factory=list, init=False)
    _families: dict[Hashable, list[float]] = field(default_factory=dict, init=False)
    _front: dict[Hashable | None, float] = field(default_factory=dict, init=False)

    def observe(self, views: list[JobView], work: dict[str, float]) -> None:
        """Record the jobs that left the views since the last call.

        Args:
            views: this round's active views.
            work: job id -> attained work (reference seconds) of those views.
        """
        seen = {v.job_id for v in views}
        for jid in [j for j in self._last if j not in seen]:
            total, fam = self._last.pop(jid)
            if total > 0:
                self._pooled.append(total)
                if fam is not None:
                    self._families.setdefault(fam, []).append(total)
        self._front = {}
        for v in views:
            fam = _family(v)
            self._last[v.job_id] = (work[v.job_id], fam)
            self._front[fam] = max(self._front.get(fam, 0.0), work[v.job_id])

    @property
    def completed(self) -> int:
        """Jobs counted as finished so far."""
        return len(self._pooled)

    def _samples(self, view: JobView) -> np.ndarray | None:
        fam = _family(view)
        if self.by_family and fam is not None:
            own = self._families.get(fam, [])
            return np.sort(np.asarray(own)) if len(own) >= MIN_FAMILY_SAMPLES else None
        return np.sort(np.asarray(self._pooled)) if len(self._pooled) >= MIN_SAMPLES else None

    def _fallback(self, view: JobView, attained: float) -> float:
        """The Lindy estimate of the remaining work over the job's family (see the module docstring)."""
        front = max(attained, self._front.get(_family(view), 0.0)) if self.by_family else attained
        return max(2.0 * front - attained, MIN_WORK_S)

    def _residuals(self, view: JobView, attained: float) -> np.ndarray | None:
        """Sorted ``W - a`` of the samples beyond ``a`` (None: fall back)."""
        s = self._samples(view)
        if s is None:
            return None
        rest = s[s > attained] - attained
        return rest if rest.size else None

    def remaining(self, view: JobView, attained: float) -> float:
        """The mean residual work ``E[W - a | W > a]``, reference seconds."""
        rest = self._residuals(view, attained)
        if rest is None:
            return self._fallback(view, attained)
        return float(np.mean(rest))
