"""Co-adaptation: the batch configuration a job runs on its allocation (Pollux, section 3.3).

Who chooses the batch: the scheduler's decision, when it carries a batch for
the job (:func:`decided_batch` makes it runnable within the job's limits);
otherwise the job itself (:func:`choose_batch`, from its own fitted model, on
each allocation and again between rounds as measurements arrive).  Either way
a one-replica job without accumulation runs its local batch as two
micro-batches (:func:`executable`).  Pure functions over plain values, shared
by the runtime and the simulator.
"""

from __future__ import annotations

import math

from solvers import InvalidProblem

from pollux_opt.model import BatchConfig, BatchLimits, GoodputModel, GradientStats, ThroughputParams
from pollux_opt.runtime.agent import neutral_stats

__all__ = [
    "ADAPT_MIN_GAIN",
    "MIN_STATS_STEPS",
    "check_allocation",
    "choose_batch",
    "decided_batch",
    "executable",
    "executor_batch",
    "runnable",
    "split_batch",
]

#: Relative goodput gain a new batch configuration must promise before the job
#: switches to it: each switch costs ``warmup_steps`` unmeasured steps and the
#: fitted model is noisy, so near-ties are not worth flapping between (project choice).
ADAPT_MIN_GAIN = 0.02

#: Steps with gradient statistics before the job trusts them to pick a batch
#: larger than M0 (until then it trains at M0, as AdaptDL does).  About one
#: averaging window of the statistics (see ``stats.GRAD_STATS_SMOOTHING``).
MIN_STATS_STEPS = 20

#: Stand-in throughput model used only to split a fixed batch before any
#: measurement exists (the split of a fixed batch does not depend on its values).
_NEUTRAL_PARAMS = ThroughputParams(1e-3, 1e-4, 0.0, 0.0, 0.0, 0.0, 1.0)


def executable(num_replicas: int, config: BatchConfig, limits: BatchLimits) -> BatchConfig:
    """The configuration actually run: with one replica and no accumulation, the
    local batch is run as two micro-batches of half the size, so that every step
    yields two gradients for the variance estimate (see :mod:`~pollux_opt.runtime.stats`).
    The total batch changes by at most one sample; the step is measured as the
    configuration it runs, so the throughput model stays consistent."""
    if num_replicas == 1 and config.accum_steps == 0 and config.local_bsz >= 2:
        half = -(-config.local_bsz // 2)
        if half >= limits.min_local_bsz:
            return BatchConfig(half, 1)
    return config


def split_batch(batch_size: int, replicas: int, max_local_bsz: int, min_local_bsz: int = 1) -> tuple[int, int]:
    """(local_bsz, accum_steps) running a total batch on ``replicas`` replicas.

    ``ceil(B / K)`` samples per replica in the fewest micro-batches of at most
    ``max_local_bsz`` (the Pollux artifact's ``update_local_bsz``), raised to ``min_local_bsz``.
    """
    local = math.ceil(batch_size / replicas)
    accum = max(math.ceil(local / max_local_bsz) - 1, 0)
    atomic = max(math.ceil(local / (accum + 1)), min_local_bsz)
    return atomic, accum


def runnable(local_bsz: int, accum_steps: int, num_replicas: int, limits: BatchLimits, *,
             split_single: bool) -> BatchConfig:
    """``(local_bsz, accum_steps)`` with the micro-batch lowered (to no less than
    1) so that the total batch does not exceed ``limits.max_batch_size`` (the
    artifact caps its atomic batch the same way), then, with ``split_single``,
    as the executor runs it (:func:`executable`)."""
    k = num_replicas
    local = max(min(local_bsz, limits.max_batch_size // (k * (accum_steps + 1))), 1)
    config = BatchConfig(local, accum_steps)
    return executable(k, config, limits) if split_single else config


def decided_batch(config: BatchConfig, num_replicas: int, limits: BatchLimits, *, split_single: bool) -> BatchConfig:
    """The configuration a job runs for the batch a scheduler decided.

    The decided ``(local_bsz, accum_steps)`` when its micro-batch is within the
    limits and it gives the decided total batch on ``num_replicas``; otherwise
    the decided total batch re-split (:func:`split_batch`); then :func:`runnable`.
    A decision without a total batch (``batch_size`` None) stands for its own.
    """
    k = num_replicas
    local, accum = config.local_bsz, config.accum_steps
    total = config.total_batch(k) if config.batch_size is None else config.batch_size
    if not (limits.min_local_bsz <= local <= limits.max_local_bsz) or k * local * (accum + 1) != total:
        local, accum = split_batch(total, k, limits.max_local_bsz, limits.min_local_bsz)
    return runnable(local, accum, k, limits, split_single=split_single)


def executor_batch(config: BatchConfig, num_replicas: int, limits: BatchLimits) -> BatchConfig | None:
    """What a real job runs for a decided batch: :func:`decided_batch` with the
    one-replica split; None (the job then chooses its own) where that needs
    more accumulation steps than ``limits.max_accum_steps``."""
    run = decided_batch(config, num_replicas, limits, split_single=True)
    return run if run.accum_steps <= limits.max_accum_steps else None


def check_allocation(limits: BatchLimits, num_nodes: int, num_replicas: int, fixed_batch_size: int | None) -> None:
    """Raise InvalidProblem if no batch configuration fits ``num_replicas`` replicas."""
    model = GoodputModel(_NEUTRAL_PARAMS, neutral_stats(limits), limits)
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
    model_stats = stats if (stats is not None and adaptive) else neutral_stats(limits)
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

    cur_batch = current.total_batch(num_replicas)
    current_allowed = (
        limits.min_local_bsz <= current.local_bsz <= limits.max_local_bsz
        and current.accum_steps <= limits.max_accum_steps
        and (
            (adaptive and limits.init_batch_size <= cur_batch <= limits.max_batch_size + num_replicas)
            or (not adaptive and abs(cur_batch - new.total_batch(num_replicas)) <= num_replicas)
        )
    )
    if current_allowed and value(new) <= value(current) * (1.0 + ADAPT_MIN_GAIN):
        return current
    return new


def params_to_dict(params: ThroughputParams | None) -> dict | None:
    if params is None:
        return None
    return params.to_dict()


def params_from_dict(data: dict | None) -> ThroughputParams | None:
    if not data:
        return None
    return ThroughputParams(**{k: float(v) for k, v in data.items()})
