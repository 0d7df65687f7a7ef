"""What a scheduler asks an elastic job to run on: replicas per node, optional
CPU pins, and optionally the batch configuration (:class:`WorkerAllocation`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from solvers import InvalidProblem

from pollux_opt.model import BatchConfig, BatchLimits
from pollux_opt.model.domains import Integer, check
from pollux_opt.runtime.adapt import check_allocation
from pollux_opt.runtime.report import normalize_placement

__all__ = ["WorkerAllocation", "parse_allocation"]

#: A CPU id a replica is pinned to.
_CPU_ID = Integer(ge=0)


@dataclass(frozen=True)
class WorkerAllocation:
    """The workers a job is asked to run on.

    Attributes:
        placement: ``{node: replicas}`` (string node keys, no zero entries).
        cpus: CPU ids to pin the replicas to, one per replica in rank order, or None.
        pin: the batch configuration to run, exactly, until the next allocation
            (None: the job chooses its own, see :mod:`~pollux_opt.runtime.adapt`).
    """

    placement: Mapping[str, int]
    cpus: tuple[int, ...] | None = None
    pin: BatchConfig | None = None

    @property
    def num_replicas(self) -> int:
        return sum(self.placement.values())

    @property
    def num_nodes(self) -> int:
        return len(self.placement)

    def same_workers(self, other: "WorkerAllocation | None") -> bool:
        """Whether ``other`` asks for the same placement and CPUs (whatever its batch)."""
        return other is not None and self.placement == other.placement and self.cpus == other.cpus


def parse_allocation(
    limits: BatchLimits,
    fixed_batch_size: int | None,
    replicas: int | Mapping[Any, int],
    num_nodes: int | None,
    cpus: Sequence[int] | None,
    local_bsz: int | None,
    accum_steps: int | None,
) -> WorkerAllocation:
    """The allocation of :meth:`ElasticJob.start` / ``rescale`` arguments, checked
    against the job's batch ``limits``; raises InvalidProblem naming a bad argument."""
    placement = normalize_placement(replicas, num_nodes)
    k = sum(placement.values())
    if cpus is not None:
        cpus = tuple(cpus)
        if len(cpus) != k or not all(_CPU_ID.accepts(c) for c in cpus):
            raise InvalidProblem(f"cpus must list one CPU id >= 0 per replica ({k}), got {cpus!r}")
        cpus = tuple(int(c) for c in cpus)
    if local_bsz is None and accum_steps is None:
        check_allocation(limits, len(placement), k, fixed_batch_size)
        return WorkerAllocation(placement, cpus, None)
    m = limits.min_local_bsz if local_bsz is None else local_bsz
    s = 0 if accum_steps is None else accum_steps
    m = check("local_bsz", m, Integer(ge=limits.min_local_bsz, le=limits.max_local_bsz))
    s = check("accum_steps", s, Integer(ge=0, le=limits.max_accum_steps))
    return WorkerAllocation(placement, cpus, BatchConfig(m, s))
