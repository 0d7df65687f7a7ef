"""Tiresias, the least-attained-service baseline of Pollux's evaluation (policy ``"tiresias"``).

Two-dimensional least-attained-service (Gu et al., NSDI 2019, "Tiresias",
section 4.1, discretized 2D-LAS): a job's priority is its attained service in
replica-seconds (the two dimensions: replicas x time), discretized into
multi-level queues by thresholds; FIFO by arrival within a queue.  Each round,
jobs are admitted in priority order while their fixed (tuned) replica count
fits; a job that no longer fits is preempted.  Jobs run with their tuned fixed
configuration (replicas and batch size), each on as few nodes as it fits
(Tiresias' consolidated placement; :func:`~pollux_opt.scheduling.policies.packing.pack`).
Pollux (section 5.2) uses two queues with a 16 GPU-hour threshold.

It reads only what every backend reports (attained service, the submitted
configuration), so it runs on real jobs as well as in the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model import Cluster
from pollux_opt.model.domains import Real
from pollux_opt.scheduling.loop import Decision, DecisionStatus, JobView
from pollux_opt.scheduling.policies.packing import pack
from pollux_opt.scheduling.policies.views import active_views, requested_replicas

__all__ = ["TIRESIAS_THRESHOLDS_S", "TiresiasPolicy"]

#: Tiresias queue thresholds in replica-seconds of attained service: Pollux's
#: evaluation uses two queues split at 16 GPU-hours (artifact ``tiresias.py``).
TIRESIAS_THRESHOLDS_S = (16 * 3600.0,)
#: A queue threshold (replica-seconds; inf: the last queue is never left).
_THRESHOLD = Real(gt=0, finite=False)


@dataclass
class TiresiasPolicy:
    """Discretized 2D-LAS with the tuned fixed configuration (see the module docstring).

    Attributes:
        thresholds: ascending attained-service thresholds (replica-seconds)
            between consecutive queues.
    """

    thresholds: Sequence[float] = TIRESIAS_THRESHOLDS_S
    name: str = "tiresias"
    fixed_batch: bool = True

    def __post_init__(self) -> None:
        t = list(self.thresholds)
        if not all(_THRESHOLD.accepts(x) for x in t) or t != sorted(t):
            raise InvalidProblem(f"thresholds must be ascending numbers > 0, got {self.thresholds!r}")

    def _queue(self, view: JobView) -> int:
        """The job's queue: 0 until its attained service passes the first threshold, and so on."""
        return int(np.searchsorted(self.thresholds, view.attained_service, side="right"))

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        active = active_views(jobs, cluster)
        order = sorted(active, key=lambda v: (self._queue(v), v.submit_time, v.job_id))
        free = cluster.total_cpus
        wanted: dict[str, int] = {}
        for v in order:
            k = requested_replicas(v, cluster)
            if k <= free:
                wanted[v.job_id] = k
                free -= k
        ids = [v.job_id for v in order]
        placement = pack(cluster, wanted, {v.job_id: v.placement for v in active}, ids)
        for j in ids:
            placement.setdefault(j, {})
        return Decision(placement, math.nan, math.nan, DecisionStatus.LAS_2D)
