"""A job to allocate, and Pollux's restart factor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from solvers import MAX_CPUS, MAX_REPLICAS, MAX_SPEEDUP, WEIGHT_RANGE, InvalidProblem

from pollux_opt.model.domains import REQUIRED, Integer, Real, Text, check, check_fields, domain_field, shown
from pollux_opt.model.goodput import GoodputModel
from pollux_opt.model.typed import TypedGoodput, TypedTable

__all__ = ["Job", "restart_factor"]

#: A job's replica limits, bounded as the solvers bound them.
REPLICAS = Integer(ge=0, le=MAX_REPLICAS)
#: Replicas of a placement on one node: at most any node's capacity.
NODE_REPLICAS = Integer(ge=0, le=MAX_CPUS)
#: Largest restart count: 2**53, the largest integer a float64 holds exactly
#: (the restart factor multiplies it by the restart delay in floating point).
MAX_RESTARTS = 2**53
#: Restarts so far.
RESTARTS = Integer(ge=0, le=MAX_RESTARTS)
#: A job's weight in the power mean, in the solvers' range.
WEIGHT = Real(ge=WEIGHT_RANGE[0], le=WEIGHT_RANGE[1])
#: A speedup of an explicit table (0: the pair gains nothing), at most the solvers' largest.
SPEEDUP = Real(ge=0, le=MAX_SPEEDUP)
#: The entries of a speedup table's key ``(num_nodes, num_replicas)``.
_PAIR_ENTRY = Integer()


@dataclass(frozen=True)
class Job:
    """A job to allocate.

    Attributes:
        id: unique job id.
        speedup: either an explicit table ``{(num_nodes, num_replicas): speedup}``
            (an absent pair is not allowed) or a :class:`GoodputModel`, whose
            speedup over ``base`` is evaluated at every placeable pair, or a
            :class:`~pollux_opt.model.typed.TypedGoodput` (one model per node
            type over one base; ``base`` is then unused), or a
            :class:`~pollux_opt.model.typed.TypedTable` (one explicit table per
            node type).  A table or a single model applies to every node type
            of the cluster.
        max_replicas: largest replica count allowed, at most ``solvers.MAX_REPLICAS``.
        min_replicas: smallest non-zero replica count (0: any).
        placement: current replicas per node id (empty for a job not running).
        restarts: restarts so far, at most :data:`MAX_RESTARTS`.
        age: seconds since submission (finite, >= 0).
        weight: weight in the power mean, in ``solvers.WEIGHT_RANGE``.
        base: (num_nodes, num_replicas) of the base allocation for a goodput
            model's speedup, e.g. a fair share; default one replica on one node.
        fixed_batch_size: with a goodput model, speedups from throughput alone at
            this total batch size (no statistical efficiency, no batch adaptation).
        restart_delay: seconds a restart of this job costs (e.g. as measured),
            the delta of its restart factor (see :func:`restart_factor`);
            None: ``Options.restart_delay``.
    """

    id: str = domain_field(REQUIRED, Text())
    speedup: Mapping[tuple[int, int], float] | GoodputModel | TypedGoodput | TypedTable
    max_replicas: int = domain_field(REQUIRED, REPLICAS)
    min_replicas: int = domain_field(0, REPLICAS)
    placement: Mapping[str, int] = field(default_factory=dict)
    restarts: int = domain_field(0, RESTARTS)
    age: float = domain_field(0.0, Real(ge=0))
    weight: float = domain_field(1.0, WEIGHT)
    base: tuple[int, int] = (1, 1)
    fixed_batch_size: int | None = domain_field(None, Integer(gt=0, none=True))
    restart_delay: float | None = domain_field(None, Real(ge=0, unit="seconds", none=True))

    def __post_init__(self) -> None:
        check_fields(self, prefix="job ", names=("id",))
        prefix = f"job {self.id!r}: "
        check_fields(self, prefix=prefix)
        if self.min_replicas > self.max_replicas:
            raise InvalidProblem(
                f"{prefix}min_replicas={self.min_replicas} > max_replicas={self.max_replicas}"
            )
        if isinstance(self.speedup, TypedTable):
            tables = {t: _speedup_table(self.speedup.table(t), f"{prefix}type {t!r}: ") for t in self.speedup.types}
            object.__setattr__(self, "speedup", TypedTable.of(tables))
        elif not isinstance(self.speedup, (GoodputModel, TypedGoodput)):
            object.__setattr__(self, "speedup", _speedup_table(self.speedup, prefix))
        if not isinstance(self.placement, Mapping):
            raise InvalidProblem(
                f"{prefix}placement must be a mapping {{node id: replicas}}, got {shown(self.placement)}"
            )
        placement = {node: check(f"placement on node {node!r}", k, NODE_REPLICAS, prefix=prefix)
                     for node, k in self.placement.items()}
        object.__setattr__(self, "placement", {n: k for n, k in placement.items() if k > 0})
        object.__setattr__(self, "base", _pair(self.base, "base", prefix))


def _pair(key: object, what: str, prefix: str) -> tuple[int, int]:
    """``key`` as a ``(num_nodes, num_replicas)`` pair with ``1 <= num_nodes <= num_replicas``."""
    if not isinstance(key, tuple) or len(key) != 2 or not all(_PAIR_ENTRY.accepts(x) for x in key):
        raise InvalidProblem(f"{prefix}{what} must be a pair (num_nodes, num_replicas), got {shown(key)}")
    nn, k = int(key[0]), int(key[1])
    if nn < 1 or k < nn:
        raise InvalidProblem(
            f"{prefix}{what} pair (num_nodes={nn}, num_replicas={k}) needs 1 <= num_nodes <= num_replicas"
        )
    return nn, k


def _speedup_table(speedup: object, prefix: str) -> dict[tuple[int, int], float]:
    """``speedup`` as a dict, its keys and speedups checked (``prefix`` names the job)."""
    if not isinstance(speedup, Mapping):
        raise InvalidProblem(
            f"{prefix}speedup must be a GoodputModel or a mapping {{(num_nodes, num_replicas): speedup}}, "
            f"got {shown(speedup)}"
        )
    table = {}
    for key, s in speedup.items():
        nn, k = _pair(key, "speedup key", prefix)
        table[nn, k] = check(f"speedup at (num_nodes={nn}, num_replicas={k})", s, SPEEDUP, prefix=prefix)
    return table


def restart_factor(age: float, restarts: int, delay: float) -> float:
    """Pollux's restart factor ``max(age - restarts * delay, 0) / (age + delay)``.

    Pollux (OSDI 2021, section 4.2) discounts a move by the fraction of the job's
    life not spent restarting; with ``delay = 0`` a restart is free (factor 1).
    """
    if age + delay <= 0:
        return 1.0
    return max(age - restarts * delay, 0.0) / (age + delay)
