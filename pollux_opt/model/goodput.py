"""Goodput model of a data-parallel training job (Pollux, OSDI 2021, section 3).

Goodput is the rate of training *progress*: system throughput (samples per
second) times statistical efficiency (progress per sample relative to the
initial batch size).  A job runs ``K`` replicas (one worker process per CPU
core, or per GPU) on ``N`` nodes, each replica processing a local micro-batch
of ``m`` samples, with ``s`` extra gradient-accumulation micro-batches before
each synchronised optimizer step.

Throughput model (Qiao et al., section 3.2; all times in seconds)::

    c(N,K)      = 1 + kappa * [K > N]                           co-location slowdown of compute
    t_c(m)      = (alpha_c + beta_c * m) * c(N,K)               compute time of a step's last micro-batch
    t_a(m)      = (alpha_a + beta_c * m) * c(N,K)               compute time of an accumulation micro-batch
    t_sync(N,K) = 0                                   if K == 1
                = alpha_n + beta_n * max(K - 2, 0)    if K >= 2 and N == 1  (intra-node)
                = alpha_r + beta_r * max(K - 2, 0)    if N >= 2             (inter-node)
    T(N,K,m,s)  = s * t_a + (t_c**gamma + t_sync**gamma) ** (1 / gamma),   gamma in [1, 10]
    M           = K * m * (s + 1)                                 total batch per optimizer step
    throughput  = M / T                                           samples / s

``gamma`` interpolates between no overlap of computation and synchronisation
(``gamma = 1``: times add) and perfect overlap (``gamma -> inf``: the max).
Accumulation micro-batches never synchronise.  In Pollux's model they cost
``t_c`` each (``alpha_a = alpha_c``, the default).  Here a step's compute time
is measured as its step time less its sync time, so ``t_c`` also holds the
work done once per step (the optimizer update, zeroing gradients, Python
overhead), which a micro-batch does not repeat: on CPU, for small models,
that is a large part of a step (issue 4: 35-45 % of a millisecond step of
ratings-mf and synth-regress), so ``alpha_a`` is fitted separately once steps
both with and without accumulation have been measured.

Pollux's model gives each replica its own device.  CPU replicas that share a
node (``K > N``) also share its caches, memory bandwidth and cores: the
collectives' helper threads of one replica run on the cores that the other
replicas compute on, and a replica that loses its core for a moment keeps
all others waiting at the all-reduce.  On the 2-core development machine
(issue 4) the two-replica steps of digits-cnn, synth-regress and ratings-mf
grew with the local batch 1.2, 1.4 and 1.7 times as fast as one-replica
steps, which no constant sync time can fit.  ``kappa`` is that slowdown
of a co-located replica's compute (its effective compute time, the wait for
the slowest replica included); it is fitted once both co-located and
one-per-node rows exist (see :func:`fit_throughput`) and is 0, Pollux's
model, otherwise.  It is a constant: with at most two replicas per node
measured, nothing says how it grows with more.

Statistical efficiency (section 3.1), from the gradient noise scale measured
at the initial batch size ``M0``::

    phi  = grad_var / grad_sqr * M0             gradient noise scale (samples)
    E(M) = (phi + M0) / (phi + M)               E(M0) = 1, non-increasing in M
    goodput = throughput * E(M)                  (M0-equivalent) samples / s

The throughput parameters are fitted to measured step and sync times by
bounded least squares on log times (:func:`fit_throughput`); dimensions never
observed are fixed to optimistic priors instead of being fitted to noise
(section 4.1, "prior-driven exploration"), so that a scheduler keeps trying
larger allocations.  :meth:`GoodputModel.optimize` picks, for each allocation,
the local batch size and accumulation steps that maximise goodput within
:class:`BatchLimits`; :meth:`GoodputModel.speedup` is the ratio of best goodputs
against a base allocation, the quantity the allocation problem maximises.

References:
    A. Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized
    Deep Learning", OSDI 2021, sections 3 and 4.1.
    S. McCandlish et al., "An Empirical Model of Large-Batch Training",
    arXiv:1812.06162, 2018 (gradient noise scale).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields

import numpy as np
from scipy.optimize import least_squares

from solvers import InvalidProblem

__all__ = [
    "GAMMA_MIN",
    "GAMMA_MAX",
    "GAMMA_PRIOR",
    "DEFAULT_MAX_ACCUM_STEPS",
    "ThroughputParams",
    "sync_time",
    "step_time",
    "fit_throughput",
    "GradientStats",
    "efficiency",
    "BatchLimits",
    "BatchChoice",
    "GoodputModel",
]

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------- constants

#: Bounds of the overlap exponent gamma (Pollux, section 3.2: gamma in [1, 10]).
GAMMA_MIN = 1.0
GAMMA_MAX = 10.0

#: Value of gamma when no multi-replica step was ever measured.  Every sync
#: parameter is then 0 (perfect-scaling prior), so ``T = (s + 1) * t_c`` for any
#: gamma and this value has no effect on predictions; it is the no-overlap end.
GAMMA_PRIOR = GAMMA_MIN

#: Default cap on gradient-accumulation steps (project choice: lets one replica
#: reach 16 times its largest micro-batch, enough to reach a typical maximum
#: batch from a small share of the cluster without huge step times).
DEFAULT_MAX_ACCUM_STEPS = 15

#: Smallest value (seconds) of parameters that must stay positive during the fit
#: (alpha_c, beta_c, alpha_n, alpha_r) so that log step / sync times stay finite.
#: Far below any measurable time, so a fitted value at this floor means "zero".
PARAM_FLOOR_S = 1e-9

#: Starting values of gamma for the multi-start fit: the objective is not convex
#: in gamma, so a few starts spread over [GAMMA_MIN, GAMMA_MAX] avoid a poor
#: local minimum.  Project choice; three starts keep the fit within milliseconds.
GAMMA_STARTS = (1.0, 2.5, 6.0)

#: Weight of the optimistic retrogression prior.  For each fitted retrogression
#: term (beta_n, beta_r: sync growth per replica beyond two) the fit adds the
#: residual ``weight * beta / (alpha + beta)``, which pulls the fit towards sync
#: times that grow slowly with replicas where few rows say otherwise.  Pollux's
#: fit (OSDI 2021 artifact, ``goodput.py``) adds ``1e-2 (beta / alpha)^2`` "to
#: prefer a more optimistic model"; this bounded form cannot blow up while
#: alpha is near 0.  It decides what the data leave open: with one measured
#: replica count in a locality beyond two (e.g. a job measured on 3 replicas
#: over 2 nodes), the rows fix ``alpha + beta`` but not the split, and least
#: squares alone may put it all into beta (a sync time growing by 1 s per
#: replica in a simulated job), which keeps a job off idle CPUs; a fit the data
#: determine hardly moves (one residual against the data's many).  On the
#: eight AdaptDL workloads (issue 6) weights 0.05, 0.1 and 0.3 gave average
#: JCTs within 0.3 % of each other.
RETROGRESSION_PRIOR_WEIGHT = 0.1

#: With no inter-node row, inter-node sync is taken as this factor times the
#: fitted intra-node sync (Pollux's artifact enforces ``alpha_n >= 1.1 alpha_r``
#: without multi-node data), so that an unmeasured spread over several nodes
#: never looks as good as one node.
INTER_NODE_PRIOR_FACTOR = 1.1

#: Starting value of an intra/inter-node latency (alpha_n, alpha_r) as a fraction of
#: the median compute time, used only when no sync time was measured there.
SYNC_INIT_FRACTION = 0.1

#: Lower clip of the linear-regression starting values of alpha_c and beta_c * m,
#: as a fraction of the median compute time (keeps starts strictly inside bounds).
COMPUTE_INIT_FRACTION = 1e-3

#: Points of the first search grid over local batch sizes: linear (so every
#: integer is tried) when the feasible range has at most this many integers,
#: geometric over wider ranges (batch-size effects are multiplicative).
GRID_POINTS = 64

#: Points of each later linear refinement grid (>= 3).  A bracket of at most
#: ``REFINE_POINTS - 1`` integers is covered exactly by one such grid.
REFINE_POINTS = 16

#: Safety cap on refinement passes; the bracket shrinks by a factor of about
#: ``(REFINE_POINTS - 1) / 2`` per pass, so a 2**63-wide range needs < 25 passes.
MAX_REFINE_PASSES = 64

#: Weight of the optimistic co-location prior: the fit adds the residual
#: ``weight * kappa``, so that co-located replicas are taken not to slow each
#: other down unless the rows say so (kappa and the sync latency both lengthen
#: co-located steps; with few rows the split is weakly determined).  Same
#: weight and reasoning as :data:`RETROGRESSION_PRIOR_WEIGHT`.  Project choice:
#: on 16 pooled profiling passes of ratings-mf (issue 4) the prior halves the
#: fitted kappa (0.85 -> 0.48) and moves held-out MAPE from 4.2 to 3.4 %.
COLOCATION_PRIOR_WEIGHT = 0.1

#: Starting value of kappa in the fit (strictly inside its bound of 0).
KAPPA_INIT = 0.1

_PARAM_NAMES = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma", "alpha_a", "kappa")
_AC, _BC, _AN, _BN, _AR, _BR, _GAMMA, _AA, _KAPPA = range(len(_PARAM_NAMES))


# -------------------------------------------------------------------- validation

def _first_bad(arr: np.ndarray, bad: np.ndarray) -> str:
    """Describe the first offending entry of ``arr`` where ``bad`` (same shape) holds."""
    flat = np.flatnonzero(bad)
    value = arr.reshape(-1)[flat[0]].item()
    if arr.ndim == 0:
        return f"{value!r}"
    index = np.unravel_index(flat[0], arr.shape)
    return f"{value!r} at index {index if len(index) > 1 else index[0]}"


def _numeric(name: str, value) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise InvalidProblem(f"{name} must be numeric, got {value!r}")
    return arr


def _counts(name: str, value, minimum: int) -> np.ndarray:
    """int64 array of ``value``; raises unless every entry is an integer >= ``minimum``."""
    arr = _numeric(name, value)
    as_float = arr.astype(np.float64)
    bad = ~np.isfinite(as_float) | (as_float < minimum) | (as_float != np.round(as_float))
    if bad.any():
        raise InvalidProblem(f"{name} must be an integer >= {minimum}, got {_first_bad(arr, bad)}")
    return arr.astype(np.int64)


def _count(name: str, value, minimum: int) -> int:
    arr = _counts(name, value, minimum)
    if arr.ndim != 0:
        raise InvalidProblem(f"{name} must be a scalar integer, got shape {arr.shape}")
    return int(arr)


def _allocation(num_nodes, num_replicas) -> tuple[np.ndarray, np.ndarray]:
    """Broadcast int64 (nodes, replicas) with ``1 <= nodes <= replicas``."""
    nodes = _counts("num_nodes", num_nodes, 1)
    replicas = _counts("num_replicas", num_replicas, 1)
    try:
        nodes, replicas = np.broadcast_arrays(nodes, replicas)
    except ValueError:
        raise InvalidProblem(
            f"num_nodes (shape {nodes.shape}) and num_replicas (shape {replicas.shape}) "
            "do not broadcast"
        ) from None
    bad = replicas < nodes
    if bad.any():
        raise InvalidProblem(
            "num_replicas must be >= num_nodes (at least one replica per node), got "
            f"num_replicas={_first_bad(replicas, bad)} with num_nodes={nodes[bad].reshape(-1)[0]}"
        )
    return nodes, replicas


def _broadcast(**arrays: np.ndarray) -> list[np.ndarray]:
    try:
        return list(np.broadcast_arrays(*arrays.values()))
    except ValueError:
        shapes = ", ".join(f"{k} {np.shape(v)}" for k, v in arrays.items())
        raise InvalidProblem(f"argument shapes do not broadcast: {shapes}") from None


# ------------------------------------------------------------- throughput model

@dataclass(frozen=True)
class ThroughputParams:
    """The parameters of the step-time model (Pollux, section 3.2, plus ``alpha_a``).

    Attributes:
        alpha_c: fixed compute time of a step's last micro-batch (with the
            once-per-step work), seconds (>= 0).
        beta_c: compute time per sample of a micro-batch, seconds / sample (>= 0).
        alpha_n: intra-node (one node, K >= 2) synchronisation latency, seconds (>= 0).
        beta_n: intra-node sync time per replica beyond 2, seconds / replica (>= 0).
        alpha_r: inter-node (N >= 2) synchronisation latency, seconds (>= 0).
        beta_r: inter-node sync time per replica beyond 2, seconds / replica (>= 0).
        gamma: overlap exponent of compute and sync, dimensionless, in [1, 10].
        alpha_a: fixed compute time of an accumulation micro-batch, seconds
            (>= 0); None (the default) means ``alpha_c``, Pollux's own model.
        kappa: co-location slowdown, dimensionless (>= 0): compute takes
            ``1 + kappa`` times as long when replicas share a node (K > N);
            0 (the default) is Pollux's model.

    ``alpha_c + beta_c`` must be > 0 so that every step takes positive time.
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float
    alpha_a: float | None = None
    kappa: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "alpha_a":
                continue
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise InvalidProblem(f"{f.name} must be a number, got {value!r}") from None
            if not math.isfinite(value) or value < 0:
                raise InvalidProblem(f"{f.name} must be finite and >= 0, got {value!r}")
            object.__setattr__(self, f.name, value)
        if not GAMMA_MIN <= self.gamma <= GAMMA_MAX:
            raise InvalidProblem(f"gamma must be in [{GAMMA_MIN}, {GAMMA_MAX}], got {self.gamma!r}")
        if self.alpha_c + self.beta_c <= 0:
            raise InvalidProblem(
                f"alpha_c + beta_c must be > 0 (positive compute time), got "
                f"alpha_c={self.alpha_c!r}, beta_c={self.beta_c!r}"
            )

    def as_array(self) -> np.ndarray:
        """float64[9] in the order alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r,
        gamma, alpha_a (``alpha_c`` where ``alpha_a`` is None), kappa."""
        return np.array([getattr(self, name) for name in _PARAM_NAMES[:_AA]] + [self.accum_alpha, self.kappa])

    @property
    def accum_alpha(self) -> float:
        """``alpha_a``, or ``alpha_c`` when it is None (seconds)."""
        return self.alpha_c if self.alpha_a is None else self.alpha_a

    def to_dict(self) -> dict[str, float]:
        """The parameters by name (``alpha_a`` only when set, ``kappa`` only when
        > 0): JSON-ready."""
        out = {name: float(getattr(self, name)) for name in _PARAM_NAMES[:_AA]}
        if self.alpha_a is not None:
            out["alpha_a"] = float(self.alpha_a)
        if self.kappa > 0:
            out["kappa"] = float(self.kappa)
        return out


def _sync_time(theta, nodes, replicas):
    """Unchecked t_sync (seconds); ``theta`` float[8], counts as float arrays."""
    multi_node = nodes > 1
    alpha = np.where(multi_node, theta[_AR], theta[_AN])
    beta = np.where(multi_node, theta[_BR], theta[_BN])
    t = alpha + beta * np.maximum(replicas - 2.0, 0.0)
    return np.where(replicas > 1, t, 0.0)


def _step_time(theta, nodes, replicas, local_bsz, accum_steps):
    """Unchecked optimizer step time T (seconds); arguments broadcast."""
    slowdown = 1.0 + theta[_KAPPA] * (replicas > nodes)
    t_c = (theta[_AC] + theta[_BC] * local_bsz) * slowdown
    t_a = (theta[_AA] + theta[_BC] * local_bsz) * slowdown
    t_s = _sync_time(theta, nodes, replicas)
    # (a**g + b**g)**(1/g) = big * (1 + (small/big)**g)**(1/g): no overflow or
    # underflow for gamma up to 10 and any time scale; big >= t_c > 0.
    big = np.maximum(t_c, t_s)
    ratio = np.minimum(t_c, t_s) / big
    gamma = theta[_GAMMA]
    return accum_steps * t_a + big * (1.0 + ratio**gamma) ** (1.0 / gamma)


def sync_time(params: ThroughputParams, num_nodes, num_replicas) -> np.ndarray:
    """Predicted gradient synchronisation time t_sync, seconds.

    Args:
        params: fitted throughput parameters.
        num_nodes: int array-like N >= 1, nodes the job spans.
        num_replicas: int array-like K >= N, replicas in total; broadcasts with N.

    Returns:
        float64 array of the broadcast shape; 0 where K == 1.
    """
    nodes, replicas = _allocation(num_nodes, num_replicas)
    return _sync_time(params.as_array(), nodes.astype(float), replicas.astype(float))


def step_time(params: ThroughputParams, num_nodes, num_replicas, local_bsz, accum_steps=0) -> np.ndarray:
    """Predicted time of one optimizer step T (seconds), including accumulation.

    Args:
        params: fitted throughput parameters.
        num_nodes: int array-like N >= 1.
        num_replicas: int array-like K >= N.
        local_bsz: int array-like m >= 1, samples per replica per micro-batch.
        accum_steps: int array-like s >= 0, extra compute-only micro-batches.

    All arguments broadcast; returns a float64 array of the broadcast shape.
    """
    nodes, replicas = _allocation(num_nodes, num_replicas)
    m = _counts("local_bsz", local_bsz, 1)
    s = _counts("accum_steps", accum_steps, 0)
    nodes, replicas, m, s = _broadcast(
        num_nodes=nodes, num_replicas=replicas, local_bsz=m, accum_steps=s
    )
    return _step_time(params.as_array(), *(a.astype(np.float64) for a in (nodes, replicas, m, s)))


# ------------------------------------------------------------------------ fitting

def _measurement(name: str, value, n: int | None) -> np.ndarray:
    arr = _numeric(name, value)
    if arr.ndim != 1:
        raise InvalidProblem(f"{name} must be a 1-D array, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise InvalidProblem(
            f"{name} must have the same length as num_nodes ({n}), got length {arr.shape[0]}"
        )
    return arr


def _initial_guess(nodes, replicas, m, s, step, sync, sync_ok) -> np.ndarray:
    """float[9] starting point (before gamma multi-start), from linear regressions."""
    theta = np.zeros(len(_PARAM_NAMES))
    per_micro = step / (s + 1.0)
    single = replicas == 1
    rows = single if single.any() else np.ones_like(single)
    y, x = per_micro[rows], m[rows]
    median_c = float(np.median(y))
    if np.unique(x).size >= 2:
        a, b = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]), y, rcond=None)[0]
    else:
        a, b = median_c / 2.0, median_c / (2.0 * x[0])
    theta[_AC] = max(a, COMPUTE_INIT_FRACTION * median_c)
    theta[_BC] = max(b, COMPUTE_INIT_FRACTION * median_c / float(np.median(x)))
    theta[_AA] = theta[_AC]
    theta[_KAPPA] = KAPPA_INIT
    for locality, ia, ib in ((replicas > 1) & (nodes == 1), _AN, _BN), ((nodes > 1), _AR, _BR):
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
    nodes = _measurement("num_nodes", num_nodes, None)
    n = nodes.shape[0]
    if n < 1:
        raise InvalidProblem("too few measurements: need at least 1 row, got num_nodes of length 0")
    replicas = _measurement("num_replicas", num_replicas, n)
    m = _measurement("local_bsz", local_bsz, n)
    step = _measurement("step_time", step_time, n).astype(np.float64)
    sync = _measurement("sync_time", sync_time, n).astype(np.float64)
    s = np.zeros(n) if accum_steps is None else _measurement("accum_steps", accum_steps, n)
    nodes, replicas = (a.astype(np.float64) for a in _allocation(nodes, replicas))
    m = _counts("local_bsz", m, 1).astype(np.float64)
    s = _counts("accum_steps", s, 0).astype(np.float64)
    bad = ~np.isfinite(step) | (step <= 0)
    if bad.any():
        raise InvalidProblem(f"step_time must be finite and > 0, got {_first_bad(step, bad)}")
    bad = (sync < 0) | np.isinf(sync)
    if bad.any():
        raise InvalidProblem(f"sync_time must be >= 0 and finite (or nan), got {_first_bad(sync, bad)}")
    sync_ok = (replicas > 1) & np.isfinite(sync) & (sync > 0)

    # Each parameter is ext[src[i]] * scale[i], ext = [free..., fixed values...].
    free: list[int] = []
    fixed: dict[int, float] = {}
    tie: dict[int, tuple[int, float]] = {}
    priors: list[str] = []
    distinct_m = np.unique(m)
    if distinct_m.size == 1:
        free.append(_BC)
        tie[_AC] = (_BC, float(distinct_m[0]))
        priors.append(f"alpha_c = beta_c * {distinct_m[0]:g} (one local batch size)")
    else:
        free += [_AC, _BC]
    intra = (nodes == 1) & (replicas > 1)
    inter = nodes > 1
    if not (intra.any() or inter.any()):
        fixed.update({_AN: 0.0, _BN: 0.0, _AR: 0.0, _BR: 0.0, _GAMMA: GAMMA_PRIOR})
        priors.append("sync parameters 0, gamma = GAMMA_PRIOR (one replica only)")
    else:
        free.append(_GAMMA)
        for rows, ia, ib, label in ((intra, _AN, _BN, "intra"), (inter, _AR, _BR, "inter")):
            if not rows.any():
                continue
            free.append(ia)
            if (replicas[rows] > 2).any():
                free.append(ib)
            else:
                fixed[ib] = 0.0
                priors.append(f"{_PARAM_NAMES[ib]} = 0 (no {label}-node row with > 2 replicas)")
        if not inter.any():
            tie[_AR], tie[_BR] = (_AN, INTER_NODE_PRIOR_FACTOR), (_BN, INTER_NODE_PRIOR_FACTOR)
            priors.append("(alpha_r, beta_r) = INTER_NODE_PRIOR_FACTOR * (alpha_n, beta_n) (one node only)")
        if not intra.any():
            tie[_AN], tie[_BN] = (_AR, 1.0), (_BR, 1.0)
            priors.append("(alpha_n, beta_n) = (alpha_r, beta_r) (no single-node multi-replica row)")
    shared = replicas > nodes
    shared_configs = np.unique(np.column_stack([m[shared], s[shared]]), axis=0).shape[0]
    colocated = bool(shared_configs >= 2 and (~shared).any())
    if colocated:
        free.append(_KAPPA)
    else:
        fixed[_KAPPA] = 0.0
        priors.append("kappa = 0 (not both co-located rows of two (m, s) and one-per-node rows)")
    accumulated = bool((s > 0).any() and (s == 0).any())
    if accumulated:
        free.append(_AA)
    else:
        tie[_AA] = tie.get(_AC, (_AC, 1.0))  # alpha_c itself may be tied to beta_c
        priors.append("alpha_a = alpha_c (not both rows with and without accumulation)")
    slots = free + list(fixed)
    fixed_values = np.array(list(fixed.values()))
    src = np.empty(len(_PARAM_NAMES), dtype=np.int64)
    scale = np.ones(len(_PARAM_NAMES))
    for i in range(len(_PARAM_NAMES)):
        # A tie may point at a fixed parameter (e.g. beta_r -> beta_n = 0).
        j, scale[i] = tie.get(i, (i, 1.0))
        src[i] = slots.index(j)

    def expand(x: np.ndarray) -> np.ndarray:
        return np.concatenate([x, fixed_values])[src] * scale

    log_step = np.log(step)
    log_sync = np.log(sync[sync_ok])
    sync_rows = (nodes[sync_ok], replicas[sync_ok])

    retro = [(ia, ib) for ia, ib in ((_AN, _BN), (_AR, _BR)) if ib in free]

    def residuals(x: np.ndarray) -> np.ndarray:
        theta = expand(x)
        r_step = np.log(_step_time(theta, nodes, replicas, m, s)) - log_step
        r_sync = np.log(_sync_time(theta, *sync_rows)) - log_sync
        # Optimistic retrogression prior: beta / (alpha + beta) -> 0 where the data allow.
        r_prior = [RETROGRESSION_PRIOR_WEIGHT * theta[ib] / (theta[ia] + theta[ib]) for ia, ib in retro]
        if colocated:  # Optimistic co-location prior: kappa -> 0 where the data allow.
            r_prior.append(COLOCATION_PRIOR_WEIGHT * theta[_KAPPA])
        return np.concatenate([r_step, r_sync, r_prior])

    floor_params = {_AC, _BC, _AN, _AR}
    lower = np.array(
        [GAMMA_MIN if i == _GAMMA else PARAM_FLOOR_S if i in floor_params else 0.0 for i in free]
    )
    upper = np.array([GAMMA_MAX if i == _GAMMA else np.inf for i in free])
    init = _initial_guess(nodes, replicas, m, s, step, sync, sync_ok)
    starts = GAMMA_STARTS if _GAMMA in free else (GAMMA_PRIOR,)
    best = None
    for gamma0 in starts:
        init[_GAMMA] = gamma0
        x0 = np.clip(init[free], lower, upper)
        result = least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac", method="trf")
        if not result.success:
            logger.debug("throughput fit from gamma=%g did not converge: %s", gamma0, result.message)
        if best is None or result.cost < best.cost:
            best = result
    if not best.success:  # only the start whose parameters are used matters
        logger.warning("throughput fit did not converge (best of %d starts, cost %.3g): %s; "
                       "using its parameters", len(starts), best.cost, best.message)
    theta = expand(best.x)
    params = ThroughputParams(
        *(float(v) for v in theta[:_AA]), alpha_a=float(theta[_AA]) if accumulated else None,
        kappa=float(theta[_KAPPA]),
    )
    logger.debug(
        "fitted %s from %d rows (%d sync), cost %.3g; priors: %s",
        params, n, int(sync_ok.sum()), best.cost, "; ".join(priors) or "none",
    )
    return params


# ---------------------------------------------------------- statistical efficiency

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
        object.__setattr__(self, "init_batch_size", _count("init_batch_size", self.init_batch_size, 1))

    @property
    def noise_scale(self) -> float:
        """phi = grad_var / grad_sqr * M0, the gradient noise scale in samples."""
        return self.grad_var / self.grad_sqr * self.init_batch_size


def _efficiency(phi: float, m0: float, batch):
    return (phi + m0) / (phi + batch)


def efficiency(stats: GradientStats, batch_size) -> np.ndarray:
    """Statistical efficiency E(M) = (phi + M0) / (phi + M) (Pollux, eq. 2).

    Args:
        stats: gradient statistics measured at M0.
        batch_size: array-like total batch M > 0, samples per optimizer step.

    Returns:
        float64 array of ``batch_size``'s shape, in (0, 1] for M >= M0.
    """
    given = _numeric("batch_size", batch_size)
    batch = given.astype(np.float64)
    bad = ~np.isfinite(batch) | (batch <= 0)
    if bad.any():
        raise InvalidProblem(f"batch_size must be finite and > 0, got {_first_bad(given, bad)}")
    return _efficiency(stats.noise_scale, stats.init_batch_size, batch)


# ---------------------------------------------------------------- batch selection

@dataclass(frozen=True)
class BatchLimits:
    """Limits on the batch configuration a job may use.

    Attributes:
        init_batch_size: M0, the smallest total batch (samples) and the batch the
            job's hyper-parameters were tuned for.
        max_batch_size: largest total batch M (samples), >= M0.
        min_local_bsz: smallest micro-batch per replica (samples), >= 1.
        max_local_bsz: largest micro-batch per replica (samples, e.g. memory
            bound), >= min_local_bsz; ``None`` means ``max_batch_size`` and is
            replaced by it on construction.
        max_accum_steps: largest number s of extra accumulation micro-batches, >= 0.
    """

    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int = 1
    max_local_bsz: int | None = None
    max_accum_steps: int = DEFAULT_MAX_ACCUM_STEPS

    def __post_init__(self) -> None:
        m0 = _count("init_batch_size", self.init_batch_size, 1)
        mmax = _count("max_batch_size", self.max_batch_size, 1)
        if mmax < m0:
            raise InvalidProblem(f"max_batch_size must be >= init_batch_size ({m0}), got {mmax}")
        lo = _count("min_local_bsz", self.min_local_bsz, 1)
        hi = mmax if self.max_local_bsz is None else _count("max_local_bsz", self.max_local_bsz, 1)
        if lo > hi:
            raise InvalidProblem(f"min_local_bsz must be <= max_local_bsz ({hi}), got {lo}")
        steps = _count("max_accum_steps", self.max_accum_steps, 0)
        for name, value in (
            ("init_batch_size", m0), ("max_batch_size", mmax), ("min_local_bsz", lo),
            ("max_local_bsz", hi), ("max_accum_steps", steps),
        ):
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class BatchChoice:
    """Best batch configuration per allocation; every field has the broadcast shape
    of the (num_nodes, num_replicas) arguments.

    An allocation with no feasible configuration has ``goodput = throughput =
    efficiency = 0`` and ``local_bsz = accum_steps = batch_size = 0``, so that its
    speedup is 0 (as for a job holding nothing).

    Attributes:
        goodput: float64, throughput * efficiency, M0-equivalent samples / s.
        throughput: float64, samples / s.
        efficiency: float64, statistical efficiency E(M) (1 when the batch is fixed).
        local_bsz: int64, micro-batch per replica m, samples.
        accum_steps: int64, extra accumulation micro-batches s.
        batch_size: int64, total batch M = K * m * (s + 1), samples.
    """

    goodput: np.ndarray
    throughput: np.ndarray
    efficiency: np.ndarray
    local_bsz: np.ndarray
    accum_steps: np.ndarray
    batch_size: np.ndarray

    @property
    def feasible(self) -> np.ndarray:
        """bool array: the allocation admits a configuration within the limits."""
        return self.local_bsz > 0


def _grid(lo: np.ndarray, hi: np.ndarray, points: int, geometric: bool) -> np.ndarray:
    """int64[..., points] non-decreasing candidates in [lo, hi] including both ends.

    The linear grid hits every integer of [lo, hi] when ``hi - lo <= points - 1``.
    """
    t = np.linspace(0.0, 1.0, points)
    lo_f, hi_f = lo[..., None].astype(np.float64), hi[..., None].astype(np.float64)
    if geometric:
        values = lo_f * (hi_f / lo_f) ** t
    else:
        values = lo_f + (hi_f - lo_f) * t
    return np.clip(np.rint(values).astype(np.int64), lo[..., None], hi[..., None])


@dataclass(frozen=True)
class GoodputModel:
    """Throughput model, gradient statistics and batch limits of one job.

    Raises :class:`InvalidProblem` when ``grad_stats.init_batch_size`` differs from
    ``limits.init_batch_size`` (both are M0).
    """

    throughput_params: ThroughputParams
    grad_stats: GradientStats
    limits: BatchLimits

    def __post_init__(self) -> None:
        for name, kind in (
            ("throughput_params", ThroughputParams),
            ("grad_stats", GradientStats),
            ("limits", BatchLimits),
        ):
            if not isinstance(getattr(self, name), kind):
                raise InvalidProblem(f"{name} must be a {kind.__name__}, got {getattr(self, name)!r}")
        if self.grad_stats.init_batch_size != self.limits.init_batch_size:
            raise InvalidProblem(
                f"grad_stats.init_batch_size ({self.grad_stats.init_batch_size}) must equal "
                f"limits.init_batch_size ({self.limits.init_batch_size})"
            )

    # ------------------------------------------------------------ point evaluation
    def _checked(self, num_nodes, num_replicas, local_bsz, accum_steps):
        nodes, replicas = _allocation(num_nodes, num_replicas)
        m = _counts("local_bsz", local_bsz, 1)
        s = _counts("accum_steps", accum_steps, 0)
        arrays = _broadcast(num_nodes=nodes, num_replicas=replicas, local_bsz=m, accum_steps=s)
        return [a.astype(np.float64) for a in arrays]

    def _throughput(self, nodes, replicas, m, s):
        batch = replicas * m * (s + 1.0)
        return batch / _step_time(self.throughput_params.as_array(), nodes, replicas, m, s), batch

    def _goodput(self, nodes, replicas, m, s):
        thr, batch = self._throughput(nodes, replicas, m, s)
        stats = self.grad_stats
        return thr * _efficiency(stats.noise_scale, stats.init_batch_size, batch)

    def throughput(self, num_nodes, num_replicas, local_bsz, accum_steps=0) -> np.ndarray:
        """Samples per second ``M / T`` at the given configuration (limits not applied).

        Arguments are int array-likes (N >= 1, K >= N, m >= 1, s >= 0) that
        broadcast; returns float64 of the broadcast shape.
        """
        return self._throughput(*self._checked(num_nodes, num_replicas, local_bsz, accum_steps))[0]

    def goodput(self, num_nodes, num_replicas, local_bsz, accum_steps=0) -> np.ndarray:
        """Goodput ``throughput * E(M)``, M0-equivalent samples / s (limits not applied).

        Arguments as in :meth:`throughput`; returns float64 of the broadcast shape.
        """
        return self._goodput(*self._checked(num_nodes, num_replicas, local_bsz, accum_steps))

    # ---------------------------------------------------------------- optimisation
    def _best_batch(self, nodes: np.ndarray, replicas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int64[P] (m, s) maximising goodput for float64[P] allocations; (0, 0) if infeasible.

        For fixed (N, K, s) the feasible m form an interval [lo, hi] and goodput is
        quasi-concave in m: ``G >= g`` iff ``m - g * T(m) * (phi + K (s+1) m) >= 0``,
        and ``T`` (a sum of a linear term and a gamma-norm of an affine function) and
        ``phi + K (s+1) m`` are positive, non-decreasing and convex, so their
        product is convex and the superlevel sets are intervals.  So the best of a
        grid is bracketed by its neighbours, and shrinking the bracket with
        finer grids until a grid covers it exactly finds the integer optimum.
        """
        lim = self.limits
        steps = np.arange(lim.max_accum_steps + 1, dtype=np.int64)
        per_sample = replicas.astype(np.int64)[:, None] * (steps + 1)[None, :]  # (P, S)
        lo = np.maximum(lim.min_local_bsz, -(-lim.init_batch_size // per_sample))
        hi = np.minimum(lim.max_local_bsz, lim.max_batch_size // per_sample)
        ok = lo <= hi
        lo = np.where(ok, lo, lim.min_local_bsz)
        hi = np.where(ok, hi, lim.min_local_bsz)
        n3, k3 = nodes[:, None, None], replicas[:, None, None]
        s3 = steps[None, :, None].astype(np.float64)
        for npass in range(MAX_REFINE_PASSES):
            first = npass == 0
            points = GRID_POINTS if first else REFINE_POINTS
            exact = hi - lo <= points - 1
            if first and not exact.all():
                cand = np.where(
                    exact[..., None], _grid(lo, hi, points, False), _grid(lo, hi, points, True)
                )
            else:
                cand = _grid(lo, hi, points, False)
            g = self._goodput(n3, k3, cand.astype(np.float64), s3)
            g = np.where(ok[..., None], g, -np.inf)
            j = np.argmax(g, axis=-1)
            best_m = np.take_along_axis(cand, j[..., None], axis=-1)[..., 0]
            best_g = np.take_along_axis(g, j[..., None], axis=-1)[..., 0]
            if exact.all():
                break
            # argmax takes the first maximum, so cand[j - 1] < cand[j]; the upper
            # end is the first candidate strictly above cand[j] (grids may repeat).
            below = np.take_along_axis(cand, np.maximum(j - 1, 0)[..., None], axis=-1)[..., 0]
            above_idx = np.minimum((cand <= best_m[..., None]).sum(axis=-1), points - 1)
            above = np.take_along_axis(cand, above_idx[..., None], axis=-1)[..., 0]
            lo = np.where(exact, best_m, below)
            hi = np.where(exact, best_m, above)
        else:  # pragma: no cover - the bracket provably shrinks well within the cap
            logger.warning("batch search stopped after %d refinement passes", MAX_REFINE_PASSES)
        s_idx = np.argmax(best_g, axis=-1)
        m = np.take_along_axis(best_m, s_idx[:, None], axis=-1)[:, 0]
        feasible = ok.any(axis=-1)
        return np.where(feasible, m, 0), np.where(feasible, s_idx, 0)

    def _fixed_batch(self, replicas: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """int64[P] (m, s) for a fixed total batch; (0, 0) where s would exceed the cap."""
        lim = self.limits
        k = replicas.astype(np.int64)
        per_replica = -(-batch_size // k)
        s = -(-per_replica // lim.max_local_bsz) - 1
        m = np.maximum(-(-per_replica // (s + 1)), lim.min_local_bsz)
        feasible = s <= lim.max_accum_steps
        return np.where(feasible, m, 0), np.where(feasible, s, 0)

    def optimize(self, num_nodes, num_replicas, *, fixed_batch_size=None) -> BatchChoice:
        """Best batch configuration for each allocation (Pollux, section 3.3).

        Default (goodput): maximise goodput over integer m in [min_local_bsz,
        max_local_bsz] and s in [0, max_accum_steps] subject to
        ``M0 <= K * m * (s + 1) <= max_batch_size``; an allocation where no (m, s)
        satisfies this (e.g. ``K * min_local_bsz > max_batch_size``, or
        ``K * max_local_bsz * (max_accum_steps + 1) < M0``) is infeasible and gets
        zeros, not nan, so speedups stay finite (see :class:`BatchChoice`).  The
        result is the exact integer optimum (see ``_best_batch``); ties go to
        the fewest accumulation steps.

        Throughput-only (``fixed_batch_size=B``): the total batch is the user's
        B, spread as ``ceil(B / K)`` samples per replica, split into the fewest
        micro-batches of at most max_local_bsz (then raised to min_local_bsz if
        below it), so ``M >= B`` with equality when K (s + 1) divides B.
        Efficiency is ignored (reported as 1, goodput = throughput); M0 and
        max_batch_size are not applied (B is the user's choice).  Infeasible
        where more than max_accum_steps accumulation steps would be needed.

        Args:
            num_nodes: int array-like N >= 1.
            num_replicas: int array-like K >= N, broadcasting with N.
            fixed_batch_size: optional int B >= 1, total batch in samples.

        Returns:
            A :class:`BatchChoice` with fields of the broadcast shape.
        """
        nodes, replicas = _allocation(num_nodes, num_replicas)
        shape = nodes.shape
        # The model sees the node count only as "one node or several" (see
        # _sync_time), so allocations with the same replicas on 2, 3, ... nodes
        # share one answer: solve each distinct (multi-node, K) once, then expand.
        multi = nodes.reshape(-1) > 1
        keys, inverse = np.unique(replicas.reshape(-1) * 2 + multi, return_inverse=True)
        inverse = inverse.reshape(-1)
        n = (1 + keys % 2).astype(np.float64)
        k = (keys // 2).astype(np.float64)
        if fixed_batch_size is None:
            m, s = self._best_batch(n, k)
        else:
            m, s = self._fixed_batch(k, _count("fixed_batch_size", fixed_batch_size, 1))
        feasible = m > 0
        m_eval = np.where(feasible, m, 1).astype(np.float64)  # any valid m; masked below
        thr, batch = self._throughput(n, k, m_eval, s.astype(np.float64))
        if fixed_batch_size is None:
            stats = self.grad_stats
            eff = _efficiency(stats.noise_scale, stats.init_batch_size, batch)
        else:
            eff = np.ones_like(thr)
        thr = np.where(feasible, thr, 0.0)
        eff = np.where(feasible, eff, 0.0)
        if not feasible.all():
            logger.debug(
                "%d of %d allocations infeasible for %s",
                int((~feasible).sum()), feasible.size, self.limits,
            )
        batch = np.where(feasible, batch, 0).astype(np.int64)
        return BatchChoice(
            goodput=(thr * eff)[inverse].reshape(shape),
            throughput=thr[inverse].reshape(shape),
            efficiency=eff[inverse].reshape(shape),
            local_bsz=m[inverse].reshape(shape),
            accum_steps=s[inverse].reshape(shape),
            batch_size=batch[inverse].reshape(shape),
        )

    def speedup(self, num_nodes, num_replicas, *, base=(1, 1), fixed_batch_size=None) -> np.ndarray:
        """Best goodput at (N, K) over best goodput at ``base`` (Pollux, section 4.1).

        Args:
            num_nodes: int array-like N >= 1.
            num_replicas: int array-like K >= N, broadcasting with N.
            base: (nodes, replicas) of the reference allocation, e.g. a fair share.
            fixed_batch_size: as in :meth:`optimize` (throughput-only speedups).

        Returns:
            float64 array of the broadcast shape; 1 at ``base``, 0 where infeasible.

        Raises:
            InvalidProblem: if ``base`` is not a pair or is itself infeasible.
        """
        if np.ndim(base) != 1 or np.shape(base)[0] != 2:
            raise InvalidProblem(f"base must be a (num_nodes, num_replicas) pair, got {base!r}")
        ref = self.optimize(base[0], base[1], fixed_batch_size=fixed_batch_size)
        if not ref.feasible:
            raise InvalidProblem(
                f"base allocation {tuple(base)!r} has no feasible batch configuration "
                f"under {self.limits}"
            )
        choice = self.optimize(num_nodes, num_replicas, fixed_batch_size=fixed_batch_size)
        return choice.goodput / ref.goodput
