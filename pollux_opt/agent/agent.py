"""The job agent: a job's measurements, the rule for re-fitting its throughput
model, and the :class:`~pollux_opt.model.GoodputModel` it reports (the
"PolluxAgent" of Pollux, OSDI 2021, section 4.1).

One implementation serves both backends:

* the real runtime (:mod:`pollux_opt.runtime.controller`) replaces the
  measurements with each report of rank 0 (:meth:`JobAgent.update_profile`:
  every step refines a configuration's time) and re-fits whenever they changed,
  at most every ``RuntimeOptions.adapt_interval_s`` (``refit_growth=None``);
* the simulator (:mod:`pollux_opt.backends.sim.backend`) adds the first report
  of each configuration (:meth:`JobAgent.add_measurement`: its times are exact
  or perturbed once) and re-fits on a new (nodes, replicas) pair or once the
  number of configurations has grown by :data:`REFIT_GROWTH`, caching fits by
  measurement set across jobs (``fit_cache``).

Pure numpy: no torch, no processes.
"""

from __future__ import annotations

import logging
import math
from typing import Mapping

from solvers import InvalidProblem

from pollux_opt.model import BatchLimits, GoodputModel, GradientStats, ThroughputParams
from pollux_opt.model.domains import Real, check
from pollux_opt.agent.measurements import ConfigKey, Measurements

__all__ = [
    "MIN_GRAD_SQR", "MIN_STATS_STEPS", "REFIT_GROWTH", "JobAgent", "goodput_model", "neutral_stats",
    "params_from_dict", "params_to_dict",
]

logger = logging.getLogger(__name__)

#: The simulator's refit rule: re-fit the throughput model when a new (nodes,
#: replicas) pair has been measured or the number of measured configurations
#: has grown by this factor since the last fit.  Project choice: keeps fitting
#: cost logarithmic in the measurements.  Pollux's simulator refits on every
#: new configuration, which here gave the same average JCT on the eight AdaptDL
#: workloads (2758 vs 2753 s) in 35 % more time.
REFIT_GROWTH = 1.5
#: Growth factors of the measurements between refits (None: a fit is stale
#: whenever the measurements changed).
_REFIT_GROWTHS = Real(ge=1, finite=False, none=True)

#: Steps with gradient statistics before a co-adapting job trusts its model to
#: pick a batch larger than M0 (until then it trains at M0, as AdaptDL does).
#: About one averaging window of the statistics (see ``stats.GRAD_STATS_SMOOTHING``).
MIN_STATS_STEPS = 20

#: Floor of a reported |G|^2, so that a job whose gradient noise swamps its
#: estimate still has a valid (very noisy) :class:`GradientStats`.  The runtime's
#: smoothed estimate is clipped far above it (``stats.MIN_GRAD_SQR_FRACTION``).
MIN_GRAD_SQR = 1e-300


def _same_bits(a: tuple, b: tuple) -> bool:
    """Whether two tuples of floats are equal to the bit (0.0 is not -0.0; nan is never equal)."""
    return all(x == y and math.copysign(1.0, x) == math.copysign(1.0, y) for x, y in zip(a, b))


def neutral_stats(limits: BatchLimits) -> GradientStats:
    """Gradient statistics of a noise-free job: statistical efficiency 1 at every batch."""
    return GradientStats(grad_sqr=1.0, grad_var=0.0, init_batch_size=limits.init_batch_size)


def goodput_model(
    params: ThroughputParams | None, stats: GradientStats | None, limits: BatchLimits, *, fixed_batch: bool = False
) -> GoodputModel | None:
    """A job's goodput model, or None until it has a throughput fit and gradient
    statistics.  With ``fixed_batch`` (the job trains at a fixed total batch, so
    its statistics do not matter) neutral statistics stand in for missing ones."""
    if params is None:
        return None
    if stats is None:
        if not fixed_batch:
            return None
        stats = neutral_stats(limits)
    return GoodputModel(params, stats, limits)


def params_to_dict(params: ThroughputParams | None) -> dict | None:
    """``params`` as a JSON-able dict (None stays None)."""
    return None if params is None else params.to_dict()


def params_from_dict(data: dict | None) -> ThroughputParams | None:
    """The :class:`ThroughputParams` of :func:`params_to_dict`'s dict (None or empty: None)."""
    if not data:
        return None
    return ThroughputParams(**{k: float(v) for k, v in data.items()})


class JobAgent:
    """Measurements and gradient statistics of one job, and its fitted models.

    Args:
        limits: the job's batch limits (those of its goodput model).
        refit_growth: None: a fit is stale whenever the measurements changed
            (the runtime); a factor >= 1: only when a new (nodes, replicas)
            pair was measured or the number of configurations grew by it (the
            simulator, :data:`REFIT_GROWTH`).
        fit_cache: optional dict shared by agents, measurement set -> fitted
            parameters (the fit is a pure function of the measurements).
        fixed_batch: the job trains at a fixed total batch (see :func:`goodput_model`).
        name: the job's name, for log messages.
    """

    def __init__(
        self,
        limits: BatchLimits,
        *,
        refit_growth: float | None = None,
        fit_cache: dict | None = None,
        fixed_batch: bool = False,
        name: str = "",
    ) -> None:
        check("refit_growth", refit_growth, _REFIT_GROWTHS)
        self.limits = limits
        self.name = name
        self.refit_growth = refit_growth
        self.fixed_batch = fixed_batch
        self._fit_cache = fit_cache
        self._profile: Mapping[ConfigKey, Mapping] = {}  # the runtime's intake
        self._rows: dict[ConfigKey, tuple[float, float]] = {}  # the simulator's intake
        self._measurements: Measurements | None = Measurements.from_rows([])
        self._version = 0  # changes whenever the measurements do
        self._fitted_version: int | None = None
        self._fit_size = 0
        self._fit_pairs: set[tuple[int, int]] = set()
        self.params: ThroughputParams | None = None
        self._stats: tuple[float, float] | None = None  # as reported
        self._grad_stats: GradientStats | None = None  # built from it when first read
        self.stats_steps = 0
        self._model: GoodputModel | None = None

    # ------------------------------------------------------------------ intake
    def update_profile(self, profile: Mapping[ConfigKey, Mapping]) -> None:
        """Take a new profile of rank 0 (see :mod:`~pollux_opt.agent.measurements`).
        The profile is replaced, never mutated, by the caller."""
        if profile is self._profile:
            return
        self._profile = profile
        self._measurements = None  # rebuilt when read
        self._version = sum(int(agg["count"]) for agg in profile.values())
        self._model = None

    def add_measurement(self, key: ConfigKey, step_time: float, sync_time: float) -> None:
        """Add the report of configuration ``key`` (seconds); a configuration
        measured before keeps its first report."""
        if key in self._rows:
            return
        self._rows[key] = (step_time, sync_time)
        self._measurements = None
        self._version += 1
        self._model = None

    def __contains__(self, key: ConfigKey) -> bool:
        return key in self._keys

    def update_stats(self, stats: tuple[float, float] | None, steps: int = 0) -> None:
        """Take smoothed ``(grad_sqr, grad_var)`` (or None: none yet) over ``steps`` steps.
        Statistics equal to the last ones, to the bit, keep the goodput model built from them."""
        self.stats_steps = int(steps)
        new = None if stats is None else (stats[0], stats[1])
        if new is not None and self._stats is not None and _same_bits(new, self._stats):
            return
        self._stats = new
        self._grad_stats = None
        self._model = None

    @property
    def reported_stats(self) -> tuple[float, float] | None:
        """``(grad_sqr, grad_var)`` as last reported (None before any)."""
        return self._stats

    @property
    def grad_stats(self) -> GradientStats | None:
        """The reported statistics at M0 (|G|^2 floored at :data:`MIN_GRAD_SQR`,
        the variance at 0), or None before any."""
        if self._grad_stats is None and self._stats is not None:
            sqr, var = self._stats
            self._grad_stats = GradientStats(max(sqr, MIN_GRAD_SQR), max(var, 0.0), self.limits.init_batch_size)
        return self._grad_stats

    def restore(self, profile: Mapping[ConfigKey, Mapping], params: ThroughputParams | None,
                stats: tuple[float, float] | None, steps: int) -> None:
        """Take the state saved in a checkpoint.  The saved parameters stand
        until the measurements differ from those of this agent's last fit."""
        self.update_profile(profile)
        self.update_stats(stats, steps)
        self.params = params

    # ------------------------------------------------------------------ output
    @property
    def measurements(self) -> Measurements:
        """The measurements (read-only arrays, shared by every caller until they change)."""
        if self._measurements is None:
            rows = (Measurements.from_profile(self._profile) if self._profile
                    else Measurements.from_rows((k, *v) for k, v in self._rows.items()))
            self._measurements = rows.read_only()
        return self._measurements

    @property
    def _keys(self):
        """The measured configurations (of whichever intake is in use)."""
        return self._rows or self._profile

    @property
    def most_replicas(self) -> int:
        """The largest replica count measured (0 before any measurement)."""
        return max((key.num_replicas for key in self._keys), default=0)

    def stale(self) -> bool:
        """Whether the throughput fit is out of date under the refit rule."""
        if not self._keys:
            return False  # nothing measured: nothing to fit
        if self.params is None or self._fitted_version is None:
            return True
        if self.refit_growth is None:
            return self._version != self._fitted_version
        pairs = {k[:2] for k in self._keys}
        return not pairs <= self._fit_pairs or len(self._keys) >= self.refit_growth * self._fit_size

    def refit(self) -> ThroughputParams | None:
        """Re-fit if stale; returns the current parameters.  A failed fit keeps
        the previous parameters (and is retried on the next call)."""
        if not self.stale():
            return self.params
        rows = self.measurements
        data = tuple(zip(rows.keys(), zip(rows.step_time.tolist(), rows.sync_time.tolist())))
        params = None if self._fit_cache is None else self._fit_cache.get(data)
        if params is None:
            try:
                params = rows.fit()
            except (InvalidProblem, ValueError, FloatingPointError) as exc:
                logger.warning("throughput fit of job %s failed: %s", self.name, exc)
                return self.params
            if params is None:
                return self.params
            if self._fit_cache is not None:
                self._fit_cache[data] = params
        self.params = params
        keys = self._keys
        self._fitted_version, self._fit_size, self._fit_pairs = self._version, len(keys), {k[:2] for k in keys}
        self._model = None
        return params

    def model(self) -> GoodputModel | None:
        """The job's goodput model after a re-fit if stale (None until it has
        measurements and gradient statistics; see :func:`goodput_model`)."""
        if self._model is None and self._keys:
            if self.grad_stats is None and not self.fixed_batch:
                return None  # no model without statistics: do not fit yet either
            self.refit()
            self._model = goodput_model(self.params, self.grad_stats, self.limits, fixed_batch=self.fixed_batch)
        return self._model

    def batch_model(self) -> GoodputModel | None:
        """The model the job picks its batch with
        (:func:`~pollux_opt.agent.batch.choose_batch`): :meth:`model`, once the
        job has :data:`MIN_STATS_STEPS` steps of gradient statistics or trains
        at a fixed batch (its throughput alone matters); None before."""
        model = self.model()
        return model if self.fixed_batch or self.stats_steps >= MIN_STATS_STEPS else None
