"""The bounded least-squares run of the throughput fit, to the bit that of
:func:`scipy.optimize.least_squares` with its default forward-difference
Jacobian, in fewer Python calls.

``least_squares(fun, x0, bounds=(lower, upper), x_scale="jac", method="trf")``
spends most of a small fit in its own bookkeeping: a wrapper object per run,
a copy and a comparison of the point on every call, and one residual
evaluation per column of each finite-difference Jacobian.  Here the residuals
come from a *batch* function (float[B, F] points to float[B, M] residuals, row
``b`` bit-identical to a one-point call), the Jacobian takes the same steps as
scipy's ``approx_derivative(method="2-point", bounds=...)`` and evaluates all
of them in one batch, and the trust-region-reflective iteration is scipy's own
(``scipy.optimize._lsq.trf.trf_bounds``, a private function).  Where this scipy
lacks that function or takes other arguments, :func:`scipy.optimize.least_squares`
runs with the same Jacobian as a callable (the same answer, more overhead).
"""

from __future__ import annotations

import inspect

import numpy as np
from scipy.optimize import OptimizeResult, least_squares

try:  # scipy's own iteration, without least_squares' per-call wrappers
    from scipy.optimize._lsq.common import make_strictly_feasible
    from scipy.optimize._lsq.least_squares import TERMINATION_MESSAGES
    from scipy.optimize._lsq.trf import trf_bounds
    _TRF_ARGS = ("fun", "jac", "x0", "f0", "J0", "lb", "ub", "ftol", "xtol", "gtol", "max_nfev",
                 "x_scale", "loss_function", "tr_solver", "tr_options", "verbose")
    _DIRECT = tuple(inspect.signature(trf_bounds).parameters)[:len(_TRF_ARGS)] == _TRF_ARGS
except (ImportError, AttributeError, ValueError, TypeError):  # pragma: no cover - other scipy layouts
    _DIRECT = False

__all__ = ["BatchProblem", "least_squares_trf"]

#: Relative forward-difference step of scipy's "2-point" Jacobian for float64.
_REL_STEP = np.finfo(np.float64).eps ** 0.5

#: least_squares' default tolerances (ftol, xtol, gtol).
_TOL = 1e-8


class BatchProblem:
    """Residuals and their forward-difference Jacobian from a batch function.

    Args:
        batch: float[B, F] points -> float[B, M] residuals (row ``b`` equal,
            to the bit, to the residuals of point ``b`` alone).
        lower, upper: float[F] bounds of the parameters.
    """

    def __init__(self, batch, lower: np.ndarray, upper: np.ndarray) -> None:
        self._batch = batch
        self._lb = np.asarray(lower, dtype=float)
        self._ub = np.asarray(upper, dtype=float)
        self._x: np.ndarray | None = None
        self._f: np.ndarray | None = None

    def fun(self, x: np.ndarray) -> np.ndarray:
        """float[M] residuals of the point float[F] (kept for the Jacobian at the same point)."""
        f = self._batch(x[None, :])[0]
        self._x, self._f = x.copy(), f
        return f

    def steps(self, x0: np.ndarray) -> np.ndarray:
        """float[F] forward-difference steps at ``x0``: ``approx_derivative``'s "2-point" steps within bounds."""
        sign = (x0 >= 0).astype(float) * 2 - 1
        h = _REL_STEP * sign * np.maximum(1.0, np.abs(x0))
        lower_dist = x0 - self._lb
        upper_dist = self._ub - x0
        x = x0 + h
        violated = (x < self._lb) | (x > self._ub)
        fitting = np.abs(h) <= np.maximum(lower_dist, upper_dist)
        h[violated & fitting] *= -1
        forward = (upper_dist >= lower_dist) & ~fitting
        h[forward] = upper_dist[forward]
        backward = (upper_dist < lower_dist) & ~fitting
        h[backward] = -lower_dist[backward]
        return h

    def jac(self, x0: np.ndarray) -> np.ndarray:
        """float[M, F] forward-difference Jacobian at ``x0`` (all steps in one batch)."""
        if self._x is not None and np.array_equal(x0, self._x):
            f0 = self._f
        else:
            f0 = self.fun(x0)
        h = self.steps(x0)
        n = x0.size
        stepped = x0 + h
        points = np.repeat(x0[None, :], n, axis=0)
        points[np.arange(n), np.arange(n)] = stepped
        jac_t = (self._batch(points) - f0) / (stepped - x0)[:, None]
        return jac_t.T


def least_squares_trf(problem: BatchProblem, x0: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> OptimizeResult:
    """``least_squares(problem.fun, x0, bounds=(lower, upper), x_scale="jac", method="trf")``.

    Same iterates and result, to the bit, as scipy's default "2-point"
    Jacobian; ``result.x``, ``cost``, ``status``, ``message`` and ``success``
    as least_squares gives them.

    Raises:
        ValueError: ``x0`` outside the bounds or residuals not finite there
            (as least_squares).
    """
    if not _DIRECT:  # pragma: no cover - other scipy layouts
        return least_squares(problem.fun, x0, jac=problem.jac, bounds=(lower, upper), x_scale="jac", method="trf")
    lb, ub = np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)
    x0 = np.atleast_1d(x0).astype(float)
    if not np.all((x0 >= lb) & (x0 <= ub)):
        raise ValueError("Initial guess is outside of provided bounds")
    x0 = make_strictly_feasible(x0, lb, ub)
    f0 = problem.fun(x0)
    if not np.all(np.isfinite(f0)):
        raise ValueError("Residuals are not finite in the initial point.")
    j0 = problem.jac(x0)
    result = trf_bounds(problem.fun, problem.jac, x0, f0, j0, lb, ub, _TOL, _TOL, _TOL, None,
                        "jac", None, "exact", {}, 0)
    result.message = TERMINATION_MESSAGES[result.status]
    result.success = result.status > 0
    return result
