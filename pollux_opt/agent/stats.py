"""Gradient statistics, AdaScale gain and learning-rate scaling (pure Python floats).

Per step, the runtime has ``n >= 2`` micro-batch gradients ``g_1 .. g_n``, each
the mean over ``m`` samples (``n = K (s + 1)``: K replicas times s + 1
accumulation micro-batches; with one replica and no accumulation the local
batch is split into two micro-batches so that ``n >= 2``).  With
``L = mean_i |g_i|^2`` and ``T = |mean_i g_i|^2``, and per-sample gradient
covariance Sigma (trace ``sigma^2``) and true gradient G:

    E[L] = |G|^2 + sigma^2 / m,    E[T] = |G|^2 + sigma^2 / (n m)

so ``(n T - L) / (n - 1)`` is an unbiased estimate of ``|G|^2`` and
``n (L - T) / (n - 1)`` one of ``sigma^2 / m``; scaled by ``m / M0`` the latter
is the gradient variance at the initial batch size, ``grad_var`` of
:class:`~pollux_opt.model.efficiency.GradientStats` (McCandlish et al. 2018, appendix A;
AdaptDL's ``GradientNoiseScale`` uses the same estimators).

Both are smoothed by an exponential moving average with bias correction.  The
AdaScale gain (Johnson et al., ICML 2020) at batch scale ``S = M / M0`` is

    r = (grad_var + grad_sqr) / (grad_var / S + grad_sqr),    1 <= r <= S for S >= 1,

the number of M0-iterations one step at batch M is worth; progress is the sum
of r over steps (Pollux, section 3.1, "scale-invariant iterations").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = [
    "GRAD_STATS_SMOOTHING",
    "MIN_GRAD_SQR_FRACTION",
    "GradStatsEMA",
    "adascale_gain",
    "lr_factor",
    "micro_batch_estimates",
]

#: Per-step weight kept by the moving average of the gradient statistics, at
#: batch scale 1 (the weight is GRAD_STATS_SMOOTHING ** S at scale S, so a large
#: batch, which carries more information, moves the average further; AdaptDL
#: scales its smoothing the same way).  AdaptDL uses 0.999 for GPU jobs of
#: 10^4..10^5 steps; our CPU jobs run 10^2..10^4 steps, so a window of about 20
#: steps (0.95) follows the changing noise scale closely enough.
GRAD_STATS_SMOOTHING = 0.95

#: Lower clip of the smoothed |G|^2 as a fraction of the smoothed variance.  The
#: unbiased estimate of |G|^2 can be <= 0 when noise dominates; the clip bounds the
#: noise scale phi = var / sqr * M0 at M0 / MIN_GRAD_SQR_FRACTION (project choice:
#: 10^4 M0 is far beyond any max_batch_size a job declares).
MIN_GRAD_SQR_FRACTION = 1e-4


def micro_batch_estimates(
    sum_sqr_norms: float, mean_grad_sqr_norm: float, n: int, local_bsz: int, init_batch_size: int
) -> tuple[float, float]:
    """Unbiased (|G|^2, grad_var at M0) from ``n >= 2`` micro-batch gradients of ``local_bsz`` samples.

    Args:
        sum_sqr_norms: sum over the n micro-batch gradients of their squared norms.
        mean_grad_sqr_norm: squared norm of the mean of the n gradients, T.
        n: number of micro-batch gradients (>= 2).
        local_bsz: samples per micro-batch, m.
        init_batch_size: M0.

    Returns:
        (grad_sqr, grad_var) where grad_var is the trace of the covariance of a
        batch of M0 samples; either may be negative for one noisy step.
    """
    if n < 2:
        raise ValueError(f"n must be >= 2 micro-batches to estimate the variance, got {n}")
    mean_sqr = sum_sqr_norms / n
    grad_sqr = (n * mean_grad_sqr_norm - mean_sqr) / (n - 1)
    var_micro = n * (mean_sqr - mean_grad_sqr_norm) / (n - 1)
    return grad_sqr, var_micro * local_bsz / init_batch_size


@dataclass
class GradStatsEMA:
    """Bias-corrected exponential moving averages of grad_sqr and grad_var.

    Plain mutable state of one worker, saved in checkpoints via :meth:`state`.
    """

    sqr: float = 0.0
    var: float = 0.0
    weight: float = 0.0  # sum of the weights given to observations so far, in [0, 1)
    count: int = 0  # observations so far

    def update(self, grad_sqr: float, grad_var: float, scale: float) -> None:
        """Fold in one step's estimates, taken at batch scale ``scale = M / M0``."""
        if not (math.isfinite(grad_sqr) and math.isfinite(grad_var)):
            return
        keep = GRAD_STATS_SMOOTHING ** max(scale, 0.0)
        self.sqr = keep * self.sqr + (1.0 - keep) * grad_sqr
        self.var = keep * self.var + (1.0 - keep) * grad_var
        self.weight = keep * self.weight + (1.0 - keep)
        self.count += 1

    def estimate(self) -> tuple[float, float] | None:
        """Bias-corrected (grad_sqr, grad_var), clipped to valid values; None before data."""
        if self.count == 0 or self.weight <= 0.0:
            return None
        var = max(self.var / self.weight, 0.0)
        sqr = self.sqr / self.weight
        floor = MIN_GRAD_SQR_FRACTION * var
        if not sqr > floor:
            sqr = floor
        if sqr <= 0.0:  # zero gradient and zero variance: nothing to learn from
            return None
        return sqr, var

    def state(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, float]) -> "GradStatsEMA":
        return cls(float(state["sqr"]), float(state["var"]), float(state["weight"]), int(state["count"]))


def adascale_gain(stats: tuple[float, float] | None, scale: float) -> float:
    """AdaScale gain r at batch scale ``scale = M / M0`` given (grad_sqr, grad_var).

    1 at scale 1; before any statistics exist, 1 (no credit for a larger batch:
    progress is never over-counted).  For scale < 1 the same formula gives r < 1.
    """
    if stats is None:
        return 1.0 if scale >= 1.0 else scale
    sqr, var = stats
    return (var + sqr) / (var / scale + sqr)


def lr_factor(rule: str, gain: float, scale: float) -> float:
    """Learning-rate multiplier of ``rule`` (see :data:`~pollux_opt.runtime.spec.LR_SCALING_RULES`)."""
    if rule == "adascale":
        return gain
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "linear":
        return scale
    if rule == "none":
        return 1.0
    raise ValueError(f"unknown lr_scaling rule {rule!r}")
