"""Co-adaptation: the batch configuration a job uses on its allocation (Pollux, section 3.3).

The controller fits :class:`~pollux_opt.model.goodput.ThroughputParams` to the job's
own measurements and asks :meth:`GoodputModel.optimize` for the local batch
and accumulation steps on the current allocation; the workers apply the
choice at the next step boundary.  Pure functions over plain values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model.goodput import BatchLimits, GoodputModel, GradientStats, ThroughputParams

__all__ = [
    "ADAPT_MIN_GAIN",
    "MIN_STATS_STEPS",
    "BatchConfig",
    "check_allocation",
    "choose_batch",
    "executable",
    "profile_key",
]

#: Relative goodput gain a new batch configuration must promise before the job
#: switches to it: each switch costs ``warmup_steps`` unmeasured steps and the
#: fitted model is noisy, so near-ties are not worth flapping between (project choice).
ADAPT_MIN_GAIN = 0.02

#: Steps with gradient statistics before the job trusts them to pick a batch
#: larger than M0 (until then it trains at M0, as AdaptDL does).  About one
#: averaging window of the statistics (see ``_stats.GRAD_STATS_SMOOTHING``).
MIN_STATS_STEPS = 20

#: Stand-in throughput model used only to split a fixed batch before any
#: measurement exists (the split of a fixed batch does not depend on its values).
_NEUTRAL_PARAMS = ThroughputParams(1e-3, 1e-4, 0.0, 0.0, 0.0, 0.0, 1.0)


@dataclass(frozen=True)
class BatchConfig:
    """Per-replica micro-batch ``local_bsz`` and extra ``accum_steps`` micro-batches."""

    local_bsz: int
    accum_steps: int

    def batch_size(self, num_replicas: int) -> int:
        return num_replicas * self.local_bsz * (self.accum_steps + 1)


def profile_key(num_nodes: int, num_replicas: int, local_bsz: int, accum_steps: int) -> str:
    """Key of a configuration in the measurement profile (JSON-safe)."""
    return f"{num_nodes},{num_replicas},{local_bsz},{accum_steps}"


def executable(num_replicas: int, config: BatchConfig, limits: BatchLimits) -> BatchConfig:
    """The configuration actually run: with one replica and no accumulation, the
    local batch is run as two micro-batches of half the size, so that every step
    yields two gradients for the variance estimate (see ``_stats``).  The total
    batch changes by at most one sample; the step is measured as the
    configuration it runs, so the throughput model stays consistent."""
    if num_replicas == 1 and config.accum_steps == 0 and config.local_bsz >= 2:
        half = -(-config.local_bsz // 2)
        if half >= limits.min_local_bsz:
            return BatchConfig(half, 1)
    return config


def _neutral_stats(limits: BatchLimits) -> GradientStats:
    return GradientStats(grad_sqr=1.0, grad_var=0.0, init_batch_size=limits.init_batch_size)


def check_allocation(limits: BatchLimits, num_nodes: int, num_replicas: int, fixed_batch_size: int | None) -> None:
    """Raise InvalidProblem if no batch configuration fits ``num_replicas`` replicas."""
    model = GoodputModel(_NEUTRAL_PARAMS, _neutral_stats(limits), limits)
    choice = model.optimize(num_nodes, num_replicas, fixed_batch_size=fixed_batch_size)
    if not bool(choice.feasible):
        what = f"fixed_batch_size={fixed_batch_size}" if fixed_batch_size else "the job's batch limits"
        raise InvalidProblem(
            f"num_replicas={num_replicas} admits no batch configuration under {what} ({limits})"
        )


def choose_batch(
    limits: BatchLimits,
    num_nodes: int,
    num_replicas: int,
    *,
    params: ThroughputParams | None,
    stats: GradientStats | None,
    stats_steps: int,
    fixed_batch_size: int | None,
    current: BatchConfig | None = None,
) -> BatchConfig:
    """The executable batch configuration for an allocation.

    * fixed mode: ``fixed_batch_size`` split for throughput;
    * adaptive mode, before a fit or before ``MIN_STATS_STEPS`` steps of
      statistics: M0 split for throughput;
    * adaptive mode otherwise: the goodput-optimal configuration.

    ``current`` (the configuration in use on this same allocation) is kept
    unless the new one promises ``ADAPT_MIN_GAIN`` more goodput.
    """
    model_params = params if params is not None else _NEUTRAL_PARAMS
    adaptive = fixed_batch_size is None and params is not None and stats is not None and stats_steps >= MIN_STATS_STEPS
    model_stats = stats if (stats is not None and adaptive) else _neutral_stats(limits)
    model = GoodputModel(model_params, model_stats, limits)
    batch = None if adaptive else (fixed_batch_size or limits.init_batch_size)
    choice = model.optimize(num_nodes, num_replicas, fixed_batch_size=batch)
    if not bool(choice.feasible):
        check_allocation(limits, num_nodes, num_replicas, fixed_batch_size)  # raises with the reason
        raise InvalidProblem(f"num_replicas={num_replicas} admits no batch configuration")  # pragma: no cover
    new = executable(num_replicas, BatchConfig(int(choice.local_bsz), int(choice.accum_steps)), limits)
    if current is None or current == new or params is None:
        return new

    def value(cfg: BatchConfig) -> float:
        if adaptive:
            return float(model.goodput(num_nodes, num_replicas, cfg.local_bsz, cfg.accum_steps))
        return float(model.throughput(num_nodes, num_replicas, cfg.local_bsz, cfg.accum_steps))

    cur_batch = current.batch_size(num_replicas)
    current_allowed = (
        limits.min_local_bsz <= current.local_bsz <= limits.max_local_bsz
        and current.accum_steps <= limits.max_accum_steps
        and (
            (adaptive and limits.init_batch_size <= cur_batch <= limits.max_batch_size + num_replicas)
            or (not adaptive and abs(cur_batch - new.batch_size(num_replicas)) <= num_replicas)
        )
    )
    if current_allowed and value(new) <= value(current) * (1.0 + ADAPT_MIN_GAIN):
        return current
    return new


def fit_params(profile: dict) -> ThroughputParams | None:
    """Fit the throughput model to a profile ``{key: {count, step, sync, compute}}`` (sums)."""
    from pollux_opt.runtime.report import Measurements

    rows = Measurements.from_profile(profile)
    if len(rows) == 0:
        return None
    return rows.fit()


def finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def params_to_dict(params: ThroughputParams | None) -> dict | None:
    if params is None:
        return None
    return params.to_dict()


def params_from_dict(data: dict | None) -> ThroughputParams | None:
    if not data:
        return None
    return ThroughputParams(**{k: float(v) for k, v in data.items()})


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error, in percent."""
    predicted = np.asarray(predicted, dtype=float)
    measured = np.asarray(measured, dtype=float)
    return float(np.mean(np.abs(predicted - measured) / measured) * 100.0)
