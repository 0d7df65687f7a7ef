"""Co-adaptation: the batch configuration a job runs on its allocation (Pollux, OSDI 2021, section 3.3).

The scheduler decides where a job runs and on how many replicas; the job picks
its batch for that allocation (:func:`choose_batch`) with its own, freshest
goodput model, on each new allocation and again as its model improves, as
Pollux's PolluxAgent and AdaptDL do.  One rule for the real runtime and the
simulator; the allocator's speedups are goodputs at the batch the same
:meth:`~pollux_opt.model.GoodputModel.optimize` picks.
"""

from __future__ import annotations

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model import BatchConfig, BatchLimits, GoodputModel
from pollux_opt.model.batch import search_start

__all__ = ["ADAPT_MIN_GAIN", "choose_batch", "split_batch"]

#: Relative gain (goodput, or throughput at a fixed batch) a new batch
#: configuration must promise before the job switches to it on the same
#: allocation: each switch costs ``warmup_steps`` unmeasured steps and the
#: fitted model is noisy, so near-ties are not worth flapping between (project choice).
ADAPT_MIN_GAIN = 0.02


def split_batch(batch_size: int, num_replicas: int, limits: BatchLimits) -> tuple[int, int]:
    """(local_bsz, accum_steps) of a total batch on ``num_replicas`` replicas:
    ``ceil(B / K)`` samples per replica in the fewest micro-batches of at most
    ``max_local_bsz`` (the Pollux artifact's ``update_local_bsz``), raised to
    ``min_local_bsz``.  As many accumulation steps as that takes: a fixed batch
    is the user's choice, not bound by ``max_accum_steps`` (which bounds the
    goodput search); the total batch is at least B."""
    local = -(-batch_size // num_replicas)
    accum = max(-(-local // limits.max_local_bsz) - 1, 0)
    return max(-(-local // (accum + 1)), limits.min_local_bsz), accum


def _admits(limits: BatchLimits, num_replicas: int) -> bool:
    """Whether some configuration of ``num_replicas`` replicas is within ``limits``
    (``M0 <= K m (s + 1) <= max_batch_size``, the goodput search's domain)."""
    k = np.array([float(num_replicas)])
    return bool(search_start(limits, np.ones(1), k).ok.any())


def choose_batch(
    limits: BatchLimits,
    num_nodes: int,
    num_replicas: int,
    model: GoodputModel | None,
    *,
    fixed_batch_size: int | None = None,
    current: BatchConfig | None = None,
    split_single: bool = True,
) -> BatchConfig:
    """The batch configuration a job runs on ``num_replicas`` replicas over ``num_nodes`` nodes.

    * at a fixed batch (``fixed_batch_size`` B, a job run at its submitted
      configuration): B split for throughput (:func:`split_batch`);
    * co-adapting with a ``model`` the job trusts: the goodput-optimal
      configuration (:meth:`GoodputModel.optimize`);
    * co-adapting without one (not measured yet): M0, split as a fixed batch.

    The micro-batch is then lowered (to no less than 1) so that the total batch
    does not exceed ``limits.max_batch_size``.  With ``split_single`` a
    one-replica job without accumulation runs its local batch as two
    micro-batches of half the size, so that every step yields two gradients
    for the variance estimate (:mod:`~pollux_opt.agent.stats`); the step is
    measured as the configuration it runs, so the throughput model stays
    consistent.  ``current`` (the configuration in use on this same
    allocation) is kept unless ``model`` predicts the new one
    :data:`ADAPT_MIN_GAIN` better (goodput, or throughput at a fixed batch).

    Raises:
        InvalidProblem: a co-adapting job whose limits admit no configuration
            on ``num_replicas`` replicas.
    """
    k = num_replicas
    adaptive = fixed_batch_size is None
    if adaptive and model is not None:
        choice = model.optimize(num_nodes, k)
        local, accum, feasible = int(choice.local_bsz), int(choice.accum_steps), bool(choice.feasible)
    else:
        local, accum = split_batch(fixed_batch_size or limits.init_batch_size, k, limits)
        feasible = not adaptive or _admits(limits, k)  # a user's fixed batch always runs
    if not feasible:
        raise InvalidProblem(f"num_replicas={k} admits no batch configuration under the job's batch limits ({limits})")
    local = max(min(local, limits.max_batch_size // (k * (accum + 1))), 1)
    if split_single and k == 1 and accum == 0 and local >= 2 and -(-local // 2) >= limits.min_local_bsz:
        local, accum = -(-local // 2), 1
    new = BatchConfig(local, accum)
    if current is None or current == new or model is None:
        return new
    return current if _keeps(model, limits, num_nodes, k, current, new, adaptive) else new


def _keeps(model: GoodputModel, limits: BatchLimits, num_nodes: int, k: int,
           current: BatchConfig, new: BatchConfig, adaptive: bool) -> bool:
    """Whether the job keeps ``current`` rather than switch to ``new``: it is within
    the limits (co-adapting: a total batch from M0 to the largest; at a fixed
    batch: the same total batch give or take one sample a replica) and ``new``
    does not promise :data:`ADAPT_MIN_GAIN` more."""
    value = model.goodput if adaptive else model.throughput
    cur_batch = current.total_batch(k)
    allowed = (
        limits.min_local_bsz <= current.local_bsz <= limits.max_local_bsz
        and current.accum_steps <= limits.max_accum_steps
        and (limits.init_batch_size <= cur_batch <= limits.max_batch_size + k if adaptive
             else abs(cur_batch - new.total_batch(k)) <= k)
    )
    if not allowed:
        return False
    promised = float(value(num_nodes, k, new.local_bsz, new.accum_steps))
    return promised <= float(value(num_nodes, k, current.local_bsz, current.accum_steps)) * (1.0 + ADAPT_MIN_GAIN)
