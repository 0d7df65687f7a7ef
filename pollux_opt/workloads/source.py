"""Where a real run's jobs come from: a closed workload or an open queue.

The real backend (:class:`~pollux_opt.backends.local.backend.RealBackend`)
takes its jobs from one :class:`JobSource`, so that a workload file's run and
the long-running service are the same scheduler loop over the same backend:

* :class:`ClosedSource`: a :class:`~pollux_opt.workloads.job.Workload` known
  up front, each job due at its ``arrival_s``; it has no requests and the run
  ends when its last job has.
* the service's open source (:class:`pollux_opt.service.db.OpenSource`): jobs
  and :class:`Request` s (cancel, a new weight) that clients add at any time;
  it never closes, and it wakes the backend when something arrives.

The backend applies each request once and records it in the event log (the
``request`` field of its ``cancel`` and ``weight`` events), from which a
resumed run knows which requests it has applied.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol, Sequence, runtime_checkable

from pollux_opt.workloads.job import Workload, WorkloadJob

__all__ = ["REQUEST_KINDS", "ClosedSource", "JobSource", "Request"]

#: What a client may ask of a submitted job.
REQUEST_KINDS = ("cancel", "weight")


@dataclass(frozen=True)
class Request:
    """A client's change to a submitted job, numbered in the order it was made.

    Attributes:
        seq: its number (increasing; the event log records the last one applied).
        job_id: the job it is for.
        kind: ``"cancel"`` (checkpoint within the backend's grace period, then
            end ``cancelled``) or ``"weight"`` (the job's new priority ``weight``).
        weight: the new weight (``kind == "weight"``).
    """

    seq: int
    job_id: str
    kind: Literal["cancel", "weight"]
    weight: float | None = None


@runtime_checkable
class JobSource(Protocol):
    """The jobs of a run and the requests about them (see the module docstring)."""

    name: str

    def new_jobs(self) -> Sequence[WorkloadJob]:
        """Jobs added since the last call (every job on the first call), each
        with its ``arrival_s`` in seconds since the run started."""

    def requests(self, after: int) -> Sequence[Request]:
        """Requests numbered above ``after``, oldest first."""

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``; an open source returns as soon as a job or request arrives."""

    @property
    def closed(self) -> bool:
        """No job will be added any more (the run ends once its jobs have)."""


class ClosedSource:
    """A workload known up front (``pollux-opt run --workload``)."""

    def __init__(self, workload: Workload, sleep=time.sleep) -> None:
        self.workload, self.name, self._sleep = workload, workload.name, sleep
        self._given = False

    def new_jobs(self) -> Sequence[WorkloadJob]:
        jobs, self._given = (() if self._given else tuple(self.workload.jobs)), True
        return jobs

    def requests(self, after: int) -> Sequence[Request]:
        return ()

    def wait(self, seconds: float) -> None:
        self._sleep(seconds)

    @property
    def closed(self) -> bool:
        return True
