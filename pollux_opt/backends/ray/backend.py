"""The Ray backend: a workload's real jobs on the nodes of a Ray cluster
(:func:`run_ray_workload`, :class:`RayBackend`; the guarantees are in docs/ray.md).

A run is the local backend's :func:`~pollux_opt.backends.local.run.run_workload`
(run directory, lock, stop signals, resume, summary) with :class:`RayBackend`,
the real backend (:class:`~pollux_opt.backends.local.backend.RealBackend`: the
same polling, bookkeeping, event log, batch handling and resume) over the
runtime's own elastic jobs, whose workers are Ray actors
(:class:`~pollux_opt.backends.ray.pool.RayWorkerPool`).  What differs:

**The cluster is Ray's.**  Every poll re-reads Ray's alive nodes with CPUs
(:class:`~pollux_opt.backends.ray.nodes.RayNodes`; a scheduler node id is ``ray-`` and the last
:data:`~pollux_opt.backends.ray.nodes.NODE_ID_CHARS` hex digits of the Ray node id, a node that rejoins is a
new node; nodes without CPUs are left out), so a node that joins is used from
the next round (a ``nodes`` event).  A job holding replicas on a
node that left is re-opened from its work directory, holding nothing (a
``restart_after_fault`` event), and the next round places it elsewhere.

**Work directories** are written by the actors and read by the scheduler: one
directory every node sees at the same path, ``checkpoint_dir`` (default the
run directory), recorded in ``run_dir/ray.json`` so that a resumed run finds
them.  Checkpoints are files, not Ray objects, so the runtime's atomic writes
and checks apply unchanged.

**The scheduler is the Ray driver**: its replica actors end with it.  No CPU
pinning: Ray accounts one CPU per replica actor, each running one thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from solvers import InvalidProblem

from pollux_opt.backends.local.backend import JOBS_DIR, RealBackend
from pollux_opt.backends.local.handle import JobBookkeeping
from pollux_opt.backends.local.nodes import ReplicaSlots
from pollux_opt.backends.local.rundir import cluster_to_json
from pollux_opt.backends.local.run import DEFAULT_INTERVAL_S, run_workload
from pollux_opt.backends.ray.nodes import RayNodes, first_nodes
from pollux_opt.backends.ray.pool import RayWorkerPool
from pollux_opt.extras import RAY_MISSING, require
from pollux_opt.lifecycle import JobState
from pollux_opt.model import Cluster
from pollux_opt.model.cluster import DEFAULT_NODE_TYPE
from pollux_opt.records.files import atomic_write_json, safe_name
from pollux_opt.scheduling.autoscale import Autoscaler, ScaleOptions
from pollux_opt.workloads.job import Workload

__all__ = [
    "RAY_CONFIG_FILE", "RayBackend", "connect",
    "recorded_checkpoint_dir", "run_ray_workload", "shared_workdir_root",
]

log = logging.getLogger(__name__)

#: The Ray run's own settings in its run directory.
RAY_CONFIG_FILE = "ray.json"
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
                 checkpoint_dir: str | os.PathLike | None = None, autoscale: ScaleOptions | None = None,
                 node_cpus: int | None = None, **kwargs) -> None:
        self._nodes = nodes
        self._workdirs = shared_workdir_root(run_dir, checkpoint_dir)
        #: Autoscaling: the rule (None: Ray's nodes as they are), the CPUs of a
        #: node Ray's autoscaler adds, the nodes requested, and those being given back.
        if autoscale is not None and nodes.gpu_types:
            raise InvalidProblem("autoscale: Ray's autoscaler is asked for CPU nodes only, and this Ray cluster "
                                 "has nodes with GPUs; run it without autoscale")
        self._node_cpus = int(node_cpus or max(n.cpus for n in cluster.nodes))
        self.autoscaler = None if autoscale is None else Autoscaler(
            Cluster.uniform(autoscale.max_nodes or len(cluster.nodes), self._node_cpus), autoscale)
        self._wanted = len(cluster.nodes)
        self._retired: set[str] = set()
        kwargs["pin_cpus"] = False
        if kwargs.get("pool") is None:
            kwargs["pool"] = RayWorkerPool(nodes)
        super().__init__(run_dir, workload, cluster, events, **kwargs)
        self._own_pool = True
        self._node_ids = frozenset()  # every node Ray has now is new to the pool
        self._refresh_nodes()

    def job_dir(self, job_id: str) -> Path:
        """The work directory of job ``job_id``, under the shared checkpoint directory."""
        return self._workdirs / JOBS_DIR / safe_name("job id", job_id)

    # ------------------------------------------------------------ the nodes
    def current_cluster(self) -> Cluster:
        """The cluster the policy places on this round (Ray's alive nodes, as last
        polled, less those being given back to Ray's autoscaler)."""
        kept = tuple(n for n in self.cluster.nodes if n.id not in self._retired)
        return Cluster(kept) if kept and self._retired else self.cluster

    def views(self):
        """The jobs' views, their replicas on nodes being given back not shown
        (the policy moves them off, as off a node that left)."""
        views = super().views()
        if not self._retired:
            return views
        out = []
        for v in views:
            kept = {n: k for n, k in v.placement.items() if n not in self._retired}
            out.append(v if kept == v.placement else
                       replace(v, placement=kept, state=v.state if kept else JobState.QUEUED))
        return out

    def provisioned(self) -> dict[str, int]:
        """Nodes requested from Ray's autoscaler (at first: those Ray had)."""
        return {DEFAULT_NODE_TYPE: self._wanted}

    def provision(self, now: float, sizes) -> None:
        """Ask Ray's autoscaler for ``sizes`` nodes (``request_resources`` with one
        node-shaped bundle of :attr:`node_cpus` CPUs per node; Ray adds nodes to
        fit them, counting what runs) and give back the emptiest nodes past them:
        the policy no longer sees them, and their idle replica slots end once
        their jobs have moved off, so that Ray's autoscaler removes them when
        idle (its ``idle_timeout_minutes``)."""
        from ray.autoscaler.sdk import request_resources

        wanted = int(sizes.get(DEFAULT_NODE_TYPE, self._wanted))
        if wanted != self._wanted:
            request_resources(bundles=[{"CPU": self._node_cpus}] * wanted)
            self._wanted = wanted
            self._emit("scale", now, None, requested={}, ready={}, released={}, sizes={DEFAULT_NODE_TYPE: wanted})
        self._retire()

    def close(self, *, graceful: bool = True, **kwargs) -> None:
        """As :meth:`RealBackend.close`; an autoscaling run then withdraws its
        request, so that Ray's autoscaler removes the nodes the run no longer uses."""
        try:
            super().close(graceful=graceful, **kwargs)
        finally:
            if self.autoscaler is not None:
                from ray.autoscaler.sdk import request_resources

                request_resources(bundles=[])

    def _held(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for job in self.jobs.values():
            if job.live:
                for n, k in job.placement.items():
                    held[n] = held.get(n, 0) + k
        return held

    def _retire(self) -> None:
        """Nodes past the request are given back, the emptiest first; taken back when wanted again."""
        held = self._held()
        ids = [n.id for n in self.cluster.nodes]
        self._retired &= set(ids)
        extra = len(ids) - self._wanted
        for nid in sorted(self._retired, key=lambda n: -held.get(n, 0))[:max(len(self._retired) - extra, 0)]:
            self._retired.discard(nid)  # its slots: those its jobs hold, and new idle ones for the rest
            self.pool.add_node(nid, self._nodes.get(nid).slots - held.get(nid, 0))
        keep = sorted((n for n in ids if n not in self._retired), key=lambda n: (held.get(n, 0), n))
        for nid in keep[:max(extra - len(self._retired), 0)]:
            self._retired.add(nid)
            self.pool.retire_node(nid)
            log.info("giving node %s back to Ray's autoscaler", nid)

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
            self._pinning = ReplicaSlots(cluster, False, self._nodes.gpu_types, own_gpu_only=True)
            for node in cluster.nodes:
                if node.id in joined:
                    self.pool.add_node(node.id, node.cpus)
        self._node_ids = ids
        self._emit("nodes", now, None, cluster=[] if cluster is None else cluster_to_json(cluster),
                   joined=joined, left=left)
        for job in self.jobs.values():
            if job.live and set(job.placement) & set(left):
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
        job.handle = self._opener(self.job_dir(job.id), self.pool)
        job.hold(now, {})
        self._pinning.release(job.id)
        job.change_t, job.report_t = now, math.nan
        self._emit("restart_after_fault", now, job.id, placement={},
                   reason=f"node(s) {', '.join(lost)} left the Ray cluster")


def connect(address: str | None):
    """The ``ray`` module, connected to ``address`` (a running cluster, e.g.
    ``HOST:6379`` or ``auto``), or to a new local Ray instance if None; returns
    ``(ray, started)``, ``started`` true where this call connected (its caller
    disconnects).  Already connected: that connection is used.

    Raises:
        InvalidProblem: no cluster could be joined at ``address``, with the likely
            cause: its token authentication refused this machine, or no head answered.
    """
    ray = require("ray", RAY_MISSING)
    if ray.is_initialized():
        return ray, False
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except ConnectionError as exc:
        # Ray raises a traceback whose cause, where there is one, says why; a user
        # needs one line naming the address and what to set (see docs/ray.md).
        if _refused_token(exc, ray.exceptions.AuthenticationError):
            why = ("its token authentication refused this machine: set RAY_AUTH_MODE=token here as on "
                   "its nodes, with the cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN)")
        else:
            why = ("no Ray head answered: is it started (ray start --head) and reachable from here? "
                   "A cluster with token authentication also needs RAY_AUTH_MODE=token here")
        raise InvalidProblem(f"could not connect to the Ray cluster at address={address!r}: {why}") from None
    return ray, True


def _refused_token(exc: BaseException, auth_error: type) -> bool:
    """Whether ``exc`` was raised from Ray's ``auth_error`` (an exception of that
    type, or one carrying its traceback as text, as Ray's GCS client does)."""
    while exc is not None:
        if isinstance(exc, auth_error) or auth_error.__name__ in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def recorded_checkpoint_dir(run_dir: Path, checkpoint_dir: str | os.PathLike | None) -> str | None:
    """The run's checkpoint directory: the one recorded in ``ray.json`` (which a
    different ``checkpoint_dir`` may not contradict), else ``checkpoint_dir`` (recorded)."""
    path = run_dir / RAY_CONFIG_FILE
    given = None if checkpoint_dir is None else str(Path(checkpoint_dir).resolve())
    if path.exists():
        stored = json.loads(path.read_text()).get("checkpoint_dir")
        if given is not None and given != stored:
            raise InvalidProblem(f"run directory {str(run_dir)!r} keeps its checkpoints in {stored!r}, "
                                 f"not checkpoint_dir={given!r}")
        return stored
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"checkpoint_dir": given})
    return given


def run_ray_workload(
    run_dir: str | os.PathLike,
    workload: Workload | None = None,
    policy: str | None = None,
    *,
    address: str | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    runtime_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    backend_kwargs: Mapping[str, Any] | None = None,
    repair: bool = False,
    service: Any = None,
    autoscale: ScaleOptions | None = None,
    node_cpus: int | None = None,
) -> dict:
    """Run (or resume) one policy on one workload on a Ray cluster; return the summary.

    Args:
        run_dir, workload, policy, interval, runtime_options, progress, repair, service:
            as for :func:`~pollux_opt.backends.local.run.run_workload`.
        address: the Ray cluster (None: start a local Ray instance for the run).
        checkpoint_dir: a directory every Ray node sees at the same path (a
            shared file system), for the jobs' work directories; None: the run
            directory (enough where every node runs on this machine).
        backend_kwargs: extra keyword arguments of :class:`RayBackend` (tests).
        autoscale: size the Ray cluster each round with Ray's autoscaler
            (``max_nodes`` default: the nodes Ray has at the start); None: the
            nodes Ray has, as they come and go.
        node_cpus: CPUs of a node Ray's autoscaler adds (default: the largest
            node at the start).

    Raises:
        InvalidProblem: as :func:`run_workload`; also a Ray cluster without CPUs,
            or a ``checkpoint_dir`` other than the resumed run's.
        ImportError: Ray is not installed.
    """
    run_dir = Path(run_dir)
    ckpt = recorded_checkpoint_dir(run_dir, checkpoint_dir)
    ray, started = connect(address)
    try:
        nodes = RayNodes(ray)
        cluster = nodes.cluster()
        if cluster is None and autoscale is not None:
            cluster = first_nodes(nodes, autoscale.min_nodes, node_cpus, address)
        if cluster is None:
            raise InvalidProblem(f"the Ray cluster at address={address!r} has no node with CPUs")
        kwargs = {"nodes": nodes, "checkpoint_dir": ckpt, "autoscale": autoscale, "node_cpus": node_cpus,
                  **dict(backend_kwargs or {})}
        return run_workload(run_dir, workload, policy, cluster=cluster, interval=interval, pin_cpus=False,
                            runtime_options=runtime_options, progress=progress, backend_kwargs=kwargs,
                            repair=repair, backend_class=RayBackend, service=service)
    finally:
        if started:
            ray.shutdown()
