"""The job handle: what the real backend drives, one per job.

:class:`JobHandle` declares exactly the calls
:class:`~pollux_opt.backends.local.backend.RealBackend` makes on a job.  The
runtime's :class:`~pollux_opt.runtime.job.ElasticJob` implements it (the
default handle, made by :func:`elastic_factory` and re-opened by
:func:`elastic_opener`); tests drive the backend with in-process stand-ins
that implement it too.

The runtime is imported only when a default handle is made, so that importing
the backend needs no torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from solvers import InvalidProblem

if TYPE_CHECKING:
    from pollux_opt.lifecycle import JobState
    from pollux_opt.runtime.report import JobReport, RuntimeOptions
    from pollux_opt.runtime.spec import JobSpec

__all__ = ["JobFactory", "JobHandle", "JobOpener", "elastic_factory", "elastic_opener", "make_options", "new_pool"]

#: Idle warm workers the shared pool keeps ready (one spare cuts a cold start
#: of about two CPU-seconds from most starts and scale-ups).
POOL_SPARES = 1


@runtime_checkable
class JobHandle(Protocol):
    """One training job as the real backend drives it.

    Placements are ``{node id: replicas}``; ``cpus`` are CPU ids, one per
    replica in rank order, to pin the workers to (None: not pinned).  On a
    cluster of several node types, or one with throttled nodes, ``start`` and
    ``rescale`` also get ``node_types`` and ``cgroups`` (``{node id: type}``,
    ``{node id: cgroup directory}`` of the placement's nodes; see
    :class:`~pollux_opt.runtime.allocation.WorkerAllocation`); otherwise never.  The
    commands return at once; the job reports their outcome through
    :meth:`report` (``JobReport.events``).  A command on an ended job raises
    :class:`solvers.InvalidProblem`.
    """

    def start(self, replicas: Mapping[str, int], num_nodes: int | None = None, *,
              cpus: Sequence[int] | None = None, node_types: Mapping[str, str] | None = None,
              cgroups: Mapping[str, str] | None = None) -> None:
        """Start on a placement, resuming from the newest good checkpoint if there
        is one; the job picks its own batch there."""

    def rescale(self, replicas: Mapping[str, int], num_nodes: int | None = None, *,
                cpus: Sequence[int] | None = None, node_types: Mapping[str, str] | None = None,
                cgroups: Mapping[str, str] | None = None) -> None:
        """Move to a new placement (a ``queued`` job is started)."""

    def stop(self) -> None:
        """Checkpoint and release all workers (the job can be started again)."""

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


def new_pool():
    """A warm worker pool for the default handles, keeping :data:`POOL_SPARES` spares."""
    from pollux_opt.runtime.pool import WorkerPool

    return WorkerPool(spares=POOL_SPARES)


def make_options(kwargs: Mapping[str, Any]) -> RuntimeOptions:
    """:class:`~pollux_opt.runtime.report.RuntimeOptions` from keyword fields (InvalidProblem naming an unknown one)."""
    from pollux_opt.runtime.report import RuntimeOptions

    try:
        return RuntimeOptions(**kwargs)
    except TypeError as exc:
        raise InvalidProblem(f"unknown runtime option in {sorted(kwargs)}: {exc}") from exc
