"""The allocation problem as plain arrays, and its pinned objective.

Every solver takes a :class:`Problem` and returns a :class:`solvers.Result`.
The domain layer (``pollux_opt``) encodes jobs and a cluster into a Problem
and decodes the placement matrix back; nothing here knows about jobs.

Objective (pinned, so anyone can recompute it from a placement):

* job j placed with ``K_j = sum_n X[j, n]`` replicas on ``N_j = #{n: X[j, n] > 0}``
  nodes has speedup ``s_j = speedup_j(N_j, K_j)`` (``s_j = 0`` when ``K_j = 0``);
* if the job currently holds replicas (``current[j]`` non-zero) and
  ``X[j] != current[j]``, ``s_j`` is multiplied by its restart factor
  ``f_j = max(age_j - restarts_j * delta, 0) / (age_j + delta)``
  (Pollux, OSDI 2021, section 4.2); starting a job that holds nothing is free;
* with ``x_j = s_j f_j`` and ``eps = 1e-3`` the objective is the weighted power
  mean ``M_p = (sum_j w_j (x_j + eps)^p / sum_j w_j)^(1/p)``, the weighted
  geometric mean of ``x_j + eps`` when ``p = 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .errors import InvalidProblem

__all__ = [
    "EPS",
    "Problem",
    "power_mean",
    "job_values",
    "evaluate",
    "violations",
    "utility",
]

#: Offset inside the power mean so that a job with no replicas (x = 0) keeps
#: the mean finite for p <= 0.  Pinned by the project's objective definition
#: (the Pollux reference scales speedups by 0.25 so that this plays the same role).
EPS = 1e-3


@dataclass(frozen=True, eq=False)
class Problem:
    """A frozen allocation problem over J jobs, N nodes and C candidate configurations.

    A *configuration* of a job is a pair (nodes, replicas) with a speedup; the
    job may use any listed configuration or none (zero replicas, speedup 0).
    Configurations are listed job by job (``cfg_job`` non-decreasing).

    Attributes:
        capacity: int64[N] CPUs (or GPUs) per node, all > 0.
        cfg_job: int64[C] job index of each configuration.
        cfg_nodes: int64[C] number of distinct nodes the configuration spans (>= 1).
        cfg_replicas: int64[C] total replicas (>= cfg_nodes).
        cfg_speedup: float64[C] speedup over the job's base allocation (finite, >= 0).
        current: int64[J, N] replicas each job holds now (zeros for a new job).
        restart_factor: float64[J] factor f_j in [0, 1] applied when a running job moves.
        weight: float64[J] weights w_j > 0 of the power mean.
        min_replicas: int64[J] smallest non-zero replica count allowed.
        max_replicas: int64[J] largest replica count allowed.
        p: fairness exponent of the power mean (finite; -1 in Pollux).
        max_nodes_per_job: largest number of nodes one job may span.
        interference_avoidance: if true, a node hosts at most one job that spans
            more than one node (Pollux, section 4.2).
    """

    capacity: np.ndarray
    cfg_job: np.ndarray
    cfg_nodes: np.ndarray
    cfg_replicas: np.ndarray
    cfg_speedup: np.ndarray
    current: np.ndarray
    restart_factor: np.ndarray
    weight: np.ndarray
    min_replicas: np.ndarray
    max_replicas: np.ndarray
    p: float = -1.0
    max_nodes_per_job: int = 16
    interference_avoidance: bool = True

    def __post_init__(self) -> None:
        conv = {
            "capacity": np.int64,
            "cfg_job": np.int64,
            "cfg_nodes": np.int64,
            "cfg_replicas": np.int64,
            "cfg_speedup": np.float64,
            "current": np.int64,
            "restart_factor": np.float64,
            "weight": np.float64,
            "min_replicas": np.int64,
            "max_replicas": np.int64,
        }
        for name, dtype in conv.items():
            arr = np.array(getattr(self, name), dtype=dtype, copy=True)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "p", float(self.p))
        object.__setattr__(self, "max_nodes_per_job", int(self.max_nodes_per_job))
        object.__setattr__(self, "interference_avoidance", bool(self.interference_avoidance))
        self._validate()

    # ------------------------------------------------------------------ shapes
    @property
    def num_jobs(self) -> int:
        """J, the number of jobs."""
        return int(self.weight.shape[0])

    @property
    def num_nodes(self) -> int:
        """N, the number of nodes."""
        return int(self.capacity.shape[0])

    @property
    def num_configs(self) -> int:
        """C, the number of candidate configurations over all jobs."""
        return int(self.cfg_job.shape[0])

    @cached_property
    def cfg_start(self) -> np.ndarray:
        """int64[J + 1]: configurations of job j are ``cfg_start[j]:cfg_start[j+1]``."""
        return np.searchsorted(self.cfg_job, np.arange(self.num_jobs + 1)).astype(np.int64)

    @cached_property
    def table_shape(self) -> tuple[int, int]:
        """(A, R): largest node count and replica count over all configurations."""
        if self.num_configs == 0:
            return (0, 0)
        return (int(self.cfg_nodes.max()), int(self.cfg_replicas.max()))

    @cached_property
    def speedup_table(self) -> np.ndarray:
        """float64[J, A + 1, R + 1] dense speedups, ``nan`` where not allowed.

        Entry ``[j, 0, 0]`` is 0: every job may hold nothing.
        """
        a, r = self.table_shape
        table = np.full((self.num_jobs, a + 1, r + 1), np.nan)
        table[:, 0, 0] = 0.0
        table[self.cfg_job, self.cfg_nodes, self.cfg_replicas] = self.cfg_speedup
        table.setflags(write=False)
        return table

    @cached_property
    def has_current(self) -> np.ndarray:
        """bool[J]: the job holds replicas now (so moving it is a restart)."""
        return self.current.sum(axis=1) > 0

    # -------------------------------------------------------------- validation
    def _validate(self) -> None:
        """Raise :class:`InvalidProblem` for the first broken rule, naming the field and value."""
        self._validate_shapes()
        if self.num_configs:
            self._validate_configs()
        self._validate_jobs()
        self._validate_current()

    def _validate_shapes(self) -> None:
        j, n, c = self.num_jobs, self.num_nodes, self.num_configs
        if self.capacity.ndim != 1:
            raise InvalidProblem(f"capacity must be 1-D, got shape {self.capacity.shape}")
        bad = np.flatnonzero(self.capacity <= 0)
        if bad.size:
            raise InvalidProblem(
                f"capacity[{bad[0]}] must be > 0, got {self.capacity[bad[0]]}"
            )
        for name in ("cfg_job", "cfg_nodes", "cfg_replicas", "cfg_speedup"):
            if getattr(self, name).shape != (c,):
                raise InvalidProblem(
                    f"{name} must have shape ({c},), got {getattr(self, name).shape}"
                )
        for name in ("restart_factor", "weight", "min_replicas", "max_replicas"):
            if getattr(self, name).shape != (j,):
                raise InvalidProblem(f"{name} must have shape ({j},), got {getattr(self, name).shape}")
        if self.current.shape != (j, n):
            raise InvalidProblem(f"current must have shape ({j}, {n}), got {self.current.shape}")
        if not math.isfinite(self.p):
            raise InvalidProblem(f"p must be finite, got {self.p}")
        if self.max_nodes_per_job < 1:
            raise InvalidProblem(f"max_nodes_per_job must be >= 1, got {self.max_nodes_per_job}")

    def _validate_configs(self) -> None:
        j, c = self.num_jobs, self.num_configs
        if np.any(np.diff(self.cfg_job) < 0) or self.cfg_job[0] < 0 or self.cfg_job[-1] >= j:
            raise InvalidProblem("cfg_job must be sorted job indices in [0, num_jobs)")
        bad = np.flatnonzero(~np.isfinite(self.cfg_speedup) | (self.cfg_speedup < 0))
        if bad.size:
            k = bad[0]
            raise InvalidProblem(
                f"speedup of job {self.cfg_job[k]} at (nodes={self.cfg_nodes[k]}, "
                f"replicas={self.cfg_replicas[k]}) must be finite and >= 0, "
                f"got {self.cfg_speedup[k]}"
            )
        bad = np.flatnonzero((self.cfg_nodes < 1) | (self.cfg_replicas < self.cfg_nodes))
        if bad.size:
            k = bad[0]
            raise InvalidProblem(
                f"configuration of job {self.cfg_job[k]} needs 1 <= nodes <= replicas, "
                f"got (nodes={self.cfg_nodes[k]}, replicas={self.cfg_replicas[k]})"
            )
        lo = np.maximum(self.min_replicas[self.cfg_job], 1)
        bad = np.flatnonzero(
            (self.cfg_replicas < lo)
            | (self.cfg_replicas > self.max_replicas[self.cfg_job])
            | (self.cfg_nodes > self.max_nodes_per_job)
        )
        if bad.size:
            k = bad[0]
            raise InvalidProblem(
                f"configuration (nodes={self.cfg_nodes[k]}, replicas={self.cfg_replicas[k]}) "
                f"of job {self.cfg_job[k]} is outside its replica range or max_nodes_per_job"
            )
        keys = self.cfg_job * (self.table_shape[0] + 1) * (self.table_shape[1] + 1) + (
            self.cfg_nodes * (self.table_shape[1] + 1) + self.cfg_replicas
        )
        if np.unique(keys).size != c:
            raise InvalidProblem("a job lists the same (nodes, replicas) configuration twice")

    def _validate_jobs(self) -> None:
        bad = np.flatnonzero(~np.isfinite(self.weight) | (self.weight <= 0))
        if bad.size:
            raise InvalidProblem(f"weight[{bad[0]}] must be finite and > 0, got {self.weight[bad[0]]}")
        bad = np.flatnonzero(
            ~np.isfinite(self.restart_factor) | (self.restart_factor < 0) | (self.restart_factor > 1)
        )
        if bad.size:
            raise InvalidProblem(
                f"restart_factor[{bad[0]}] must be in [0, 1], got {self.restart_factor[bad[0]]}"
            )
        bad = np.flatnonzero((self.min_replicas < 0) | (self.min_replicas > self.max_replicas))
        if bad.size:
            raise InvalidProblem(
                f"job {bad[0]}: min_replicas={self.min_replicas[bad[0]]} must be in "
                f"[0, max_replicas={self.max_replicas[bad[0]]}]"
            )

    def _validate_current(self) -> None:
        if np.any(self.current < 0):
            raise InvalidProblem("current placement must be non-negative")
        over = np.flatnonzero(self.current.sum(axis=0) > self.capacity)
        if over.size:
            raise InvalidProblem(
                f"current placement on node {over[0]} uses {self.current.sum(axis=0)[over[0]]} "
                f"> capacity {self.capacity[over[0]]}"
            )


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


def power_mean(x: np.ndarray, w: np.ndarray, p: float, eps: float = EPS) -> float:
    """Weighted power mean ``(sum w (x+eps)^p / sum w)^(1/p)`` (geometric for p = 0)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if x.size == 0:
        return 0.0
    y = x + eps
    if p == 0:
        return float(np.exp(np.sum(w * np.log(y)) / np.sum(w)))
    return float((np.sum(w * np.power(y, p)) / np.sum(w)) ** (1.0 / p))


def mean_from_utility_sum(total: float, w_sum: float, p: float) -> float:
    """Invert :func:`utility`: the power mean given ``sum_j w_j u(x_j)``."""
    if p == 0:
        return float(math.exp(total / w_sum))
    inner = total / w_sum * (1.0 if p > 0 else -1.0)
    if inner <= 0:
        return float("inf") if p < 0 else 0.0
    return float(inner ** (1.0 / p))


def job_values(problem: Problem, placement: np.ndarray) -> np.ndarray:
    """float64[J] ``x_j = s_j f_j`` of a placement (restart factor applied on a move).

    Raises:
        InvalidProblem: if a job's (nodes, replicas) pair is not an allowed configuration.
    """
    x = np.asarray(placement, dtype=np.int64)
    reps = x.sum(axis=1)
    nodes = (x > 0).sum(axis=1)
    a, r = problem.table_shape
    in_range = (nodes <= a) & (reps <= r)
    s = np.full(problem.num_jobs, np.nan)
    idx = np.flatnonzero(in_range)
    s[idx] = problem.speedup_table[idx, nodes[idx], reps[idx]]
    s[reps == 0] = 0.0
    bad = np.flatnonzero(np.isnan(s))
    if bad.size:
        j = bad[0]
        raise InvalidProblem(
            f"job {j} is placed on (nodes={nodes[j]}, replicas={reps[j]}), "
            "which is not one of its allowed configurations"
        )
    moved = problem.has_current & np.any(x != problem.current, axis=1)
    return s * np.where(moved, problem.restart_factor, 1.0)


def evaluate(problem: Problem, placement: np.ndarray) -> float:
    """Pinned objective M_p of a placement matrix int[J, N] (see module docstring)."""
    return power_mean(job_values(problem, placement), problem.weight, problem.p)


def violations(problem: Problem, placement: np.ndarray) -> list[str]:
    """Every constraint a placement int[J, N] breaks, as messages (empty if feasible)."""
    x = np.asarray(placement)
    out: list[str] = []
    if x.shape != (problem.num_jobs, problem.num_nodes):
        return [f"placement shape {x.shape} != ({problem.num_jobs}, {problem.num_nodes})"]
    if np.any(x < 0):
        out.append("negative replica count")
    load = x.sum(axis=0)
    for n in np.flatnonzero(load > problem.capacity):
        out.append(f"node {n}: {load[n]} replicas > capacity {problem.capacity[n]}")
    reps = x.sum(axis=1)
    nodes = (x > 0).sum(axis=1)
    for j in range(problem.num_jobs):
        if reps[j] == 0:
            continue
        if not problem.min_replicas[j] <= reps[j] <= problem.max_replicas[j]:
            out.append(
                f"job {j}: {reps[j]} replicas outside [{problem.min_replicas[j]}, "
                f"{problem.max_replicas[j]}]"
            )
        if nodes[j] > problem.max_nodes_per_job:
            out.append(f"job {j}: spans {nodes[j]} nodes > {problem.max_nodes_per_job}")
    try:
        job_values(problem, x)
    except InvalidProblem as exc:
        out.append(str(exc))
    if problem.interference_avoidance:
        multi = nodes > 1
        shared = ((x > 0) & multi[:, None]).sum(axis=0)
        for n in np.flatnonzero(shared > 1):
            out.append(f"node {n}: hosts {shared[n]} multi-node jobs")
    return out
