"""The static baseline users configure by hand (policy ``"fixed"``).

Jobs run with the CPUs and batch size they were submitted with, gang-scheduled
first-in first-out; a running job is never changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from pollux_opt.model import Cluster
from pollux_opt.scheduling.loop import Decision, DecisionStatus, JobView
from pollux_opt.scheduling.policies.packing import take
from pollux_opt.scheduling.policies.views import active_views, requested_replicas

__all__ = ["FixedPolicy"]


@dataclass
class FixedPolicy:
    """First-in first-out gang scheduling with each job's submitted CPUs and batch size.

    Running jobs keep their placement.  Pending jobs are considered in order of
    submission (ties by id); the head job starts when its
    :func:`~pollux_opt.scheduling.policies.views.requested_replicas` are free,
    packed on as few nodes as possible; a job that does not fit blocks the jobs
    behind it (strict FIFO, no backfilling).
    """

    name: str = "fixed"
    fixed_batch: bool = True

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        free = {n.id: n.cpus for n in cluster.nodes}
        rank = {nid: i for i, nid in enumerate(cluster.node_ids)}
        placement: dict[str, dict[str, int]] = {}
        active = active_views(jobs, cluster)
        for v in active:
            if v.placement:
                for nid, k in v.placement.items():
                    free[nid] -= k
                placement[v.job_id] = dict(v.placement)
        blocked = False
        for v in sorted((v for v in active if not v.placement), key=lambda v: (v.submit_time, v.job_id)):
            where = None if blocked else take(free, requested_replicas(v, cluster), rank)
            blocked = where is None
            placement[v.job_id] = where or {}
        return Decision(placement, math.nan, math.nan, DecisionStatus.FIFO)
