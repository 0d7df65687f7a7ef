"""Allocation options and their pinned defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

# The relative MIP gap at which the exact solver stops is the solvers' own default.
from solvers import DEFAULT_MIP_GAP, MAX_REPLICAS, P_RANGE, InvalidProblem

from pollux_opt.model.domains import Boolean, Choice, Integer, Real, Text, check_fields, domain_field, shown

__all__ = [
    "DEFAULT_MAX_NODES_PER_JOB",
    "DEFAULT_MIP_GAP",
    "DEFAULT_P",
    "DEFAULT_RESTART_DELAY",
    "DEFAULT_SPREAD_PENALTY",
    "Options",
]

#: Pinned defaults of the allocation options (Pollux, OSDI 2021, section 4.2).
DEFAULT_P = -1.0
#: Restart delay delta in seconds: Pollux's simulator charges 30 s per restart.
DEFAULT_RESTART_DELAY = 30.0
#: Largest number of nodes a job may span (Pollux's reference caps at 16).
DEFAULT_MAX_NODES_PER_JOB = 16
#: Relative speedup discount per node beyond the first for jobs whose speedups
#: come from a goodput model (project choice).  Pollux's model tells one node
#: from several but not 2 nodes from 14, so every spread of K replicas looks
#: equally good, and the solver may pick a wide one; each node a multi-node job
#: touches is then closed to other multi-node jobs (interference avoidance).
#: 0.1 % per node breaks those ties towards compact placements and is small
#: against real speedup differences; on the eight AdaptDL workloads it
#: lowered Pollux's average JCT by 0.3 % alone and by 0.9 % with the
#: one-node fair-share base (``pollux_opt.scheduling.policies.views.feasible_base``).
DEFAULT_SPREAD_PENALTY = 1e-3
#: With the default penalty, the widest allowed spread keeps at least this
#: fraction of its speedup: a cluster allowing 2000-node jobs gets a smaller
#: per-node penalty instead of an error about an option the user never set.
MIN_SPREAD_DISCOUNT = 0.5
#: Seeds lie in [0, 2**63): numpy's and JAX's generators take a 64-bit seed.
SEED_LIMIT = 2**63
#: The values of :attr:`Options.shapes`.
SHAPES = Choice(("auto", "all", "sia"))


@dataclass(frozen=True)
class Options:
    """Allocation options (keyword-only overrides of :func:`pollux_opt.allocate`).

    Attributes:
        p: fairness exponent of the power mean, in ``solvers.P_RANGE`` (-1 in Pollux).
        restart_delay: delta, seconds a restart costs (Pollux uses 30 s).
        interference_avoidance: at most one multi-node job per node.
        max_nodes_per_job: largest number of nodes a job may span, at most
            ``solvers.MAX_REPLICAS``.
        solver: registered solver name (see ``solvers.SOLVERS``).
        time_limit: solver wall-clock limit in seconds (None: none).
        mip_gap: relative MIP gap for exact solvers.
        seed: random seed for randomised solvers, in [0, 2**63).
        spread_penalty: relative discount of a goodput model's speedup per
            node beyond the first, ``s (1 - spread_penalty (N - 1))``: a
            tie-break towards compact placements (explicit speedup tables are
            used as given).  In ``[0, 1 / (max_nodes_per_job - 1))``; None
            (default): ``DEFAULT_SPREAD_PENALTY``, lowered where needed so that
            the widest spread keeps ``MIN_SPREAD_DISCOUNT`` of its speedup.
        shapes: the (nodes, replicas) shapes a goodput-model job may take
            (:mod:`pollux_opt.model.configs`): ``"all"`` pairs, Sia's
            configurations (``"sia"``: powers of two on one node, whole nodes
            beyond), or ``"auto"`` (default): Sia's on a cluster of several
            node types, all on one.  Explicit speedup tables are used as given.
    """

    p: float = domain_field(DEFAULT_P, Real(ge=P_RANGE[0], le=P_RANGE[1]))
    restart_delay: float = domain_field(DEFAULT_RESTART_DELAY, Real(ge=0, unit="seconds"))
    interference_avoidance: bool = domain_field(True, Boolean())
    max_nodes_per_job: int = domain_field(DEFAULT_MAX_NODES_PER_JOB, Integer(ge=1, le=MAX_REPLICAS))
    solver: str = domain_field("milp", Text(what="a name"))
    time_limit: float | None = domain_field(None, Real(gt=0, finite=False, unit="seconds", none=True))
    mip_gap: float = domain_field(DEFAULT_MIP_GAP, Real(ge=0, lt=1))
    seed: int | None = domain_field(None, Integer(ge=0, lt=SEED_LIMIT, none=True))
    spread_penalty: float | None = domain_field(None, Real(ge=0, none=True))
    shapes: str = domain_field("auto", SHAPES)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.spread_penalty is None:
            widest = max(self.max_nodes_per_job - 1, 1)
            default = min(DEFAULT_SPREAD_PENALTY, (1 - MIN_SPREAD_DISCOUNT) / widest)
            object.__setattr__(self, "spread_penalty", default)
        # A cross-field bound: the discount of the widest spread stays below 1.
        m, sp = self.max_nodes_per_job, self.spread_penalty
        if not sp * (m - 1) < 1:
            raise InvalidProblem(
                f"spread_penalty must be >= 0 and below 1 / (max_nodes_per_job - 1) = "
                f"{1 / max(m - 1, 1):g}, got {sp!r}"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], base: "Options | None" = None) -> "Options":
        """Options from a mapping; an unknown key raises :class:`InvalidProblem` naming it."""
        if not isinstance(values, Mapping):
            raise InvalidProblem(f"options must be a mapping of option names to values, got {shown(values)}")
        if base is not None and not isinstance(base, Options):
            raise InvalidProblem(f"base must be an Options or None, got {shown(base)}")
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise InvalidProblem(f"unknown option {key!r}; known options are {sorted(known)}")
        if base is None:
            return cls(**values)
        current = {f.name: getattr(base, f.name) for f in fields(cls)}
        current.update(values)
        return cls(**current)
