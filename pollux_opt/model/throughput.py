"""Throughput model of a data-parallel training job (Pollux, OSDI 2021, section 3.2).

A job runs ``K`` replicas (one worker process per CPU core, or per GPU) on
``N`` nodes, each replica processing a local micro-batch of ``m`` samples,
with ``s`` extra gradient-accumulation micro-batches before each
synchronised optimizer step.  All times in seconds::

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
that is a large part of a step (35-45 % of a millisecond step of
ratings-mf and synth-regress), so ``alpha_a`` is fitted separately once steps
both with and without accumulation have been measured.

Pollux's model gives each replica its own device.  CPU replicas that share a
node (``K > N``) also share its caches, memory bandwidth and cores: the
collectives' helper threads of one replica run on the cores that the other
replicas compute on, and a replica that loses its core for a moment keeps
all others waiting at the all-reduce.  On the 2-core development machine
the two-replica steps of digits-cnn, synth-regress and ratings-mf
grew with the local batch 1.2, 1.4 and 1.7 times as fast as one-replica
steps, which no constant sync time can fit.  ``kappa`` is that slowdown
of a co-located replica's compute (its effective compute time, the wait for
the slowest replica included); it is fitted once both co-located and
one-per-node rows exist (see
:func:`~pollux_opt.model.throughput_fit.fit_throughput`) and is 0, Pollux's
model, otherwise.  It is a constant: with at most two replicas per node
measured, nothing says how it grows with more.

The parameters are fitted to measured step and sync times by
:func:`pollux_opt.model.throughput_fit.fit_throughput`.

References:
    A. Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized
    Deep Learning", OSDI 2021, section 3.2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model.validate import as_allocation, as_counts, broadcast_args

__all__ = [
    "GAMMA_MAX", "GAMMA_MIN", "I_AA", "I_AC", "I_AN", "I_AR", "I_BC", "I_BN", "I_BR", "I_GAMMA", "I_KAPPA",
    "PARAM_NAMES", "ThroughputParams", "step_time", "sync_time",
]

#: Bounds of the overlap exponent gamma (Pollux, section 3.2: gamma in [1, 10]).
GAMMA_MIN = 1.0
GAMMA_MAX = 10.0

#: The parameters in the order of :meth:`ThroughputParams.as_array` (``theta``).
PARAM_NAMES = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma", "alpha_a", "kappa")
#: Positions of the parameters in ``theta`` (``I_AC`` is ``alpha_c``'s, and so on).
I_AC, I_BC, I_AN, I_BN, I_AR, I_BR, I_GAMMA, I_AA, I_KAPPA = range(len(PARAM_NAMES))


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
        return np.array([getattr(self, name) for name in PARAM_NAMES[:I_AA]] + [self.accum_alpha, self.kappa])

    @property
    def accum_alpha(self) -> float:
        """``alpha_a``, or ``alpha_c`` when it is None (seconds)."""
        return self.alpha_c if self.alpha_a is None else self.alpha_a

    def to_dict(self) -> dict[str, float]:
        """The parameters by name (``alpha_a`` only when set, ``kappa`` only when
        > 0): JSON-ready."""
        out = {name: float(getattr(self, name)) for name in PARAM_NAMES[:I_AA]}
        if self.alpha_a is not None:
            out["alpha_a"] = float(self.alpha_a)
        if self.kappa > 0:
            out["kappa"] = float(self.kappa)
        return out


def unchecked_sync_time(theta, nodes, replicas):
    """Unchecked t_sync (seconds); ``theta`` float[9] (see :data:`PARAM_NAMES`), counts as float arrays."""
    multi_node = nodes > 1
    alpha = np.where(multi_node, theta[I_AR], theta[I_AN])
    beta = np.where(multi_node, theta[I_BR], theta[I_BN])
    t = alpha + beta * np.maximum(replicas - 2.0, 0.0)
    return np.where(replicas > 1, t, 0.0)


def unchecked_step_time(theta, nodes, replicas, local_bsz, accum_steps):
    """Unchecked optimizer step time T (seconds); arguments broadcast."""
    slowdown = 1.0 + theta[I_KAPPA] * (replicas > nodes)
    per_sample = theta[I_BC] * local_bsz
    t_c = (theta[I_AC] + per_sample) * slowdown
    t_a = (theta[I_AA] + per_sample) * slowdown
    t_s = unchecked_sync_time(theta, nodes, replicas)
    # (a**g + b**g)**(1/g) = big * (1 + (small/big)**g)**(1/g): no overflow or
    # underflow for gamma up to 10 and any time scale; big >= t_c > 0.
    big = np.maximum(t_c, t_s)
    ratio = np.minimum(t_c, t_s) / big
    gamma = theta[I_GAMMA]
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
    nodes, replicas = as_allocation(num_nodes, num_replicas)
    return unchecked_sync_time(params.as_array(), nodes.astype(float), replicas.astype(float))


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
    nodes, replicas = as_allocation(num_nodes, num_replicas)
    m = as_counts("local_bsz", local_bsz, 1)
    s = as_counts("accum_steps", accum_steps, 0)
    nodes, replicas, m, s = broadcast_args(
        num_nodes=nodes, num_replicas=replicas, local_bsz=m, accum_steps=s
    )
    return unchecked_step_time(params.as_array(), *(a.astype(np.float64) for a in (nodes, replicas, m, s)))
