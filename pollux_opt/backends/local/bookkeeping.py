"""What the real backend knows about one job (:class:`JobBookkeeping`), rebuilt
from the event log when a run resumes (:func:`replay_log`), and the graceful
stop of the jobs' handles (:func:`stop_jobs`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from solvers import InvalidProblem

from pollux_opt.backends.local.handle import JobHandle
from pollux_opt.records.events import read_events
from pollux_opt.records.replay import JobTrack, replay
from pollux_opt.workloads.job import WorkloadJob

__all__ = ["STOP_GRACE_S", "JobBookkeeping", "replay_log", "stop_jobs"]

#: Seconds the backend waits for its jobs to checkpoint on a graceful stop.
STOP_GRACE_S = 20.0


@dataclass(kw_only=True)
class JobBookkeeping(JobTrack):
    """One job of a real run: its history as the event log records it (the
    :class:`~pollux_opt.records.replay.JobTrack` fields, rebuilt by a replay on
    resume and kept up to date as the backend writes events), plus its handle
    and the cursors of reading it.  Its ``state`` is the one the runtime last
    reported (the replay's, until the first read).

    Attributes:
        wl: the workload entry; ``spec``: its resolved ``JobSpec``.
        handle: the job's handle (None until created, or if it could not be).
        report: the last full report read (a ``JobReport``; None before one).
        read_t: run time of that read, seconds.
        ckpt_names: file names last seen in its checkpoint directory.
        ckpt_rejected: checkpoint metadata files found not to verify (never logged).
        report_t, report_progress, report_samples: time, progress and samples
            at its last ``report`` event (the reference of the next one's rates).
        change_t: run time of the last placement change the backend ordered.
        startup_s: seconds its first start took (from the runtime's ``started`` event).
    """

    wl: WorkloadJob
    spec: Any
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


def replay_log(jobs: Mapping[str, JobBookkeeping], path: Path, started_unix: float) -> list[float]:
    """Fold the event log at ``path`` into ``jobs`` (a resumed run; nothing for a
    new one, whose log does not exist yet) and return the rescale and restart
    durations it records, seconds.

    Runtime events older than the newest logged event were translated before
    the scheduler went away: each job's ``src_time`` moves up to it.
    """
    events = read_events(path) if path.exists() else []
    replay(events, jobs)
    logged_until = started_unix + max((float(e["t"]) for e in events), default=-math.inf)
    for job in jobs.values():
        job.src_time = max(job.src_time, logged_until)
    return [float(e["duration_s"]) for e in events if e.get("job_id") in jobs and e.get("duration_s") is not None]


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
