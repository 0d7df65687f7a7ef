"""Statistical efficiency of a training batch (Pollux, OSDI 2021, section 3.1).

From the gradient noise scale measured at the initial batch size ``M0``::

    phi  = grad_var / grad_sqr * M0             gradient noise scale (samples)
    E(M) = (phi + M0) / (phi + M)               E(M0) = 1, non-increasing in M

Goodput is throughput times ``E(M)`` (:mod:`pollux_opt.model.goodput`).

References:
    A. Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized
    Deep Learning", OSDI 2021, section 3.1.
    S. McCandlish et al., "An Empirical Model of Large-Batch Training",
    arXiv:1812.06162, 2018 (gradient noise scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model.validate import as_count, as_numeric, first_bad

__all__ = ["GradientStats", "efficiency"]


@dataclass(frozen=True)
class GradientStats:
    """Gradient statistics measured at the initial batch size (McCandlish et al. 2018).

    Attributes:
        grad_sqr: squared norm of the true gradient, |g|^2 (> 0, finite).
        grad_var: trace of the gradient covariance of a batch of ``init_batch_size``
            samples (>= 0, finite), in the same units as ``grad_sqr``.
        init_batch_size: M0, the batch size (samples) the statistics were measured at.
    """

    grad_sqr: float
    grad_var: float
    init_batch_size: int

    def __post_init__(self) -> None:
        for name in ("grad_sqr", "grad_var"):
            value = getattr(self, name)
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise InvalidProblem(f"{name} must be a number, got {value!r}") from None
            object.__setattr__(self, name, value)
        if not (math.isfinite(self.grad_sqr) and self.grad_sqr > 0):
            raise InvalidProblem(f"grad_sqr must be finite and > 0, got {self.grad_sqr!r}")
        if not (math.isfinite(self.grad_var) and self.grad_var >= 0):
            raise InvalidProblem(f"grad_var must be finite and >= 0, got {self.grad_var!r}")
        object.__setattr__(self, "init_batch_size", as_count("init_batch_size", self.init_batch_size, 1))

    @property
    def noise_scale(self) -> float:
        """phi = grad_var / grad_sqr * M0, the gradient noise scale in samples."""
        return self.grad_var / self.grad_sqr * self.init_batch_size


def unchecked_efficiency(phi: float, m0: float, batch):
    """Unchecked E(M) for noise scale ``phi``, M0 ``m0`` and total batch ``batch`` (samples)."""
    return (phi + m0) / (phi + batch)


def efficiency(stats: GradientStats, batch_size) -> np.ndarray:
    """Statistical efficiency E(M) = (phi + M0) / (phi + M) (Pollux, eq. 2).

    Args:
        stats: gradient statistics measured at M0.
        batch_size: array-like total batch M > 0, samples per optimizer step.

    Returns:
        float64 array of ``batch_size``'s shape, in (0, 1] for M >= M0.
    """
    given = as_numeric("batch_size", batch_size)
    batch = given.astype(np.float64)
    bad = ~np.isfinite(batch) | (batch <= 0)
    if bad.any():
        raise InvalidProblem(f"batch_size must be finite and > 0, got {first_bad(given, bad)}")
    return unchecked_efficiency(stats.noise_scale, stats.init_batch_size, batch)
