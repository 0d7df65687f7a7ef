"""The allocation problem as plain arrays, its domain, and its pinned objective.

Every solver takes a :class:`Problem` and returns a :class:`solvers.Result`.
The domain layer (``pollux_opt``) encodes jobs and a cluster into a Problem
and decodes the placement matrix back; nothing here knows about jobs.

Objective (pinned, so anyone can recompute it from a placement):

* job j placed with ``K_j = sum_n X[j, n]`` replicas on ``N_j = #{n: X[j, n] > 0}``
  nodes, all of node type ``t_j``, has speedup ``s_j = speedup_j(t_j, N_j, K_j)``
  (``s_j = 0`` when ``K_j = 0``); a job on nodes of two types is infeasible;
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
    "mean_from_utility_sum",
    "power_mean",
    "utility",
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

#: Optional fields: None means "every node and configuration has type 0".
_TYPE_ARRAYS = ("node_type", "cfg_type")


class _DefaultTypes(np.ndarray):
    """The zeros a Problem stores for ``node_type=None`` or ``cfg_type=None``.

    Marked, so that a Problem built from another one's fields
    (``dataclasses.replace(problem, capacity=...)``) reads it as None again
    and sizes its zeros to the new shapes.
    """


def _default_types(size: int) -> np.ndarray:
    return np.zeros(size, dtype=np.int64).view(_DefaultTypes)


@dataclass(frozen=True, eq=False)
class Problem:
    """A frozen allocation problem over J jobs, N nodes and C candidate configurations.

    A *configuration* of a job is a triple (type, nodes, replicas) with a
    speedup; the job may use any listed configuration or none (zero replicas,
    speedup 0).  Configurations are listed job by job (``cfg_job``
    non-decreasing).  A heterogeneous cluster has nodes of several *types*
    (GPU models): a configuration of type t uses nodes of type t only, so a
    job never spans two types (Sia, SOSP 2023).  Without ``node_type`` and
    ``cfg_type`` every node and configuration has type 0.

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
        node_type: int64[N] type of each node, in [0, N) (None: all 0; stored as zeros).
        cfg_type: int64[C] type of each configuration; some node has that type
            (None: all 0; stored as zeros).
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
    node_type: np.ndarray | None = None
    cfg_type: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name, dtype in _ARRAYS.items():
            try:
                arr = np.array(getattr(self, name), dtype=dtype, copy=True)
            except (OverflowError, ValueError, TypeError) as exc:
                raise InvalidProblem(f"{name} must convert to {np.dtype(dtype).name}: {exc}") from None
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        for name, like in zip(_TYPE_ARRAYS, (self.capacity, self.cfg_job)):
            value = getattr(self, name)
            default = value is None or isinstance(value, _DefaultTypes)
            try:
                arr = _default_types(like.shape[0] if like.ndim else 0) if default else np.array(value, dtype=np.int64, copy=True)
            except (OverflowError, ValueError, TypeError) as exc:
                raise InvalidProblem(f"{name} must convert to int64: {exc}") from None
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
    def num_types(self) -> int:
        """T, one more than the largest node or configuration type (at least 1)."""
        top = max(int(self.node_type.max(initial=0)), int(self.cfg_type.max(initial=0)))
        return top + 1

    @property
    def typed(self) -> bool:
        """True when some node or configuration has a type other than 0 (several types)."""
        return self.num_types > 1

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
        Configurations of every type land in the same table, so it describes
        a typed problem only per type (tests use it on untyped ones).
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
        the domain), made ``type U1 + rank of that among its U1 distinct
        values`` on a typed problem; its global key is ``job U + rank of the
        in-job key among the U distinct ones``, so that one sorted int64 array
        orders them all.
        """
        r = self.table_shape[1]
        inner = self.cfg_nodes * (r + 1) + self.cfg_replicas
        if self.typed:
            shapes = np.unique(inner)
            inner = self.cfg_type * shapes.size + np.searchsorted(shapes, inner)
        distinct = np.unique(inner)
        keys = self.cfg_job * distinct.size + np.searchsorted(distinct, inner)
        order = np.argsort(keys, kind="stable")
        return distinct, keys[order], order

    @cached_property
    def _shapes(self) -> np.ndarray:
        """int64[U1] sorted distinct ``nodes (R + 1) + replicas`` of the configurations (typed problems)."""
        return np.unique(self.cfg_nodes * (self.table_shape[1] + 1) + self.cfg_replicas)

    def lookup_speedup(
        self, jobs: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, types: np.ndarray | None = None
    ) -> np.ndarray:
        """float64[...] speedup of each (job, type, nodes, replicas), ``nan`` where not a configuration.

        ``types`` defaults to 0 (the only type of an untyped problem).  O(log C)
        per query by binary search over the configurations, never a dense
        table; (0 nodes, 0 replicas) is not a configuration here.
        """
        arrays = (jobs, nodes, replicas) + (() if types is None else (types,))
        jobs, nodes, replicas, *rest = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in arrays))
        out = np.full(jobs.shape, np.nan)
        if self.num_configs == 0:
            return out
        a, r = self.table_shape
        distinct, keys, order = self._config_keys
        valid = (nodes >= 1) & (nodes <= a) & (replicas >= 1) & (replicas <= r)
        inner = np.where(valid, nodes, 0) * (r + 1) + np.where(valid, replicas, 0)
        if self.typed:
            shapes = self._shapes
            at = np.minimum(np.searchsorted(shapes, inner), shapes.size - 1)
            valid &= shapes[at] == inner
            kind = rest[0] if rest else np.zeros_like(jobs)
            valid &= (kind >= 0) & (kind < self.num_types)
            inner = np.where(valid, kind, 0) * shapes.size + at
        elif rest:
            valid &= rest[0] == 0
        rank = np.minimum(np.searchsorted(distinct, inner), distinct.size - 1)
        valid &= distinct[rank] == inner
        query = jobs * distinct.size + rank
        at = np.minimum(np.searchsorted(keys, query), keys.size - 1)
        valid &= keys[at] == query
        out[valid] = self.cfg_speedup[order[at[valid]]]
        return out

    def fits_cluster(self, replicas: np.ndarray, nodes: np.ndarray, types: np.ndarray | None = None) -> np.ndarray:
        """bool[...]: ``replicas`` fit on some ``nodes`` nodes (of type ``types``) by capacity alone.

        True when ``nodes`` is at most the number of nodes of the type and
        ``replicas`` at most the capacity of its ``nodes`` largest nodes (the
        interference rule is not considered).  ``types`` defaults to every
        node (the untyped question).
        """
        nodes = np.asarray(nodes, dtype=np.int64)
        if types is None:
            top = np.concatenate([[0], np.cumsum(np.sort(self.capacity)[::-1])])
            return (nodes <= self.num_nodes) & (np.asarray(replicas) <= top[np.clip(nodes, 0, self.num_nodes)])
        replicas, nodes, types = np.broadcast_arrays(np.asarray(replicas), nodes, np.asarray(types, dtype=np.int64))
        out = np.zeros(nodes.shape, dtype=bool)
        for t in np.unique(types).tolist():
            cap = np.sort(self.capacity[self.node_type == t])[::-1]
            top = np.concatenate([[0], np.cumsum(cap)])
            at = types == t
            out[at] = (nodes[at] <= cap.size) & (replicas[at] <= top[np.clip(nodes[at], 0, cap.size)])
        return out

    def placement_types(self, placement: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(type int64[J], mixed bool[J]) of a placement int[J, N]: each job's node type, and
        whether its nodes have several types (type 0 for a job that holds nothing)."""
        used = np.asarray(placement) > 0
        low = np.where(used, self.node_type, self.num_types).min(axis=1, initial=self.num_types)
        high = np.where(used, self.node_type, -1).max(axis=1, initial=-1)
        placed = high >= 0
        return np.where(placed, low, 0), placed & (low != high)

    @cached_property
    def has_current(self) -> np.ndarray:
        """bool[J]: the job holds replicas now (so moving it is a restart)."""
        return self.current.sum(axis=1) > 0

    # -------------------------------------------------------------- validation
    def _validate(self) -> None:
        """Raise :class:`InvalidProblem` for the first broken rule, naming the field and value."""
        self._validate_shapes()
        self._validate_scalars()
        self._validate_types()
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
        for name, size in zip(_TYPE_ARRAYS, (n, c)):
            if getattr(self, name).shape != (size,):
                raise InvalidProblem(f"{name} must have shape ({size},), got {getattr(self, name).shape}")

    def _validate_types(self) -> None:
        n = self.num_nodes
        for name in _TYPE_ARRAYS:
            arr = getattr(self, name)
            bad = np.flatnonzero((arr < 0) | (arr >= max(n, 1)))
            if bad.size:
                raise InvalidProblem(f"{name}[{bad[0]}] must be a type index in [0, {max(n, 1)}), got {arr[bad[0]]}")
        if not self.typed:
            return  # type 0 everywhere (a cluster without nodes may still list configurations)
        present = np.zeros(n, dtype=bool)
        present[self.node_type] = True
        bad = np.flatnonzero(~present[self.cfg_type])
        if bad.size:
            raise InvalidProblem(
                f"cfg_type[{bad[0]}] = {self.cfg_type[bad[0]]} (job {self.cfg_job[bad[0]]}) names a type no node has"
            )

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
        keys, order = self._config_keys[1:]
        twice = np.flatnonzero(keys[1:] == keys[:-1])
        if twice.size:
            if self.typed:
                raise InvalidProblem(f"job {self._cfg(order[twice[0]])} lists the same (type, nodes, replicas) twice")
            raise InvalidProblem("a job lists the same (nodes, replicas) configuration twice")

    def _cfg(self, k: int) -> str:
        """Configuration ``k`` as "J at (nodes=A, replicas=R)" (with the type when typed) for messages."""
        kind = f"type={self.cfg_type[k]}, " if self.typed else ""
        return f"{self.cfg_job[k]} at ({kind}nodes={self.cfg_nodes[k]}, replicas={self.cfg_replicas[k]})"

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
