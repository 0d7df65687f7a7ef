"""Fitting the throughput model to measured step and sync times (Pollux, OSDI 2021, section 4.1).

The parameters of :class:`~pollux_opt.model.throughput.ThroughputParams` are
fitted by bounded least squares on log times (:func:`fit_throughput`);
dimensions never observed are fixed to optimistic priors instead of being
fitted to noise ("prior-driven exploration"), so that a scheduler keeps
trying larger allocations.

References:
    A. Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized
    Deep Learning", OSDI 2021, sections 3.2 and 4.1.
"""

from __future__ import annotations

import logging

import numpy as np

from pollux_opt.model.throughput import (
    GAMMA_MAX, GAMMA_MIN, I_AA, I_AC, I_AN, I_AR, I_BC, I_BN, I_BR, I_GAMMA, I_KAPPA, PARAM_NAMES, ThroughputParams,
)
from pollux_opt.model.throughput_priors import (
    COLOCATION_PRIOR_WEIGHT,
    GAMMA_PRIOR,
    INTER_NODE_PRIOR_FACTOR,
    RETROGRESSION_PRIOR_WEIGHT,
    FitLayout,
    FitRows,
    fit_layout,
)
from pollux_opt.model.throughput_lsq import BatchProblem, least_squares_trf

__all__ = [
    "COLOCATION_PRIOR_WEIGHT",
    "GAMMA_PRIOR",
    "INTER_NODE_PRIOR_FACTOR",
    "RETROGRESSION_PRIOR_WEIGHT",
    "fit_throughput",
]

logger = logging.getLogger(__name__)

#: Smallest value (seconds) of parameters that must stay positive during the fit
#: (alpha_c, beta_c, alpha_n, alpha_r) so that log step / sync times stay finite.
#: Far below any measurable time, so a fitted value at this floor means "zero".
PARAM_FLOOR_S = 1e-9

#: Starting values of gamma for the multi-start fit: the objective is not convex
#: in gamma, so a few starts spread over [GAMMA_MIN, GAMMA_MAX] avoid a poor
#: local minimum.  Project choice; three starts keep the fit within milliseconds.
GAMMA_STARTS = (1.0, 2.5, 6.0)

#: Starting value of an intra/inter-node latency (alpha_n, alpha_r) as a fraction of
#: the median compute time, used only when no sync time was measured there.
SYNC_INIT_FRACTION = 0.1

#: Lower clip of the linear-regression starting values of alpha_c and beta_c * m,
#: as a fraction of the median compute time (keeps starts strictly inside bounds).
COMPUTE_INIT_FRACTION = 1e-3

#: Starting value of kappa in the fit (strictly inside its bound of 0).
KAPPA_INIT = 0.1


def _initial_guess(nodes, replicas, m, s, step, sync, sync_ok) -> np.ndarray:
    """float[9] starting point (before gamma multi-start), from linear regressions."""
    theta = np.zeros(len(PARAM_NAMES))
    per_micro = step / (s + 1.0)
    single = replicas == 1
    rows = single if single.any() else np.ones_like(single)
    y, x = per_micro[rows], m[rows]
    median_c = float(np.median(y))
    if np.unique(x).size >= 2:
        a, b = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]), y, rcond=None)[0]
    else:
        a, b = median_c / 2.0, median_c / (2.0 * x[0])
    theta[I_AC] = max(a, COMPUTE_INIT_FRACTION * median_c)
    theta[I_BC] = max(b, COMPUTE_INIT_FRACTION * median_c / float(np.median(x)))
    theta[I_AA] = theta[I_AC]
    theta[I_KAPPA] = KAPPA_INIT
    for locality, ia, ib in ((replicas > 1) & (nodes == 1), I_AN, I_BN), ((nodes > 1), I_AR, I_BR):
        obs = locality & sync_ok
        if not obs.any():
            theta[ia] = SYNC_INIT_FRACTION * median_c
            continue
        extra = np.maximum(replicas[obs] - 2.0, 0.0)
        if np.unique(extra).size >= 2:
            design = np.column_stack([np.ones_like(extra), extra])
            a, b = np.linalg.lstsq(design, sync[obs], rcond=None)[0]
        else:
            a, b = float(np.median(sync[obs])), 0.0
        theta[ia] = max(a, float(np.min(sync[obs])) / 2.0)
        theta[ib] = max(b, 0.0)
    return theta


class Residuals:
    """Residuals of the free parameters: log step times, log sync times, then the priors.

    ``residuals(x)`` takes one float[F] point; :meth:`batch` takes float[B, F]
    points and gives float[B, M], row ``b`` bit-identical to ``residuals(X[b])``:
    the same elementwise operations in the same order (``ratio ** gamma`` is
    taken per distinct gamma with a scalar exponent, as numpy evaluates the
    one-point case), on precomputed row masks, so that the least-squares run
    (:mod:`~pollux_opt.model.throughput_lsq`) evaluates the points of a
    finite-difference Jacobian in one batch.
    """

    def __init__(self, rows: FitRows, layout: FitLayout) -> None:
        free = layout.free
        slots = free + list(layout.fixed)
        self._fixed = np.array(list(layout.fixed.values()), dtype=np.float64)
        self._src = np.empty(len(PARAM_NAMES), dtype=np.int64)
        self._scale = np.ones(len(PARAM_NAMES))
        for i in range(len(PARAM_NAMES)):  # as FitLayout.expander
            j, self._scale[i] = layout.tie.get(i, (i, 1.0))
            self._src[i] = slots.index(j)
        nodes, replicas, ok = rows.nodes, rows.replicas, rows.sync_ok
        self._m, self._s = rows.m, rows.s
        self._accumulated = bool(np.any(rows.s != 0))
        # 1.0 where co-located, else 0.0 (the float of the mask, as numpy would cast it).
        self._colocated_rows = (replicas > nodes).astype(np.float64)
        multi = nodes > 1
        # Columns of theta holding each row's sync latency and retrogression (alpha_r or alpha_n, ...).
        self._alpha_col = np.where(multi, I_AR, I_AN)
        self._beta_col = np.where(multi, I_BR, I_BN)
        self._extra = np.maximum(replicas - 2.0, 0.0)
        self._synced = replicas > 1
        self._all_synced = bool(self._synced.all())
        self._sync_ok = np.flatnonzero(ok)
        self._rows, self._sync_rows = rows.nodes.shape[0], int(ok.sum())
        self._log_times = np.concatenate([np.log(rows.step), np.log(rows.sync[ok])])
        self._retro = [(ia, ib) for ia, ib in ((I_AN, I_BN), (I_AR, I_BR)) if ib in free]
        self._colocated = layout.colocated
        self._size = self._rows + self._sync_rows + len(self._retro) + int(self._colocated)
        self._unscaled = bool((self._scale == 1.0).all())  # x * 1.0 is x, to the bit

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.batch(x[None, :])[0]

    def theta(self, x: np.ndarray) -> np.ndarray:
        """float[B, 9]: the full parameters of free parameters float[B, F] (:meth:`FitLayout.expander`)."""
        ext = np.empty((x.shape[0], x.shape[1] + self._fixed.size))
        ext[:, :x.shape[1]] = x
        ext[:, x.shape[1]:] = self._fixed
        theta = ext[:, self._src]
        return theta if self._unscaled else theta * self._scale

    def _sync(self, theta: np.ndarray) -> np.ndarray:
        """:func:`~pollux_opt.model.throughput.unchecked_sync_time` per point (rows along axis 1)."""
        t = theta[:, self._alpha_col] + theta[:, self._beta_col] * self._extra
        return t if self._all_synced else np.where(self._synced, t, 0.0)

    @staticmethod
    def _combined(big: np.ndarray, ratio: np.ndarray, gamma: np.ndarray) -> np.ndarray:
        """``big * (1 + ratio**gamma) ** (1 / gamma)`` per point, with a scalar exponent per distinct gamma."""
        first = gamma[0]
        # Every row at the first gamma (elementwise, so the rows at it are as if alone), then
        # the rows at another gamma again at theirs.
        combined = big * (1.0 + ratio**first) ** (1.0 / first)
        if gamma.shape[0] == 1:
            return combined
        same = gamma == first
        if same.all():
            return combined
        for g in dict.fromkeys(gamma[~same].tolist()):  # the other gammas, each once
            g = np.float64(g)  # a float64 scalar exponent, as gamma[0] above
            at = gamma == g
            combined[at] = big[at] * (1.0 + ratio[at] ** g) ** (1.0 / g)
        return combined

    def _times(self, theta: np.ndarray) -> np.ndarray:
        """float[B, R + S]: :func:`~pollux_opt.model.throughput.unchecked_step_time` of every row,
        then the sync time of the rows with a measured one."""
        bm = theta[:, I_BC, None] * self._m
        t_c = theta[:, I_AC, None] + bm
        if self._colocated:  # else kappa is 0 and the slowdown exactly 1
            slowdown = 1.0 + theta[:, I_KAPPA, None] * self._colocated_rows
            t_c = t_c * slowdown
        t_s = self._sync(theta)
        big = np.maximum(t_c, t_s)
        ratio = np.minimum(t_c, t_s) / big
        out = np.empty((theta.shape[0], self._rows + self._sync_rows))
        step = out[:, :self._rows]
        if not self._accumulated:  # 0 * t_a + c is c, to the bit (t_a is finite)
            step[...] = self._combined(big, ratio, theta[:, I_GAMMA])
        else:
            t_a = theta[:, I_AA, None] + bm
            if self._colocated:
                t_a = t_a * slowdown
            np.add(self._s * t_a, self._combined(big, ratio, theta[:, I_GAMMA]), out=step)
        out[:, self._rows:] = t_s[:, self._sync_ok]
        return out

    def batch(self, x: np.ndarray) -> np.ndarray:
        """float[B, M] residuals of the points float[B, F]."""
        theta = self.theta(x)
        out = np.empty((x.shape[0], self._size))
        times = self._rows + self._sync_rows
        np.subtract(np.log(self._times(theta)), self._log_times, out=out[:, :times])
        # Optimistic retrogression prior: beta / (alpha + beta) -> 0 where the data allow.
        for col, (ia, ib) in enumerate(self._retro, start=times):
            out[:, col] = RETROGRESSION_PRIOR_WEIGHT * theta[:, ib] / (theta[:, ia] + theta[:, ib])
        if self._colocated:  # Optimistic co-location prior: kappa -> 0 where the data allow.
            out[:, -1] = COLOCATION_PRIOR_WEIGHT * theta[:, I_KAPPA]
        return out


def _multistart_least_squares(rows: FitRows, free: list[int], residuals: Residuals):
    """Best :func:`scipy.optimize.least_squares` result over the gamma starts."""
    floor_params = {I_AC, I_BC, I_AN, I_AR}
    lower = np.array(
        [GAMMA_MIN if i == I_GAMMA else PARAM_FLOOR_S if i in floor_params else 0.0 for i in free]
    )
    upper = np.array([GAMMA_MAX if i == I_GAMMA else np.inf for i in free])
    init = _initial_guess(rows.nodes, rows.replicas, rows.m, rows.s, rows.step, rows.sync, rows.sync_ok)
    starts = GAMMA_STARTS if I_GAMMA in free else (GAMMA_PRIOR,)
    problem = BatchProblem(residuals.batch, lower, upper)
    best = None
    for gamma0 in starts:
        init[I_GAMMA] = gamma0
        x0 = np.clip(init[free], lower, upper)
        result = least_squares_trf(problem, x0, lower, upper)
        if not result.success:
            logger.debug("throughput fit from gamma=%g did not converge: %s", gamma0, result.message)
        if best is None or result.cost < best.cost:
            best = result
    if not best.success:  # only the start whose parameters are used matters
        logger.warning("throughput fit did not converge (best of %d starts, cost %.3g): %s; "
                       "using its parameters", len(starts), best.cost, best.message)
    return best


def fit_throughput(
    num_nodes, num_replicas, local_bsz, step_time, sync_time, *, accum_steps=None
) -> ThroughputParams:
    """Fit :class:`ThroughputParams` to measured step and sync times.

    Minimises, over parameters within bounds, the sum of squared residuals
    ``log T_pred - log T_meas`` over all rows plus ``log t_sync_pred - log
    t_sync_meas`` over rows with K >= 2 and a measured (finite, > 0) sync time
    (plus the retrogression prior below),
    with :func:`scipy.optimize.least_squares` (trust-region reflective, bounded),
    restarted from each gamma in :data:`GAMMA_STARTS`.

    Priors (Pollux, section 4.1: optimistic where the data say nothing, so the
    scheduler explores rather than trusting fitted noise).  "Intra-node rows"
    are rows with N == 1 and K >= 2; "inter-node rows" those with N >= 2.

    * one distinct local batch size m0: ``alpha_c = beta_c * m0``, i.e. the
      fitted compute time of m0 is split equally between the fixed and the
      per-sample part;
    * no row with K >= 2: ``alpha_n = beta_n = alpha_r = beta_r = 0`` (perfect
      scaling) and ``gamma = GAMMA_PRIOR`` (which then has no effect);
    * no inter-node row (one node only): ``(alpha_r, beta_r) = f (alpha_n, beta_n)``
      with ``f =`` :data:`INTER_NODE_PRIOR_FACTOR` (1.1: one node is preferred
      until a spread has been measured);
    * no intra-node row: ``(alpha_n, beta_n) = (alpha_r, beta_r)`` (the mirror
      of the previous prior; intra-node sync is rarely slower than inter-node,
      so this errs pessimistic only until one single-node step is measured);
    * no row with K > 2 within a locality that has rows: its beta is 0 (so with
      at most 2 replicas ever, ``beta_n = beta_r = 0``); a tied locality
      inherits the beta of the other;
    * not both rows with accumulation (s >= 1) and rows without:
      ``alpha_a = alpha_c`` (Pollux's model; the returned ``alpha_a`` is None).
      With both, ``alpha_a`` is fitted (>= 0), so that micro-batches need not
      repeat the once-per-step work; with one kind only, the data would fix
      ``alpha_a + alpha_c`` but not how it splits;
    * every fitted beta adds the residual ``w beta / (alpha + beta)`` of its
      locality, ``w =`` :data:`RETROGRESSION_PRIOR_WEIGHT`: sync grows slowly with
      the replica count unless the rows say otherwise (Pollux's own fit penalises
      ``beta / alpha`` the same way);
    * ``kappa`` is fitted only with rows of both kinds, co-located (K > N) and
      one replica per node (K == N), and co-located rows of at least two
      distinct (m, s) (else it cannot be told from the sync latency); otherwise
      ``kappa = 0``.  A fitted kappa adds the residual
      ``COLOCATION_PRIOR_WEIGHT * kappa`` (:data:`COLOCATION_PRIOR_WEIGHT`).

    Args:
        num_nodes: int[R] nodes N >= 1 of each measurement row.
        num_replicas: int[R] replicas K >= N.
        local_bsz: int[R] local micro-batch m >= 1, samples.
        step_time: float[R] measured optimizer step time T > 0, seconds.
        sync_time: float[R] measured sync time, seconds; ``nan`` or 0 where not
            measured; ignored where K == 1.
        accum_steps: int[R] accumulation steps s >= 0 of each row (default 0).

    Returns:
        The fitted parameters.

    Raises:
        InvalidProblem: on empty or mismatched arrays or out-of-range values.
    """
    rows = FitRows.checked(num_nodes, num_replicas, local_bsz, step_time, sync_time, accum_steps)
    layout = fit_layout(rows)
    expand = layout.expander()
    best = _multistart_least_squares(rows, layout.free, Residuals(rows, layout))
    theta = expand(best.x)
    params = ThroughputParams(
        *(float(v) for v in theta[:I_AA]), alpha_a=float(theta[I_AA]) if layout.accumulated else None,
        kappa=float(theta[I_KAPPA]),
    )
    logger.debug(
        "fitted %s from %d rows (%d sync), cost %.3g; priors: %s",
        params, rows.nodes.shape[0], int(rows.sync_ok.sum()), best.cost, "; ".join(layout.priors) or "none",
    )
    return params
