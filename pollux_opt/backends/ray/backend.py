"""The Ray backend: a workload's real jobs on the nodes of a Ray cluster (:class:`RayBackend`).

It is the real backend (:class:`~pollux_opt.backends.local.backend.RealBackend`:
the same polling, bookkeeping, event log, batch handling and resume) over the
runtime's own elastic jobs, whose workers are Ray actors
(:class:`~pollux_opt.backends.ray.pool.RayWorkerPool`).  What differs:

**The cluster is Ray's.**  Every poll re-reads Ray's alive nodes with CPUs
(:class:`~pollux_opt.backends.ray.nodes.RayNodes`); the scheduler loop asks
:meth:`RayBackend.current_cluster` each round, so a node that joins is used from
the next round.  A change is logged as a ``nodes`` event.  A job holding
replicas on a node that left is restarted elsewhere: its supervisor (which has
by then seen its workers there die, and had the survivors checkpoint) is
ended, the job is re-opened from its work directory as after a scheduler
restart, a ``restart_after_fault`` event with an empty placement is logged, and
the next round places it on the remaining capacity, from its newest good
checkpoint.

**Work directories** (checkpoints, logs, the job's journal) are written by
the actors and read by the scheduler, so they must be one directory every
node sees at the same path: ``checkpoint_dir`` (a shared file system; default
the run directory, right where every node runs on this machine, as in a local
Ray instance).  Checkpoints are files, not Ray objects: the runtime's atomic
writes, SHA-256 checks and fallback to the previous good checkpoint apply
unchanged, and they survive the scheduler and the Ray cluster.

**No CPU pinning**: Ray accounts one CPU per replica actor; each runs one thread.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from pathlib import Path

from pollux_opt.backends.local.backend import JOBS_DIR, RealBackend
from pollux_opt.backends.local.handle import JobBookkeeping, elastic_factory, elastic_opener
from pollux_opt.backends.local.nodes import CpuPinning
from pollux_opt.backends.ray.nodes import RayNodes
from pollux_opt.backends.ray.pool import RayWorkerPool
from pollux_opt.backends.local.rundir import cluster_to_json
from pollux_opt.model import Cluster
from pollux_opt.records.files import safe_name

__all__ = ["RayBackend", "shared_workdir_root"]

log = logging.getLogger(__name__)

#: Hex digits of the run directory's hash that name its folder under a shared checkpoint directory.
_RUN_KEY_CHARS = 16


def shared_workdir_root(run_dir: str | os.PathLike, checkpoint_dir: str | os.PathLike | None) -> Path:
    """Where a run's job work directories go: ``run_dir``, or a folder of
    ``checkpoint_dir`` named after the run directory's absolute path (several
    runs may share one checkpoint directory; the same ``--out`` finds its own)."""
    if checkpoint_dir is None:
        return Path(run_dir)
    key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:_RUN_KEY_CHARS]
    return Path(checkpoint_dir) / f"run-{key}"


class RayBackend(RealBackend):
    """:class:`~pollux_opt.scheduling.loop.Backend` over elastic jobs whose replicas are Ray actors.

    Args:
        run_dir, workload, cluster, events: as for :class:`RealBackend`
            (``cluster``: Ray's nodes when the run started).
        nodes: the run's view of the connected Ray cluster.
        checkpoint_dir: a directory every node sees at the same path, for the
            jobs' work directories (None: the run directory; see the module docstring).
        kwargs: the other keyword arguments of :class:`RealBackend` (CPU pinning
            is off; the default pool is a :class:`RayWorkerPool` on ``nodes``,
            closed by :meth:`close`; tests inject job handles and a pool).
    """

    def __init__(self, run_dir, workload, cluster: Cluster, events, *, nodes: RayNodes,
                 checkpoint_dir: str | os.PathLike | None = None, **kwargs) -> None:
        self._nodes = nodes
        self._workdirs = shared_workdir_root(run_dir, checkpoint_dir)
        kwargs["pin_cpus"] = False
        kwargs.setdefault("job_factory", elastic_factory)
        kwargs.setdefault("job_opener", elastic_opener)
        if kwargs.get("pool") is None:
            kwargs["pool"] = RayWorkerPool(nodes)
        super().__init__(run_dir, workload, cluster, events, **kwargs)
        self._own_pool = True
        self._node_ids = frozenset()  # every node Ray has now is new to the pool
        self._refresh_nodes()

    def _workdir(self, job: JobBookkeeping) -> Path:
        return self._workdirs / JOBS_DIR / safe_name("job id", job.id)

    # ------------------------------------------------------------ the nodes
    def current_cluster(self) -> Cluster:
        """The cluster the policy places on this round (Ray's alive nodes, as last polled)."""
        return self.cluster

    def _poll(self, full: bool = True, arrivals: bool = True) -> None:
        self._refresh_nodes()
        super()._poll(full, arrivals)

    def _refresh_nodes(self) -> None:
        """Follow Ray's nodes: take in joined ones, restart the jobs of those that left."""
        cluster = self._nodes.refresh()
        ids = frozenset() if cluster is None else frozenset(n.id for n in cluster.nodes)
        joined, left = sorted(ids - self._node_ids), sorted(self._node_ids - ids)
        if not joined and not left:
            return
        now = self.now()
        log.info("Ray nodes changed: joined %s, left %s", joined, left)
        if cluster is not None:
            self.cluster = cluster
            self._pinning = CpuPinning(cluster, False)
            for node in cluster.nodes:
                if node.id in joined:
                    self.pool.add_node(node.id, node.cpus)
        self._node_ids = ids
        self._emit("nodes", now, None, cluster=[] if cluster is None else cluster_to_json(cluster),
                   joined=joined, left=left)
        for job in self.jobs.values():
            if job.handle is not None and not job.finished and set(job.placement) & set(left):
                self._restart_elsewhere(job, now, sorted(set(job.placement) & set(left)))
        self._wake = True

    def _restart_elsewhere(self, job: JobBookkeeping, now: float, lost: list[str]) -> None:
        """End ``job``'s supervisor and re-open the job from its work directory,
        holding nothing (the next round places it; see the module docstring)."""
        pool: RayWorkerPool = self.pool
        pool.cancel(job.id)
        try:
            job.handle.close()
        finally:
            pool.uncancel(job.id)
        job.account(now)
        job.handle = self._opener(self._workdir(job), self.pool)
        job.hold(now, {})
        self._pinning.release(job.id)
        job.change_t, job.report_t = now, math.nan
        self._emit("restart_after_fault", now, job.id, placement={},
                   reason=f"node(s) {', '.join(lost)} left the Ray cluster")
