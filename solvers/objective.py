"""The pinned objective's arithmetic: the power mean, computed stably, and the solvers' utility scales.

:func:`power_mean` is the pinned objective ``M_p = (sum_j w_j y_j^p / W)^(1/p)``
of ``y_j = x_j + EPS`` (the weighted geometric mean for p = 0).  It keeps the
direct formula where that is exact to a few ulps and switches to log space
(:func:`_log_power_mean`) where the direct formula cancels (tiny |p|) or
overflows (large |p| with very small or very large y).

A solver maximises ``M_p`` through a separable *utility sum*
``U = sum_j w_j u(y_j)`` with ``u`` increasing, so that ``M_p`` is an increasing
function of ``U``.  :func:`utility` is the plain ``sign(p) y^p`` (``log y`` for
p = 0).  :class:`UtilityScale` is the positive affine rescaling of it that the
MILP and the greedy use: the plain one where it is well conditioned (every
ordinary instance), otherwise the Box-Cox form ``((y / ref)^p - 1) / p``,
whose differences between a job's choices are of order one whatever ``p``
and the speedups' magnitude (the plain form's differences vanish below
HiGHS's tolerances: ``y^p`` varies by 1e-8 when |p| = 1e-8, and ``y^-3``
by 1e-7 for speedups near 100).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EPS",
    "GEOMETRIC_P",
    "UtilityScale",
    "mean_from_utility_sum",
    "power_mean",
    "utility",
]

#: Offset inside the power mean so that a job with no replicas (x = 0) keeps
#: the mean finite for p <= 0.  Pinned by the project's objective definition
#: (the Pollux reference scales speedups by 0.25 so that this plays the same role).
EPS = 1e-3

#: |p| below this is the p -> 0 limit, the weighted geometric mean.  M_p and
#: M_0 differ by a factor ``exp(p var(log y) / 2)`` to first order, and
#: ``var(log y) <= log(MAX_SPEEDUP / EPS)^2 < 1000`` in the problem's domain, so
#: the two agree to 5e-10 relative below 1e-12, while the log-space formula
#: itself loses digits once ``p log y`` nears the smallest normal float.
GEOMETRIC_P = 1e-12

#: The direct formula ``(sum w y^p / W)^(1/p)`` is kept for |p| at least this:
#: its relative error is about ``1e-16 / |p|`` (the inner mean is 1 + O(p)),
#: so 1e-13 here; below it the log-space formula takes over.
DIRECT_P = 2.0**-10

#: :class:`UtilityScale` keeps the plain utility when |p| >= 1 and the
#: dominant job's term ``w y^p`` lies within 2^-6 .. 2^16 (octaves).  Below,
#: HiGHS's absolute MIP gap (``mip_abs_gap``, 1e-6) would exceed 6e-5 of the
#: utility sum and its 1e-7 tolerances the differences between choices; above,
#: the "hold nothing" and option terms approach HiGHS's cost limits.  Every
#: instance of the solver snapshot (random clusters, edge cases, the 18 Pollux
#: anchor rounds, p in {-4, -1, 1}) lies within -4.3 .. 6.9.
PLAIN_OCTAVES = (-6.0, 16.0)

#: Largest magnitude of a (weight-normalised) utility: HiGHS treats costs of
#: 1e20 and more as infinite, and the MILP still proved optimal answers with
#: "hold nothing" costs of 1e15 (p = -5 on unit speedups) where 1e18 (p = -6)
#: gave wrong ones.  A utility below ``-UTILITY_FLOOR`` is raised to it (for
#: p < 0 only "hold nothing" and speedups over 1000 times below the worst
#: job's best reach it, see docs/formulation.md).
UTILITY_FLOOR = 2.0**50


def utility(x: np.ndarray, p: float, eps: float = EPS) -> np.ndarray:
    """Per-job term u(x) whose weighted sum is maximised, monotone increasing in x.

    ``u = (x + eps)^p`` for p > 0, ``log(x + eps)`` for p = 0, and
    ``-(x + eps)^p`` for p < 0, so maximising ``sum_j w_j u(x_j)`` maximises the
    power mean M_p for every p.
    """
    y = np.asarray(x, dtype=np.float64) + eps
    if p == 0:
        return np.log(y)
    return np.sign(p) * np.power(y, p)


def _log_power_mean(y: np.ndarray, w: np.ndarray, p: float) -> float:
    """``log M_p`` of ``y`` > 0 with weights ``w`` > 0, stable for every finite p != 0.

    ``log(sum (w/W) e^(p l)) = m + log1p(sum (w/W) expm1(p l - m))`` with
    ``l = log y`` and ``m = max p l``: no overflow, and no cancellation when
    all ``p l`` are tiny (expm1 and log1p keep their relative precision).
    """
    a = p * np.log(y)
    m = float(np.max(a))
    share = w / np.sum(w)
    return (m + math.log1p(float(np.sum(share * np.expm1(a - m))))) / p


def power_mean(x: np.ndarray, w: np.ndarray, p: float, eps: float = EPS) -> float:
    """Weighted power mean ``(sum w (x+eps)^p / sum w)^(1/p)`` (geometric for p = 0).

    The geometric mean for |p| < ``GEOMETRIC_P``; the direct formula for
    |p| >= ``DIRECT_P`` when its inner mean is a finite normal number; the
    log-space formula otherwise.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if x.size == 0:
        return 0.0
    y = x + eps
    if abs(p) < GEOMETRIC_P:
        return float(np.exp(np.sum(w * np.log(y)) / np.sum(w)))
    if abs(p) >= DIRECT_P:
        with np.errstate(over="ignore", under="ignore"):
            inner = np.sum(w * np.power(y, p)) / np.sum(w)
        if np.isfinite(inner) and inner >= np.finfo(np.float64).tiny:
            return float(inner ** (1.0 / p))
    return float(math.exp(_log_power_mean(y, w, p)))


def mean_from_utility_sum(total: float, w_sum: float, p: float) -> float:
    """Invert :func:`utility`: the power mean given ``sum_j w_j u(x_j)``."""
    if p == 0:
        return float(math.exp(total / w_sum))
    inner = total / w_sum * (1.0 if p > 0 else -1.0)
    if inner <= 0:
        return float("inf") if p < 0 else 0.0
    return float(inner ** (1.0 / p))


def _power_of_two(value: float) -> float:
    """The power of two nearest ``value`` > 0 in log scale (scaling by it is exact)."""
    return float(2.0 ** round(math.log2(value)))


@dataclass(frozen=True)
class UtilityScale:
    """The utility ``u`` a solver sums, a positive affine rescaling of :func:`utility`.

    ``kind`` is one of

    * ``"plain"``: :func:`utility` itself (every ordinary instance);
    * ``"log"``: ``log y``, for p = 0 and |p| < ``GEOMETRIC_P``, with the
      weights scaled by the power of two nearest ``1 / max w``;
    * ``"scaled"`` (|p| >= 1): ``sign(p) (y / ref)^p``;
    * ``"box_cox"`` (0 < |p| < 1): ``expm1(p log(y / ref)) / p``, whose p -> 0
      limit is ``log(y / ref)``: no constant 1/p swamps the differences.

    For the last two, the *dominant* job is the one whose best choice has the
    largest term ``w_j best_j^p`` (it decides the power mean); ``ref`` is its
    best ``y`` and the weights are scaled by ``weight_scale`` (the power of two
    nearest ``1 / w``), so that its term is about 1 and its choices differ by
    order one.  Utilities below ``-UTILITY_FLOOR`` are raised to it (for p < 0:
    "hold nothing", and speedups far below the dominant job's).  Build one
    with :meth:`of`.
    """

    p: float
    kind: str
    ref: float = 1.0
    weight_scale: float = 1.0

    @staticmethod
    def of(p: float, best_y: np.ndarray, weight: np.ndarray) -> "UtilityScale":
        """The scale for exponent ``p``, each job's best ``y`` float64[J] (-inf: none) and weights float64[J]."""
        best_y, weight = np.asarray(best_y, dtype=np.float64), np.asarray(weight, dtype=np.float64)
        if p == 0 or abs(p) < GEOMETRIC_P:
            # The choices' log differences are order one only at weights near 1:
            # rescale (exactly, by a power of two) by the largest weight.
            top_weight = float(weight.max()) if weight.size else 1.0
            return UtilityScale(p=0.0, kind="log", weight_scale=_power_of_two(1.0 / top_weight))
        has = np.isfinite(best_y) & (best_y > 0)
        if not has.any():
            return UtilityScale(p=p, kind="plain")
        log_term = np.where(has, np.log(weight) + p * np.log(np.where(has, best_y, 1.0)), -np.inf)
        top = int(np.argmax(log_term))
        octaves = float(log_term[top]) / math.log(2.0)  # log2 of the dominant term w y^p
        # Magnitude of the plain utility's "hold nothing" term, w EPS^p (inf past float range).
        idle = 0.0 if p > 0 else float(weight.max()) * EPS**p if p * math.log2(EPS) < 1000 else math.inf
        if abs(p) >= 1 and PLAIN_OCTAVES[0] <= octaves <= PLAIN_OCTAVES[1] and idle <= UTILITY_FLOOR:
            return UtilityScale(p=p, kind="plain")
        kind = "scaled" if abs(p) >= 1 else "box_cox"
        return UtilityScale(p=p, kind=kind, ref=float(best_y[top]), weight_scale=_power_of_two(1.0 / weight[top]))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """u of ``x`` (``y = x + EPS``), float64 like ``x``."""
        if self.kind == "plain":
            return utility(x, self.p)
        y = np.asarray(x, dtype=np.float64) + EPS
        if self.kind == "log":
            return np.log(y)
        with np.errstate(over="ignore"):
            t = self.p * np.log(y / self.ref)
            u = np.sign(self.p) * np.exp(t) if self.kind == "scaled" else np.expm1(t) / self.p
        return np.maximum(u, -UTILITY_FLOOR)

    def mean(self, total: float, w_sum: float) -> float:
        """The power mean M_p of a utility sum ``total`` with weights summing to ``w_sum``.

        ``total`` and ``w_sum`` are on this scale (weights times
        ``weight_scale``).  Increasing in ``total``, so the mean of an upper
        bound on the utility sum bounds M_p; the floor only raises
        utilities, so that still holds with it.
        """
        if self.kind == "plain":
            return mean_from_utility_sum(total, w_sum, self.p)
        if self.kind == "log":
            return float(math.exp(total / w_sum))
        if self.kind == "scaled":
            inner = math.copysign(1.0, self.p) * total / w_sum  # the weighted mean of (y / ref)^p
            if inner <= 0:
                return float("inf") if self.p < 0 else 0.0
            return float(self.ref * math.exp(math.log(inner) / self.p))
        inner = 1.0 + self.p * (total / w_sum)  # the weighted mean of (y / ref)^p
        if inner <= 0:
            return float("inf") if self.p < 0 else 0.0
        return float(self.ref * math.exp(math.log1p(self.p * (total / w_sum)) / self.p))
