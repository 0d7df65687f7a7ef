"""A job to allocate, and Pollux's restart factor."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from solvers import InvalidProblem

from pollux_opt.model.goodput import GoodputModel

__all__ = ["Job", "restart_factor"]


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
    restart_delay: float | None = None

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
        d = self.restart_delay
        if d is not None and (
            isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d < 0
        ):
            raise InvalidProblem(f"{name}: restart_delay must be a finite number of seconds >= 0, got {d!r}")
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


def restart_factor(age: float, restarts: int, delay: float) -> float:
    """Pollux's restart factor ``max(age - restarts * delay, 0) / (age + delay)``.

    Pollux (OSDI 2021, section 4.2) discounts a move by the fraction of the job's
    life not spent restarting; with ``delay = 0`` a restart is free (factor 1).
    """
    if age + delay <= 0:
        return 1.0
    return max(age - restarts * delay, 0.0) / (age + delay)
