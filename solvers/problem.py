"""The allocation problem as plain arrays, its domain, and its pinned objective.

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
  geometric mean of ``x_j + eps`` when ``p = 0`` (and, as its limit, when
  ``|p| < GEOMETRIC_P``), computed stably by :func:`solvers.power_mean`.

Domain.  Every numeric field has bounds (:mod:`solvers.domain`, re-exported
here; docs/formulation.md has the table); a value outside raises
:class:`InvalidProblem` naming the field and the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .domain import MAX_CPUS, MAX_REPLICAS, MAX_SPEEDUP, P_RANGE, WEIGHT_RANGE
from .errors import InvalidProblem
from .objective import EPS, GEOMETRIC_P, mean_from_utility_sum, power_mean, utility

__all__ = [
    "EPS",
    "GEOMETRIC_P",
    "MAX_CPUS",
    "MAX_REPLICAS",
    "MAX_SPEEDUP",
    "P_RANGE",
    "WEIGHT_RANGE",
    "Problem",
    "evaluate",
    "job_values",
    "mean_from_utility_sum",
    "power_mean",
    "utility",
    "violations",
]

#: Fields converted to arrays, with their dtypes.
_ARRAYS = {
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


@dataclass(frozen=True, eq=False)
class Problem:
    """A frozen allocation problem over J jobs, N nodes and C candidate configurations.

    A *configuration* of a job is a pair (nodes, replicas) with a speedup; the
    job may use any listed configuration or none (zero replicas, speedup 0).
    Configurations are listed job by job (``cfg_job`` non-decreasing).

    Attributes:
        capacity: int64[N] CPUs (or GPUs) per node, in [1, MAX_CPUS].
        cfg_job: int64[C] job index of each configuration.
        cfg_nodes: int64[C] number of distinct nodes the configuration spans (>= 1).
        cfg_replicas: int64[C] total replicas (>= cfg_nodes).
        cfg_speedup: float64[C] speedup over the job's base allocation, in [0, MAX_SPEEDUP].
        current: int64[J, N] replicas each job holds now (zeros for a new job).
        restart_factor: float64[J] factor f_j in [0, 1] applied when a running job moves.
        weight: float64[J] weights w_j of the power mean, in WEIGHT_RANGE.
        min_replicas: int64[J] smallest non-zero replica count allowed.
        max_replicas: int64[J] largest replica count allowed, at most MAX_REPLICAS.
        p: fairness exponent of the power mean, in P_RANGE (-1 in Pollux).
        max_nodes_per_job: largest number of nodes one job may span, in [1, MAX_REPLICAS].
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
        for name, dtype in _ARRAYS.items():
            try:
                arr = np.array(getattr(self, name), dtype=dtype, copy=True)
            except (OverflowError, ValueError, TypeError) as exc:
                raise InvalidProblem(f"{name} must convert to {np.dtype(dtype).name}: {exc}") from None
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        for name, kind in (("p", float), ("max_nodes_per_job", int)):
            try:
                object.__setattr__(self, name, kind(getattr(self, name)))
            except (OverflowError, ValueError, TypeError):
                raise InvalidProblem(f"{name} must be a {kind.__name__}, got {getattr(self, name)!r}") from None
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

        Entry ``[j, 0, 0]`` is 0: every job may hold nothing.  Dense, so only
        for small tables (tests, inspection); the solvers look pairs up with
        :meth:`lookup_speedup`, whose cost does not grow with A or R.
        """
        a, r = self.table_shape
        table = np.full((self.num_jobs, a + 1, r + 1), np.nan)
        table[:, 0, 0] = 0.0
        table[self.cfg_job, self.cfg_nodes, self.cfg_replicas] = self.cfg_speedup
        table.setflags(write=False)
        return table

    @cached_property
    def _config_keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(in-job keys, sorted global keys, configuration of each sorted key), all int64.

        A configuration's in-job key is ``nodes (R + 1) + replicas`` (< 2^62 in
        the domain); its global key is ``job U + rank of the in-job key among
        the U distinct ones``, so that one sorted int64 array orders them all.
        """
        r = self.table_shape[1]
        inner = self.cfg_nodes * (r + 1) + self.cfg_replicas
        distinct = np.unique(inner)
        keys = self.cfg_job * distinct.size + np.searchsorted(distinct, inner)
        order = np.argsort(keys, kind="stable")
        return distinct, keys[order], order

    def lookup_speedup(self, jobs: np.ndarray, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        """float64[...] speedup of each (job, nodes, replicas) pair, ``nan`` where not a configuration.

        O(log C) per pair by binary search over the configurations, never a
        dense table; (0 nodes, 0 replicas) is not a configuration here.
        """
        jobs, nodes, replicas = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (jobs, nodes, replicas)))
        out = np.full(jobs.shape, np.nan)
        if self.num_configs == 0:
            return out
        a, r = self.table_shape
        distinct, keys, order = self._config_keys
        valid = (nodes >= 1) & (nodes <= a) & (replicas >= 1) & (replicas <= r)
        inner = np.where(valid, nodes, 0) * (r + 1) + np.where(valid, replicas, 0)
        rank = np.minimum(np.searchsorted(distinct, inner), distinct.size - 1)
        valid &= distinct[rank] == inner
        query = jobs * distinct.size + rank
        at = np.minimum(np.searchsorted(keys, query), keys.size - 1)
        valid &= keys[at] == query
        out[valid] = self.cfg_speedup[order[at[valid]]]
        return out

    def fits_cluster(self, replicas: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """bool[...]: ``replicas`` fit on some ``nodes`` nodes of the cluster by capacity alone.

        True when ``nodes <= N`` and ``replicas`` is at most the capacity of
        the ``nodes`` largest nodes (the interference rule is not considered).
        """
        top = np.concatenate([[0], np.cumsum(np.sort(self.capacity)[::-1])])
        nodes = np.asarray(nodes, dtype=np.int64)
        return (nodes <= self.num_nodes) & (np.asarray(replicas) <= top[np.clip(nodes, 0, self.num_nodes)])

    @cached_property
    def has_current(self) -> np.ndarray:
        """bool[J]: the job holds replicas now (so moving it is a restart)."""
        return self.current.sum(axis=1) > 0

    # -------------------------------------------------------------- validation
    def _validate(self) -> None:
        """Raise :class:`InvalidProblem` for the first broken rule, naming the field and value."""
        self._validate_shapes()
        self._validate_scalars()
        self._validate_jobs()
        if self.num_configs:
            self._validate_configs()
        self._validate_current()

    def _validate_shapes(self) -> None:
        j, n, c = self.num_jobs, self.num_nodes, self.num_configs
        if self.capacity.ndim != 1:
            raise InvalidProblem(f"capacity must be 1-D, got shape {self.capacity.shape}")
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

    def _validate_scalars(self) -> None:
        bad = np.flatnonzero(self.capacity <= 0)
        if bad.size:
            raise InvalidProblem(f"capacity[{bad[0]}] must be > 0, got {self.capacity[bad[0]]}")
        bad = np.flatnonzero(self.capacity > MAX_CPUS)
        if bad.size:
            raise InvalidProblem(f"capacity[{bad[0]}] must be <= MAX_CPUS = {MAX_CPUS}, got {self.capacity[bad[0]]}")
        if not math.isfinite(self.p):
            raise InvalidProblem(f"p must be finite, got {self.p}")
        if not P_RANGE[0] <= self.p <= P_RANGE[1]:
            raise InvalidProblem(f"p must be in P_RANGE = [{P_RANGE[0]}, {P_RANGE[1]}], got {self.p}")
        if not 1 <= self.max_nodes_per_job <= MAX_REPLICAS:
            raise InvalidProblem(f"max_nodes_per_job must be in [1, {MAX_REPLICAS}], got {self.max_nodes_per_job}")

    def _validate_configs(self) -> None:
        j = self.num_jobs
        if np.any(np.diff(self.cfg_job) < 0) or self.cfg_job[0] < 0 or self.cfg_job[-1] >= j:
            raise InvalidProblem("cfg_job must be sorted job indices in [0, num_jobs)")
        bad = np.flatnonzero(~np.isfinite(self.cfg_speedup) | (self.cfg_speedup < 0))
        if bad.size:
            raise InvalidProblem(f"speedup of job {self._cfg(bad[0])} must be finite and >= 0, got {self.cfg_speedup[bad[0]]}")
        bad = np.flatnonzero(self.cfg_speedup > MAX_SPEEDUP)
        if bad.size:
            raise InvalidProblem(
                f"speedup of job {self._cfg(bad[0])} must be <= MAX_SPEEDUP = {MAX_SPEEDUP}, got {self.cfg_speedup[bad[0]]}"
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
        keys = self._config_keys[1]
        if np.any(keys[1:] == keys[:-1]):
            raise InvalidProblem("a job lists the same (nodes, replicas) configuration twice")

    def _cfg(self, k: int) -> str:
        """Configuration ``k`` as "J at (nodes=A, replicas=R)" for messages."""
        return f"{self.cfg_job[k]} at (nodes={self.cfg_nodes[k]}, replicas={self.cfg_replicas[k]})"

    def _validate_jobs(self) -> None:
        bad = np.flatnonzero(~np.isfinite(self.weight) | (self.weight <= 0))
        if bad.size:
            raise InvalidProblem(f"weight[{bad[0]}] must be finite and > 0, got {self.weight[bad[0]]}")
        bad = np.flatnonzero((self.weight < WEIGHT_RANGE[0]) | (self.weight > WEIGHT_RANGE[1]))
        if bad.size:
            raise InvalidProblem(
                f"weight[{bad[0]}] must be in WEIGHT_RANGE = [{WEIGHT_RANGE[0]:g}, {WEIGHT_RANGE[1]:g}], "
                f"got {self.weight[bad[0]]}"
            )
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
        bad = np.flatnonzero(self.max_replicas > MAX_REPLICAS)
        if bad.size:
            raise InvalidProblem(
                f"max_replicas[{bad[0]}] must be <= MAX_REPLICAS = {MAX_REPLICAS}, got {self.max_replicas[bad[0]]}"
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


def job_values(problem: Problem, placement: np.ndarray) -> np.ndarray:
    """float64[J] ``x_j = s_j f_j`` of a placement (restart factor applied on a move).

    Raises:
        InvalidProblem: if a job's (nodes, replicas) pair is not an allowed configuration.
    """
    x = np.asarray(placement, dtype=np.int64)
    reps = x.sum(axis=1)
    nodes = (x > 0).sum(axis=1)
    s = problem.lookup_speedup(np.arange(problem.num_jobs), nodes, reps)
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
    out_of_range = (reps > 0) & ((reps < problem.min_replicas) | (reps > problem.max_replicas))
    too_wide = (reps > 0) & (nodes > problem.max_nodes_per_job)
    for j in np.flatnonzero(out_of_range | too_wide):  # vectorised test, messages in job order
        if out_of_range[j]:
            out.append(
                f"job {j}: {reps[j]} replicas outside [{problem.min_replicas[j]}, "
                f"{problem.max_replicas[j]}]"
            )
        if too_wide[j]:
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
