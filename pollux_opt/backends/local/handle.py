"""One job of a real run: the :class:`JobHandle` the backend drives (by default
the runtime's :class:`~pollux_opt.runtime.job.ElasticJob`, imported only when
one is made, so that importing the backend needs no torch; tests use
in-process stand-ins), and what the backend knows about it (:class:`JobBookkeeping`).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from solvers import InvalidProblem

from pollux_opt.records.replay import JobTrack
from pollux_opt.workloads.job import WorkloadJob

if TYPE_CHECKING:
    from pollux_opt.lifecycle import JobState
    from pollux_opt.runtime.report import JobReport, RuntimeOptions
    from pollux_opt.runtime.spec import JobSpec

__all__ = ["STOP_GRACE_S", "JobBookkeeping", "JobFactory", "JobHandle", "JobOpener", "elastic_factory",
           "elastic_opener", "stop_jobs"]

#: Seconds the backend waits for its jobs to checkpoint on a graceful stop.
STOP_GRACE_S = 20.0


@runtime_checkable
class JobHandle(Protocol):
    """One training job as the real backend drives it.

    Placements are ``{node id: replicas}``; ``cpus`` are CPU ids, one per
    replica in rank order (None: not pinned); ``node_types`` and ``cgroups``
    (``{node id: type}``, ``{node id: cgroup directory}``, see
    :class:`~pollux_opt.runtime.allocation.WorkerAllocation`) come only on a
    typed or throttled cluster.  Commands return at once; the job reports their
    outcome in :meth:`report` (``JobReport.events``).  A command on an ended job
    raises :class:`solvers.InvalidProblem`.
    """

    def start(self, replicas: Mapping[str, int], num_nodes: int | None = None, *,
              cpus: Sequence[int] | None = None, node_types: Mapping[str, str] | None = None,
              cgroups: Mapping[str, str] | None = None, gpus: Sequence[int | None] | None = None) -> None:
        """Start on a placement, resuming from the newest good checkpoint if there
        is one, or move a started job there; the job picks its own batch there.
        ``gpus``: each replica's GPU (None on CPU cores; all None: leave it out)."""

    def stop(self) -> None:
        """Checkpoint and release all workers (the job can be started again)."""

    def cancel(self) -> None:
        """Checkpoint, release all workers and end the job (``cancelled``)."""

    def poll(self) -> JobState:
        """The job's current state (cheap: called every poll)."""

    def report(self) -> JobReport:
        """A consistent snapshot: state, progress, measurements, model, runtime events."""

    def wait(self, timeout: float | None = None) -> JobReport:
        """Block until the job is ``queued`` or ended (TimeoutError after ``timeout`` s)."""

    def close(self) -> None:
        """End the job's supervisor and workers now (no checkpoint)."""


#: Makes a new job's handle: ``(spec, workdir, job_id, options, pool) -> handle``.
JobFactory = Callable[["JobSpec", "os.PathLike", str, "RuntimeOptions", Any], JobHandle]
#: Re-opens a job from its work directory: ``(workdir, pool) -> handle``;
#: raises :class:`solvers.InvalidProblem` where no job was created.
JobOpener = Callable[["os.PathLike", Any], JobHandle]


def elastic_factory(spec: JobSpec, workdir: os.PathLike, job_id: str, options: RuntimeOptions, pool) -> JobHandle:
    """A new :class:`~pollux_opt.runtime.job.ElasticJob` (the default :data:`JobFactory`)."""
    from pollux_opt.runtime.job import ElasticJob

    return ElasticJob(spec, workdir, job_id=job_id, options=options, pool=pool)


def elastic_opener(workdir: os.PathLike, pool) -> JobHandle:
    """The :class:`~pollux_opt.runtime.job.ElasticJob` stored in ``workdir`` (the default :data:`JobOpener`)."""
    from pollux_opt.runtime.job import ElasticJob

    return ElasticJob.from_workdir(workdir, pool=pool)


@dataclass(kw_only=True)
class JobBookkeeping(JobTrack):
    """One job of a real run: its history as the event log records it (the
    :class:`~pollux_opt.records.replay.JobTrack` fields, replayed on resume and
    kept up to date as the backend logs; ``durations`` also gets the (re)start
    durations the job reports; ``state`` is the one the runtime last reported),
    plus its handle and the cursors of reading it.

    Attributes:
        wl: the workload entry; ``spec``: its resolved ``JobSpec``.
        fixed_batch_size: the total batch it trains at (its submitted one, under
            a fixed-batch policy; None: the job picks its batch).
        handle: the job's handle (None until created, or if it could not be).
        report: the last full report read (a ``JobReport``; None before one).
        read_t: run time of that read, seconds.
        ckpt_names: file names last seen in its checkpoint directory.
        ckpt_rejected: checkpoint metadata files found not to verify (never logged).
        report_t, report_progress, report_samples: time, progress and samples
            at its last ``report`` event (the reference of the next one's rates).
        change_t: run time of the last placement change the backend ordered.
        startup_s: seconds its first start took (from the runtime's ``started`` event).
        invalid: why its spec no longer resolves (an open source's job; it fails when submitted).
        cancel_deadline: run time by which a cancelled job must have ended (it is ended then).
    """

    wl: WorkloadJob
    spec: Any
    fixed_batch_size: int | None = None
    handle: JobHandle | None = None
    report: Any = None
    read_t: float = -math.inf
    ckpt_names: frozenset = frozenset()
    ckpt_rejected: set = field(default_factory=set)
    report_t: float = math.nan
    report_progress: float = math.nan
    report_samples: float = math.nan
    change_t: float = math.nan
    startup_s: float | None = None
    invalid: str | None = None
    cancel_deadline: float = math.inf

    @property
    def live(self) -> bool:
        """Submitted, not finished, and with a handle: the backend reads and moves it."""
        return self.submitted and not self.finished and self.handle is not None


def stop_jobs(jobs: Iterable[JobBookkeeping], timeout: float) -> None:
    """Ask the jobs' handles to checkpoint and stop; wait up to ``timeout`` seconds for them all."""
    jobs = list(jobs)
    for job in jobs:
        try:
            job.handle.stop()
        except InvalidProblem:
            pass  # ended meanwhile
    deadline = time.monotonic() + timeout
    for job in jobs:
        try:
            job.handle.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except (TimeoutError, RuntimeError):
            pass
