"""The two non-adaptive baselines of Pollux's evaluation, as scheduler policies.

- :class:`TiresiasPolicy`: two-dimensional least-attained-service (Gu et al.,
  NSDI 2019, "Tiresias", section 4.1, discretized 2D-LAS): a job's priority is
  its attained service in replica-seconds (the two dimensions: replicas x
  time), discretized into multi-level queues by thresholds; FIFO by arrival
  within a queue.  Each round, jobs are admitted in priority order while their
  fixed (tuned) replica count fits; a job that no longer fits is preempted.
  Jobs run with their tuned fixed configuration (replicas and batch size).
  Pollux (section 5.2) uses two queues with a 16 GPU-hour threshold.
- :class:`OptimusPolicy`: Optimus (Peng et al., EuroSys 2018, section 4)
  allocates resources greedily by marginal gain: every job first gets one
  replica (in arrival order, while replicas last), then each remaining replica
  goes to the job whose estimated remaining time drops most from one more
  replica, ``remaining_steps * (T(k) - T(k + 1))``.  "+Oracle" (Pollux, section
  5.2): remaining steps and step times are the true ones (an :class:`Oracle`
  from the simulator) instead of Optimus' online-fitted estimates; the batch
  size is the tuned fixed one.  Without an oracle, step times come from the
  job's fitted goodput model and every job's remaining work counts as equal.

Both keep the placement of a job whose replica count is unchanged (no restart)
and pack other jobs onto the nodes with the most free slots.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model.core import BatchConfig, Cluster
from pollux_opt.scheduling.loop import Decision, JobView

__all__ = ["TiresiasPolicy", "OptimusPolicy", "StepOracle", "pack"]

#: Tiresias queue thresholds in replica-seconds of attained service: Pollux's
#: evaluation uses two queues split at 16 GPU-hours (artifact ``tiresias.py``).
TIRESIAS_THRESHOLDS_S = (16 * 3600.0,)


class StepOracle(Protocol):
    """True remaining work and step times (see :class:`pollux_opt.backends.sim.Oracle`)."""

    def remaining_steps(self, job_id: str, batch_size: int) -> float: ...

    def step_time(self, job_id: str, placement: Sequence[int], batch_size: int) -> float: ...

    def max_local_bsz(self, job_id: str) -> int: ...

    def min_local_bsz(self, job_id: str) -> int: ...


def pack(
    cluster: Cluster,
    wanted: Mapping[str, int],
    current: Mapping[str, Mapping[str, int]],
    order: Sequence[str],
) -> dict[str, dict[str, int]]:
    """Node placements for replica counts ``wanted``.

    A job whose current placement already holds ``wanted[j]`` replicas keeps it;
    the others (in ``order``) take replicas from the nodes with the most free
    slots first (fewest nodes, ties by node order).  Counts must fit in total.
    """
    free = {n.id: n.cpus for n in cluster.nodes}
    out: dict[str, dict[str, int]] = {}
    for j in order:
        cur = current.get(j, {})
        k = wanted.get(j, 0)
        if k and sum(cur.values()) == k and all(free[n] >= c for n, c in cur.items()):
            out[j] = dict(cur)
            for n, c in cur.items():
                free[n] -= c
    rank = {nid: i for i, nid in enumerate(cluster.node_ids)}
    for j in order:
        k = wanted.get(j, 0)
        if j in out or k <= 0:
            continue
        if k > sum(free.values()):
            raise InvalidProblem(f"pack: job {j!r} wants {k} replicas, only {sum(free.values())} free")
        place: dict[str, int] = {}
        # One node that fits the whole job if any (best fit), else most-free first.
        fits = [n for n in free if free[n] >= k]
        if fits:
            n = min(fits, key=lambda x: (free[x], rank[x]))
            place[n] = k
            free[n] -= k
        else:
            left = k
            for n in sorted(free, key=lambda x: (-free[x], rank[x])):
                if left == 0:
                    break
                take = min(free[n], left)
                if take:
                    place[n] = take
                    free[n] -= take
                    left -= take
        out[j] = place
    return out


def _fixed_batch(view: JobView, k: int) -> BatchConfig:
    b = view.submitted_batch_size
    local = math.ceil(b / k)
    return BatchConfig(local_bsz=local, accum_steps=0, batch_size=local * k, goodput=float("nan"))


@dataclass
class TiresiasPolicy:
    """Discretized 2D-LAS with the tuned fixed configuration (see the module docstring).

    Attributes:
        thresholds: ascending attained-service thresholds (replica-seconds)
            between consecutive queues.
    """

    thresholds: Sequence[float] = TIRESIAS_THRESHOLDS_S
    name: str = "tiresias"

    def __post_init__(self) -> None:
        t = list(self.thresholds)
        if any(not (isinstance(x, (int, float)) and x > 0) for x in t) or t != sorted(t):
            raise InvalidProblem(f"thresholds must be ascending numbers > 0, got {self.thresholds!r}")

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        t0 = time.perf_counter()
        total = cluster.total_cpus
        active = [j for j in jobs if j.state in ("pending", "running")]
        queue = lambda v: int(np.searchsorted(self.thresholds, v.attained_service, side="right"))  # noqa: E731
        order = sorted(active, key=lambda v: (queue(v), v.submit_time, v.job_id))
        free = total
        wanted: dict[str, int] = {}
        for v in order:
            k = min(v.submitted_replicas, total)
            if k <= free:
                wanted[v.job_id] = k
                free -= k
        ids = [v.job_id for v in order]
        placement = pack(cluster, wanted, {v.job_id: v.placement for v in active}, ids)
        by_id = {v.job_id: v for v in active}
        batch = {j: _fixed_batch(by_id[j], k) for j, k in wanted.items()}
        for j in ids:
            placement.setdefault(j, {})
        return Decision(placement, batch, float("nan"), time.perf_counter() - t0, "2d-las")


@dataclass
class OptimusPolicy:
    """Greedy marginal-gain allocation with the tuned batch size (see the module docstring).

    Attributes:
        oracle: true remaining steps and step times (Optimus+Oracle); None to
            estimate from each job's fitted goodput model.
        replicas_per_node: node size used to predict a k-replica step (packed).
    """

    oracle: StepOracle | None = None
    replicas_per_node: int | None = None
    name: str = "optimus"
    _cache: dict = field(default_factory=dict, repr=False)

    def _step(self, view: JobView, k: int, per_node: int) -> float:
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

    def decide(self, now: float, cluster: Cluster, jobs: Sequence[JobView]) -> Decision:
        t0 = time.perf_counter()
        per_node = self.replicas_per_node or max(n.cpus for n in cluster.nodes)
        active = sorted(
            (j for j in jobs if j.state in ("pending", "running")), key=lambda v: (v.submit_time, v.job_id)
        )
        live = {v.job_id for v in active}
        self._cache = {k: v for k, v in self._cache.items() if k[0] in live}
        free = cluster.total_cpus
        k: dict[str, int] = {}
        remaining: dict[str, float] = {}
        heap: list[tuple[float, int, str]] = []
        by_id = {v.job_id: v for v in active}
        for i, v in enumerate(active):
            if free < 1:
                break
            k[v.job_id] = 1
            free -= 1
            remaining[v.job_id] = (
                self.oracle.remaining_steps(v.job_id, v.submitted_batch_size) if self.oracle else 1.0
            )

        def push(jid: str, order: int) -> None:
            v = by_id[jid]
            if k[jid] + 1 > self._max_replicas(v) or k[jid] + 1 > cluster.total_cpus:
                return
            gain = (self._step(v, k[jid], per_node) - self._step(v, k[jid] + 1, per_node)) * remaining[jid]
            if gain > 0:
                heapq.heappush(heap, (-gain, order, jid))

        rank = {v.job_id: i for i, v in enumerate(active)}
        for jid in k:
            push(jid, rank[jid])
        while free > 0 and heap:
            _, _, jid = heapq.heappop(heap)
            k[jid] += 1
            free -= 1
            push(jid, rank[jid])
        order = sorted(k, key=lambda j: (-k[j], rank[j]))
        placement = pack(cluster, k, {v.job_id: v.placement for v in active}, order)
        batch = {j: _fixed_batch(by_id[j], n) for j, n in k.items()}
        for v in active:
            placement.setdefault(v.job_id, {})
        return Decision(placement, batch, float("nan"), time.perf_counter() - t0, "greedy")
