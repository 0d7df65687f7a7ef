"""Optimus, the marginal-gain baseline of Pollux's evaluation (policy ``"optimus"``, Optimus+Oracle).

Optimus (Peng et al., EuroSys 2018, section 4) allocates resources greedily by
marginal gain: every job first gets one replica (in arrival order, while
replicas last), then each remaining replica goes to the job whose estimated
remaining time drops most from one more replica,
``remaining_steps * (T(k) - T(k + 1))``.  "+Oracle" (Pollux, section 5.2):
remaining steps and step times are the true ones (a :class:`StepOracle` from
the simulator) instead of Optimus' online-fitted estimates; the batch size is
the tuned fixed one.  Without an oracle, step times come from the job's
fitted goodput model and every job's remaining work counts as equal.

Placements come from :func:`~pollux_opt.scheduling.policies.packing.pack`: a
job whose replica count is unchanged keeps its placement (no restart) unless
it is spread over more nodes than it needs; each other job goes on as few
nodes as it fits.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from pollux_opt.model import Cluster
from pollux_opt.scheduling.loop import Decision, DecisionStatus, JobView
from pollux_opt.scheduling.policies.packing import pack
from pollux_opt.scheduling.policies.views import active_views

__all__ = ["OptimusPolicy", "StepOracle"]


class StepOracle(Protocol):
    """True remaining work and step times (see :class:`pollux_opt.backends.sim.Oracle`)."""

    def remaining_steps(self, job_id: str, batch_size: int) -> float: ...

    def step_time(self, job_id: str, placement: Sequence[int], batch_size: int) -> float: ...

    def max_local_bsz(self, job_id: str) -> int: ...

    def min_local_bsz(self, job_id: str) -> int: ...


@dataclass
class OptimusPolicy:
    """Greedy marginal-gain allocation with the tuned batch size (see the module docstring).

    Attributes:
        oracle: true remaining steps and step times (Optimus+Oracle); None to
            estimate from each job's fitted goodput model.
        replicas_per_node: node size used to predict a k-replica step (packed);
            None: the cluster's largest node.
    """

    oracle: StepOracle | None = None
    replicas_per_node: int | None = None
    name: str = "optimus"
    fixed_batch: bool = True
    _cache: dict = field(default_factory=dict, repr=False)

    def _step(self, view: JobView, k: int, per_node: int) -> float:
        """Seconds per step of the submitted batch on ``k`` replicas packed ``per_node`` a node."""
        b = view.submitted_batch_size
        full, rest = divmod(k, per_node)
        placement = (per_node,) * full + ((rest,) if rest else ())
        if self.oracle is not None:
            key = (view.job_id, k)
            hit = self._cache.get(key)
            if hit is None:
                hit = self._cache[key] = self.oracle.step_time(view.job_id, placement, b)
            return hit
        model = view.goodput_model
        if model is None:
            return 1.0 / k  # no measurement yet: assume linear scaling
        thr = float(model.throughput(len(placement), k, math.ceil(b / k)))
        return b / thr if thr > 0 else math.inf

    def _max_replicas(self, view: JobView) -> int:
        if self.oracle is not None:
            return max(1, view.submitted_batch_size // self.oracle.min_local_bsz(view.job_id))
        return max(1, min(view.max_replicas, view.submitted_batch_size))

    def _replicas(self, cluster: Cluster, active: Sequence[JobView]) -> dict[str, int]:
        """Replicas per job: one each in arrival order while they last, then by marginal gain."""
        per_node = self.replicas_per_node or max(n.cpus for n in cluster.nodes)
        free = cluster.total_cpus
        k: dict[str, int] = {}
        remaining: dict[str, float] = {}
        for v in active:
            if free < 1:
                break
            k[v.job_id] = 1
            free -= 1
            remaining[v.job_id] = (
                self.oracle.remaining_steps(v.job_id, v.submitted_batch_size) if self.oracle else 1.0
            )
        by_id = {v.job_id: v for v in active}
        rank = {v.job_id: i for i, v in enumerate(active)}
        heap: list[tuple[float, int, str]] = []

        def push(jid: str) -> None:
            v = by_id[jid]
            if k[jid] + 1 > self._max_replicas(v) or k[jid] + 1 > cluster.total_cpus:
                return
            gain = (self._step(v, k[jid], per_node) - self._step(v, k[jid] + 1, per_node)) * remaining[jid]
            if gain > 0:
                heapq.heappush(heap, (-gain, rank[jid], jid))

        for jid in k:
            push(jid)
        while free > 0 and heap:
            _, _, jid = heapq.heappop(heap)
            k[jid] += 1
            free -= 1
            push(jid)
        return k

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        active = sorted(active_views(jobs, cluster), key=lambda v: (v.submit_time, v.job_id))
        live = {v.job_id for v in active}
        self._cache = {key: t for key, t in self._cache.items() if key[0] in live}
        k = self._replicas(cluster, active)
        rank = {v.job_id: i for i, v in enumerate(active)}
        order = sorted(k, key=lambda j: (-k[j], rank[j]))
        placement = pack(cluster, k, {v.job_id: v.placement for v in active}, order)
        for v in active:
            placement.setdefault(v.job_id, {})
        return Decision(placement, math.nan, math.nan, DecisionStatus.GREEDY)
