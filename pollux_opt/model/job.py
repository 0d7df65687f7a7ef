"""A job to allocate, and Pollux's restart factor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from solvers import InvalidProblem

from pollux_opt.model.domains import REQUIRED, Integer, Real, Text, check, check_fields, domain_field
from pollux_opt.model.goodput import GoodputModel

__all__ = ["Job", "restart_factor"]

#: Replica counts (of a job's limits, of its placement on a node) and restarts.
COUNT = Integer(ge=0)
#: A job's weight in the power mean.
WEIGHT = Real(gt=0)
#: A speedup of an explicit table (0: the pair gains nothing).
SPEEDUP = Real(ge=0)
#: The entries of a speedup table's key ``(num_nodes, num_replicas)``.
_PAIR_ENTRY = Integer()


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
        restart_delay: seconds a restart of this job costs (e.g. as measured),
            the delta of its restart factor (see :func:`restart_factor`);
            None: ``Options.restart_delay``.
    """

    id: str = domain_field(REQUIRED, Text())
    speedup: Mapping[tuple[int, int], float] | GoodputModel
    max_replicas: int = domain_field(REQUIRED, COUNT)
    min_replicas: int = domain_field(0, COUNT)
    placement: Mapping[str, int] = field(default_factory=dict)
    restarts: int = domain_field(0, COUNT)
    age: float = domain_field(0.0, Real(ge=0))
    weight: float = domain_field(1.0, WEIGHT)
    base: tuple[int, int] = (1, 1)
    fixed_batch_size: int | None = None
    restart_delay: float | None = domain_field(None, Real(ge=0, unit="seconds", none=True))

    def __post_init__(self) -> None:
        check_fields(self, prefix="job ", names=("id",))
        prefix = f"job {self.id!r}: "
        check_fields(self, prefix=prefix)
        if self.min_replicas > self.max_replicas:
            raise InvalidProblem(
                f"{prefix}min_replicas={self.min_replicas} > max_replicas={self.max_replicas}"
            )
        if not isinstance(self.speedup, GoodputModel):
            object.__setattr__(self, "speedup", _speedup_table(self.speedup, prefix))
        placement = {node: check(f"placement on node {node!r}", k, COUNT, prefix=prefix)
                     for node, k in dict(self.placement).items()}
        object.__setattr__(self, "placement", {n: k for n, k in placement.items() if k > 0})
        object.__setattr__(self, "base", tuple(self.base))


def _speedup_table(speedup: Mapping, prefix: str) -> dict[tuple[int, int], float]:
    """``speedup`` as a dict, its keys and speedups checked (``prefix`` names the job)."""
    table = dict(speedup)
    for key, s in table.items():
        if not isinstance(key, tuple) or len(key) != 2 or not all(_PAIR_ENTRY.accepts(x) for x in key):
            raise InvalidProblem(f"{prefix}speedup key must be (num_nodes, num_replicas), got {key!r}")
        nn, k = key
        if nn < 1 or k < nn:
            raise InvalidProblem(
                f"{prefix}speedup pair (num_nodes={nn}, num_replicas={k}) needs 1 <= num_nodes <= num_replicas"
            )
        check(f"speedup at (num_nodes={nn}, num_replicas={k})", s, SPEEDUP, prefix=prefix)
    return table


def restart_factor(age: float, restarts: int, delay: float) -> float:
    """Pollux's restart factor ``max(age - restarts * delay, 0) / (age + delay)``.

    Pollux (OSDI 2021, section 4.2) discounts a move by the fraction of the job's
    life not spent restarting; with ``delay = 0`` a restart is free (factor 1).
    """
    if age + delay <= 0:
        return 1.0
    return max(age - restarts * delay, 0.0) / (age + delay)
