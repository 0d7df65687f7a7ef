"""What the real backend knows about one job: :class:`JobBookkeeping`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pollux_opt.backends.local.handle import JobHandle
from pollux_opt.records.replay import JobTrack
from pollux_opt.workloads.job import WorkloadJob

__all__ = ["JobBookkeeping"]


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
