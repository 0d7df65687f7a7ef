"""Domain objects at the edges: cluster, jobs, options and the allocation result.

These are what users build and read; :mod:`pollux_opt.model.allocate` encodes them
into a :class:`solvers.Problem` of plain arrays and decodes the answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Mapping

from solvers import InvalidProblem, Status

from pollux_opt.model.goodput import GoodputModel

__all__ = ["Node", "Cluster", "Job", "Options", "BatchConfig", "Allocation", "restart_factor"]

#: Pinned defaults of the allocation options (issue 2; Pollux, OSDI 2021, section 4.2).
DEFAULT_P = -1.0
#: Restart delay delta in seconds: Pollux's simulator charges 30 s per restart.
DEFAULT_RESTART_DELAY = 30.0
#: Largest number of nodes a job may span (Pollux's reference caps at 16).
DEFAULT_MAX_NODES_PER_JOB = 16
#: Relative MIP gap at which the exact solver stops.
DEFAULT_MIP_GAP = 1e-4
#: Relative speedup discount per node beyond the first for jobs whose speedups
#: come from a goodput model (project choice).  Pollux's model tells one node
#: from several but not 2 nodes from 14, so every spread of K replicas looks
#: equally good, and the solver may pick a wide one; each node a multi-node job
#: touches is then closed to other multi-node jobs (interference avoidance).
#: 0.1 % per node breaks those ties towards compact placements and is small
#: against real speedup differences; on the eight AdaptDL workloads (issue 6)
#: it lowered Pollux's average JCT by 0.3 % alone and by 0.9 % with the
#: one-node fair-share base (``_policies._feasible_base``).
DEFAULT_SPREAD_PENALTY = 1e-3


@dataclass(frozen=True)
class Node:
    """A node with ``cpus`` allocatable cores (or GPUs: the unit is a replica slot)."""

    id: str
    cpus: int

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InvalidProblem(f"node id must be a non-empty string, got {self.id!r}")
        if isinstance(self.cpus, bool) or not isinstance(self.cpus, int) or self.cpus <= 0:
            raise InvalidProblem(f"node {self.id!r}: cpus must be an integer > 0, got {self.cpus!r}")


@dataclass(frozen=True)
class Cluster:
    """An ordered set of nodes with unique ids."""

    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise InvalidProblem("cluster.nodes must not be empty")
        seen: set[str] = set()
        for node in self.nodes:
            if node.id in seen:
                raise InvalidProblem(f"duplicate node id {node.id!r}")
            seen.add(node.id)

    @classmethod
    def uniform(cls, num_nodes: int, cpus_per_node: int, prefix: str = "n") -> "Cluster":
        """``num_nodes`` identical nodes named ``n0, n1, ...``."""
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes <= 0:
            raise InvalidProblem(f"num_nodes must be an integer > 0, got {num_nodes!r}")
        return cls(tuple(Node(f"{prefix}{i}", cpus_per_node) for i in range(num_nodes)))

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    @property
    def total_cpus(self) -> int:
        return sum(n.cpus for n in self.nodes)


@dataclass(frozen=True)
class Job:
    """A job to allocate.

    Attributes:
        id: unique job id.
        speedup: either an explicit table ``{(num_nodes, num_replicas): speedup}``
            (an absent pair is not allowed) or a :class:`GoodputModel`, whose
            speedup over ``base`` is evaluated at every placeable pair.
        max_replicas: largest replica count allowed.
        min_replicas: smallest non-zero replica count (0: any).
        placement: current replicas per node id (empty for a job not running).
        restarts: restarts so far.
        age: seconds since submission.
        weight: weight in the power mean (> 0).
        base: (num_nodes, num_replicas) of the base allocation for a goodput
            model's speedup, e.g. a fair share; default one replica on one node.
        fixed_batch_size: with a goodput model, speedups from throughput alone at
            this total batch size (no statistical efficiency, no batch adaptation).
    """

    id: str
    speedup: Mapping[tuple[int, int], float] | GoodputModel
    max_replicas: int
    min_replicas: int = 0
    placement: Mapping[str, int] = field(default_factory=dict)
    restarts: int = 0
    age: float = 0.0
    weight: float = 1.0
    base: tuple[int, int] = (1, 1)
    fixed_batch_size: int | None = None

    def __post_init__(self) -> None:
        name = f"job {self.id!r}"
        if not isinstance(self.id, str) or not self.id:
            raise InvalidProblem(f"job id must be a non-empty string, got {self.id!r}")
        for attr in ("max_replicas", "min_replicas", "restarts"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidProblem(f"{name}: {attr} must be an integer >= 0, got {v!r}")
        if self.min_replicas > self.max_replicas:
            raise InvalidProblem(
                f"{name}: min_replicas={self.min_replicas} > max_replicas={self.max_replicas}"
            )
        for attr in ("age", "weight"):
            v = getattr(self, attr)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InvalidProblem(f"{name}: {attr} must be a finite number, got {v!r}")
        if self.age < 0:
            raise InvalidProblem(f"{name}: age must be >= 0, got {self.age!r}")
        if self.weight <= 0:
            raise InvalidProblem(f"{name}: weight must be > 0, got {self.weight!r}")
        if not isinstance(self.speedup, GoodputModel):
            table = dict(self.speedup)
            for key, s in table.items():
                if (
                    not isinstance(key, tuple)
                    or len(key) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in key)
                ):
                    raise InvalidProblem(f"{name}: speedup key must be (num_nodes, num_replicas), got {key!r}")
                nn, k = key
                if nn < 1 or k < nn:
                    raise InvalidProblem(
                        f"{name}: speedup pair (num_nodes={nn}, num_replicas={k}) needs 1 <= num_nodes <= num_replicas"
                    )
                if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
                    raise InvalidProblem(
                        f"{name}: speedup at (num_nodes={nn}, num_replicas={k}) must be finite and >= 0, got {s!r}"
                    )
            object.__setattr__(self, "speedup", table)
        placement = dict(self.placement)
        for node, k in placement.items():
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise InvalidProblem(f"{name}: placement on node {node!r} must be an integer >= 0, got {k!r}")
        object.__setattr__(self, "placement", {n: k for n, k in placement.items() if k > 0})
        object.__setattr__(self, "base", tuple(self.base))


@dataclass(frozen=True)
class Options:
    """Allocation options (keyword-only overrides of :func:`pollux_opt.allocate`).

    Attributes:
        p: fairness exponent of the power mean (finite; -1 in Pollux).
        restart_delay: delta, seconds a restart costs (Pollux uses 30 s).
        interference_avoidance: at most one multi-node job per node.
        max_nodes_per_job: largest number of nodes a job may span.
        solver: registered solver name (see ``solvers.SOLVERS``).
        time_limit: solver wall-clock limit in seconds (None: none).
        mip_gap: relative MIP gap for exact solvers.
        seed: random seed for randomised solvers.
        spread_penalty: relative discount of a goodput model's speedup per
            node beyond the first, ``s (1 - spread_penalty (N - 1))``: a
            tie-break towards compact placements (explicit speedup tables are
            used as given).  In ``[0, 1 / (max_nodes_per_job - 1))``.
    """

    p: float = DEFAULT_P
    restart_delay: float = DEFAULT_RESTART_DELAY
    interference_avoidance: bool = True
    max_nodes_per_job: int = DEFAULT_MAX_NODES_PER_JOB
    solver: str = "milp"
    time_limit: float | None = None
    mip_gap: float = DEFAULT_MIP_GAP
    seed: int | None = None
    spread_penalty: float = DEFAULT_SPREAD_PENALTY

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, (int, float)) or not math.isfinite(self.p):
            raise InvalidProblem(f"p must be a finite number, got {self.p!r}")
        d = self.restart_delay
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0:
            raise InvalidProblem(f"restart_delay must be a finite number >= 0, got {d!r}")
        if not isinstance(self.interference_avoidance, bool):
            raise InvalidProblem(
                f"interference_avoidance must be true or false, got {self.interference_avoidance!r}"
            )
        m = self.max_nodes_per_job
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise InvalidProblem(f"max_nodes_per_job must be an integer >= 1, got {m!r}")
        if not isinstance(self.solver, str):
            raise InvalidProblem(f"solver must be a name, got {self.solver!r}")
        t = self.time_limit
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0):
            raise InvalidProblem(f"time_limit must be a number of seconds > 0, got {t!r}")
        g = self.mip_gap
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g < 1:
            raise InvalidProblem(f"mip_gap must be in [0, 1), got {g!r}")
        s = self.seed
        if s is not None and (isinstance(s, bool) or not isinstance(s, int)):
            raise InvalidProblem(f"seed must be an integer, got {s!r}")
        sp = self.spread_penalty
        bad = isinstance(sp, bool) or not isinstance(sp, (int, float)) or not math.isfinite(sp)
        if bad or not (sp >= 0 and sp * (m - 1) < 1):
            raise InvalidProblem(
                f"spread_penalty must be >= 0 and below 1 / (max_nodes_per_job - 1) = "
                f"{1 / max(m - 1, 1):g}, got {sp!r}"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], base: "Options | None" = None) -> "Options":
        """Options from a mapping; an unknown key raises :class:`InvalidProblem` naming it."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise InvalidProblem(f"unknown option {key!r}; known options are {sorted(known)}")
        current = {f.name: getattr(base or cls(), f.name) for f in fields(cls)}
        current.update(values)
        return cls(**current)


@dataclass(frozen=True)
class BatchConfig:
    """Per-job batch configuration chosen by its goodput model at the allocated placement."""

    local_bsz: int
    accum_steps: int
    batch_size: int
    goodput: float


@dataclass(frozen=True)
class Allocation:
    """The answer of :func:`pollux_opt.allocate`.

    Attributes:
        placement: job id -> {node id: replicas} (jobs given nothing map to {}).
        batch: job id -> :class:`BatchConfig` for jobs with a goodput model and replicas.
        objective: pinned power-mean objective of ``placement``.
        bound: best proven upper bound (nan if the solver proves none).
        gap: relative gap to the bound (nan if no bound).
        status: why the solver stopped (kept apart from how good the answer is).
        build_seconds, solve_seconds: wall time of model build and solve.
        solver: name of the solver used.
    """

    placement: dict[str, dict[str, int]]
    batch: dict[str, BatchConfig]
    objective: float
    bound: float
    gap: float
    status: Status
    build_seconds: float
    solve_seconds: float
    solver: str

    def to_json(self) -> dict:
        """The CLI's JSON object (nan written as null)."""

        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "placement": self.placement,
            "objective": num(self.objective),
            "bound": num(self.bound),
            "gap": num(self.gap),
            "status": self.status.value,
            "build_seconds": self.build_seconds,
            "solve_seconds": self.solve_seconds,
            "solver": self.solver,
            "batch": {
                j: {"local_bsz": b.local_bsz, "accum_steps": b.accum_steps, "batch_size": b.batch_size}
                for j, b in self.batch.items()
            },
        }


def restart_factor(age: float, restarts: int, delay: float) -> float:
    """Pollux's restart factor ``max(age - restarts * delay, 0) / (age + delay)``.

    Pollux (OSDI 2021, section 4.2) discounts a move by the fraction of the job's
    life not spent restarting; with ``delay = 0`` a restart is free (factor 1).
    """
    if age + delay <= 0:
        return 1.0
    return max(age - restarts * delay, 0.0) / (age + delay)
