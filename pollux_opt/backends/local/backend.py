"""The real backend: runs a workload's CPU training jobs on this machine.

:class:`RealBackend` implements :class:`pollux_opt.scheduling.loop.Backend`
over one :class:`~pollux_opt.backends.local.handle.JobHandle` per job (by
default the runtime's ``ElasticJob``, sharing one warm ``WorkerPool``): it
submits jobs as they arrive, reads what they report into the unified event log
and the policy's views (:mod:`~pollux_opt.backends.local.polling`), pins their
replicas to CPUs (:mod:`~pollux_opt.backends.local.cpus`) and applies the
policy's decisions.  :func:`pollux_opt.backends.local.run.run_workload` runs one
policy on one workload with it in a run directory.

**Recovery.**  A backend created on a run directory whose event log already
has events resumes the run: the submitted and finished jobs and the CPUs they
held come from a replay of the log (:func:`~pollux_opt.backends.local.bookkeeping.replay_log`),
and each unfinished job is re-opened from its work directory, so that it
resumes from its newest good checkpoint when next started.  Jobs that held
CPUs get a ``restart_after_fault`` event with an empty placement (their
workers ended with the scheduler).

**Stopping early.**  ``should_stop`` (a stop signal, see
:mod:`~pollux_opt.backends.local.signals`) is checked at every poll of
:meth:`RealBackend.advance` and before each round's views, which then raise
:class:`RunStopping`; :meth:`RealBackend.stop_run` checkpoints and stops every
unfinished job, logs the stops (``rescale_begin`` to ``{}``, then what the
jobs report) and a ``run_stop`` event, and the run resumes from there like
after a kill.

**Rounds.**  The loop decides every ``interval`` seconds, and also as soon as a
job arrives, finishes or fails (``advance`` returns early), so CPUs freed by a
finishing job are not left idle until the next round; this applies to every
policy alike.

**The job owns its batch.**  The policy decides placements; each job picks
its batch for its allocation with its own goodput model, and re-picks it as
the model improves (:func:`pollux_opt.agent.batch.choose_batch`).  Under a
policy whose ``fixed_batch`` is true (``fixed``, ``dynamic``, ...) each job
trains at its submitted batch size (``RuntimeOptions.fixed_batch_size``).
``report`` events carry the batch that ran.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from solvers import InvalidProblem

from pollux_opt.backends.local import polling
from pollux_opt.backends.local.bookkeeping import STOP_GRACE_S, JobBookkeeping, replay_log, stop_jobs
from pollux_opt.backends.local.cpus import CpuPinning
from pollux_opt.backends.local.handle import JobFactory, JobOpener, elastic_factory, elastic_opener, make_options
from pollux_opt.backends.local.handle import new_pool
from pollux_opt.backends.local.nodes import RunNodes
from pollux_opt.lifecycle import JobState
from pollux_opt.model import Cluster
from pollux_opt.records.events import EventLog
from pollux_opt.records.files import safe_name
from pollux_opt.scheduling.loop import Decision, JobView
from pollux_opt.workloads.job import Workload

__all__ = ["JOBS_DIR", "POLL_S", "STOP_GRACE_S", "RealBackend", "RunStopping"]

log = logging.getLogger(__name__)

#: Seconds between polls of the jobs while the backend waits for the next round
#: (the latency of noticing an arrival or a finished job; each poll costs a few
#: milliseconds of scheduler time per job on this machine, so 1 s keeps polling
#: near 0.5 % of the time).
POLL_S = 1.0
#: Seconds between periodic ``report`` events of each running job.
REPORT_EVERY_S = 5.0
#: Most seconds between full reads of a job whose state has not changed (a full
#: read builds the runtime's JobReport and translates its events; between
#: them a poll reads only the job's state).  Translated runtime events keep
#: their own timestamps; validation values are stamped when read, so up to this late.
FULL_READ_S = 2.0
#: Restart delay assumed for a job before any restart of any job was measured:
#: the first (re)starts of the built-in jobs measured 3.5-9 s on a loaded
#: 2-core machine (cold worker spawn and ``import torch``); 10 s is the rounded-up top.
UNMEASURED_RESTART_DELAY_S = 10.0
#: Folder of the run directory holding each job's work directory (``jobs/<id>``).
JOBS_DIR = "jobs"


class RunStopping(Exception):
    """Raised by :meth:`RealBackend.advance` once ``should_stop`` holds (see the module docstring)."""


class RealBackend:
    """:class:`pollux_opt.scheduling.loop.Backend` over real elastic CPU jobs.

    Args:
        run_dir: the run directory (jobs' work directories go under ``jobs/``).
        workload: the jobs and their arrivals.
        cluster: nodes and CPUs (node ids must be those the policy places on).
        events: the run's event log (job events are appended to it; events
            already in it are replayed, see the module docstring).
        fixed_batch: jobs train at their submitted batch size (the policy's
            ``fixed_batch``) instead of co-adapting it (Pollux).
        started_unix: Unix time of the run's start (the clock's zero).
        pin_cpus: pin each replica to its own CPU, node by node (only when the
            cluster has no more CPUs than this process may use).
        runtime_options: extra ``RuntimeOptions`` fields for every job.
        job_factory, job_opener: how to create a job's handle and re-open one
            from its work directory (see :mod:`~pollux_opt.backends.local.handle`;
            default ``ElasticJob``; tests inject stand-ins).
        pool: a shared worker pool (default with the default handles: a new
            one, closed by :meth:`close`).
        clock, sleep: time sources (tests inject fakes).
        poll_s, report_every_s: polling and report periods, seconds.
        should_stop: polled while advancing; once true, :meth:`advance` raises
            :class:`RunStopping` (see the module docstring).
        cpu_quota: ``{node type: fraction}`` of the cluster's throttled types:
            their nodes get a cgroup CPU quota (:class:`~pollux_opt.backends.local.nodes.RunNodes`,
            removed by :meth:`close`); raises :class:`~pollux_opt.backends.local.nodes.ThrottleRefused`
            where cgroups cannot be written.

    **Node types.**  On a cluster of several node types each command tells the
    job the type of every node it is placed on (its step times go to that
    type's measurements), and each view carries the job's per-type goodput
    models (``JobView.goodput_models``, see
    :meth:`pollux_opt.runtime.report.JobReport.goodput_models`).  On an untyped
    cluster commands and views carry neither.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        workload: Workload,
        cluster: Cluster,
        events: EventLog,
        *,
        fixed_batch: bool,
        started_unix: float,
        pin_cpus: bool = True,
        runtime_options: Mapping[str, Any] | None = None,
        job_factory: JobFactory | None = None,
        job_opener: JobOpener | None = None,
        pool: Any = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        poll_s: float = POLL_S,
        report_every_s: float = REPORT_EVERY_S,
        should_stop: Callable[[], bool] = lambda: False,
        cpu_quota: Mapping[str, float] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.workload = workload
        self.cluster = cluster
        self.events = events
        self.fixed_batch = bool(fixed_batch)
        self.started_unix = float(started_unix)
        self._clock, self._sleep, self._should_stop = clock, sleep, should_stop
        self.poll_s, self.report_every_s = float(poll_s), float(report_every_s)
        self._runtime_options = dict(runtime_options or {})
        self._own_pool = False
        if job_factory is None or job_opener is None:
            job_factory, job_opener = job_factory or elastic_factory, job_opener or elastic_opener
            if pool is None:
                pool, self._own_pool = new_pool(), True
        self._factory, self._opener, self.pool = job_factory, job_opener, pool
        self.poll_seconds = 0.0  # wall time spent polling jobs in advance(): scheduler overhead
        self._wake = False
        self._pinning = CpuPinning(cluster, pin_cpus)
        self._node_ids = frozenset(n.id for n in cluster.nodes)
        self.jobs: dict[str, JobBookkeeping] = {
            wl.id: JobBookkeeping(id=wl.id, wl=wl, spec=wl.job_spec()) for wl in workload.jobs
        }
        self._measured_delays: list[float] = []
        self._queued: list[tuple] = []
        self.nodes = RunNodes(cluster, cpu_quota)
        try:
            self._restore()
        except BaseException:
            self.nodes.close()
            raise

    def _restore(self) -> None:
        """Rebuild the jobs from the event log and re-open the unfinished ones
        (a resumed run; see the module docstring)."""
        self._measured_delays = replay_log(self.jobs, self.events.path, self.started_unix)
        now = self.now()
        for job in self.jobs.values():
            if not job.submitted or job.finished:
                continue
            try:
                job.handle = self._opener(self._workdir(job), self.pool)
            except InvalidProblem:
                job.handle = None  # never created (killed between the submit event and creation)
            if job.handle is None:
                try:
                    job.handle = self._create(job)
                except InvalidProblem as exc:
                    self._finish_failed(job, now, f"could not re-create the job on resume: {exc}")
                    continue
            if job.placement:
                job.hold(now, {})
                self._emit("restart_after_fault", now, job.id, placement={},
                           reason="scheduler restarted; workers ended with it")
            job.report_t = math.nan

    def stop_run(self, reason: str, timeout: float = STOP_GRACE_S) -> list[str]:
        """Checkpoint and stop every unfinished job and log it: a stop order per
        job holding CPUs, what the jobs then report (their stops, or a
        completion that came first) and a ``run_stop`` event.  Returns the ids of
        the jobs left stopped (they resume when the run does)."""
        now = self.now()
        live = [j for j in self.jobs.values() if j.handle is not None and not j.finished and j.started]
        for job in live:
            if job.placement:
                self._emit("rescale_begin", now, job.id, old_placement=job.placement, placement={}, reason=reason)
                job.hold(now, {})
                job.change_t = now
                self._pinning.release(job.id)
        stop_jobs(live, timeout)
        self._poll(arrivals=False)
        stopped = [j.id for j in self.jobs.values() if j.submitted and not j.finished]
        self._emit("run_stop", self.now(), None, reason=reason, stopped=stopped)
        return stopped

    def close(self, *, graceful: bool = True, timeout: float = STOP_GRACE_S) -> None:
        """Stop unfinished jobs (checkpointing them if ``graceful``), end all
        workers and remove the node cgroups."""
        try:
            if graceful:
                stop_jobs([j for j in self.jobs.values() if j.handle is not None and not j.finished], timeout)
            for j in self.jobs.values():
                if j.handle is not None:
                    j.handle.close()
            if self._own_pool and self.pool is not None:
                self.pool.close()
        finally:
            self.nodes.close()

    # ------------------------------------------------------------------ clock
    def now(self) -> float:
        return self._clock() - self.started_unix

    # ----------------------------------------------------------- submissions
    def _workdir(self, job: JobBookkeeping) -> Path:
        return self.run_dir / JOBS_DIR / safe_name("job id", job.id)

    def _create(self, job: JobBookkeeping):
        opts_kwargs = dict(self._runtime_options)
        opts_kwargs["fixed_batch_size"] = self._fixed_batch_size(job)
        # Its CPUs are released when it reaches the target: after a failed
        # check it must wait for the scheduler, not reclaim them.
        opts_kwargs["resume_after_failed_verification"] = False
        return self._factory(job.spec, self._workdir(job), job.id, make_options(opts_kwargs), self.pool)

    def _submit_arrivals(self, now: float) -> None:
        for job in self.jobs.values():
            if job.submitted or job.wl.arrival_s > now:
                continue
            self._emit(
                "submit", now, job.id, kind=job.wl.kind, arrival_s=job.wl.arrival_s,
                submitted_replicas=job.wl.replicas, submitted_batch_size=job.wl.batch_size,
                max_replicas=self._max_replicas(job), min_replicas=job.wl.min_replicas,
                target=job.spec.target, metric=job.spec.metric, fixed_batch_size=self._fixed_batch_size(job),
            )
            job.submit_at(now)
            try:
                job.handle = self._create(job)
            except InvalidProblem as exc:
                self._finish_failed(job, now, f"could not create the job: {exc}")
            self._wake = True

    def _max_replicas(self, job: JobBookkeeping) -> int:
        total = self.cluster.total_cpus
        cap = job.wl.max_replicas or total
        return max(1, min(cap, total, polling.max_feasible_replicas(job.spec, self._fixed_batch_size(job))))

    def _fixed_batch_size(self, job: JobBookkeeping) -> int | None:
        """The total batch ``job`` trains at: its submitted one under a fixed-batch policy, else None."""
        return job.wl.batch_size if self.fixed_batch else None

    # --------------------------------------------------------------- events
    def _emit(self, etype: str, t: float, job_id: str | None, **fields: Any) -> None:
        self.events.emit(etype, t, job_id, **fields)  # in time order: see EventLog.emit

    def _finish_failed(self, job: JobBookkeeping, t: float, reason: str) -> None:
        job.hold(t, {})
        self._pinning.release(job.id)
        job.state, job.end = JobState.FAILED, t
        self._emit("failed", t, job.id, reason=reason)
        self._wake = True

    def _complete(self, job: JobBookkeeping, report, now: float) -> None:
        fields = polling.complete_fields(job, report, now)
        self._pinning.release(job.id)
        self._emit("complete", now, job.id, **fields)
        job.hold(now, {})
        job.state, job.end = JobState.SUCCEEDED, now
        self._wake = True

    # --------------------------------------------------------------- polling
    def _read(self, job: JobBookkeeping, now: float, full: bool):
        """The job's report if it needs a full read now (else None); a failing read fails the job."""
        try:
            if not full and now - job.read_t < FULL_READ_S and job.handle.poll() is job.state:
                return None
            report = job.handle.report()
            job.read_t = now
        except Exception as exc:  # noqa: BLE001 - one broken job must not stop the others
            log.exception("report of job %s failed", job.id)
            self._finish_failed(job, now, f"report failed: {type(exc).__name__}: {exc}")
            return None
        job.report = report
        return report

    def _poll(self, full: bool = True, arrivals: bool = True) -> None:
        """Submit arrivals (if ``arrivals``) and read the jobs.  A full read (``report()``, event
        translation, checkpoints, reports) is done for every job when ``full``,
        else only for jobs whose state changed or whose last full read is
        :data:`FULL_READ_S` old; the others cost one ``poll()`` each."""
        now = self.now()
        if arrivals:
            self._submit_arrivals(now)
        polled = []
        for job in self.jobs.values():
            if not job.submitted or job.finished or job.handle is None:
                continue
            report = self._read(job, now, full)
            if report is None:
                continue
            found = polling.translate_runtime_events(job, report, self.started_unix)
            self._measured_delays.extend(found.measured)
            for t, etype, fields in found.events:  # the index keeps equal times in translation order
                self._queued.append((t, len(self._queued), etype, job.id, fields))
            if found.target_reached:
                self._pinning.release(job.id)
                self._wake = True
            polled.append((job, report))
        for t, _, etype, jid, fields in sorted(self._queued):
            self._emit(etype, t, jid, **fields)
        self._queued.clear()
        for job, report in polled:
            self._after_read(job, report, now)

    def _after_read(self, job: JobBookkeeping, report, now: float) -> None:
        """Log what a full read found besides runtime events: checkpoints, a new
        metric, a periodic report; and the job's end."""
        for fields in polling.checkpoint_events(job, self._workdir(job) / "checkpoints"):
            self._emit("checkpoint", now, job.id, **fields)
        if report.metric is not None and report.metric != job.last_metric:
            job.last_metric = report.metric
            self._emit("validation", now, job.id, value=report.metric,
                       metric=report.metric_name, step=report.step, progress=report.progress)
        job.state = state = report.state
        if (state is JobState.RUNNING and report.placement
                and (math.isnan(job.report_t) or now - job.report_t >= self.report_every_s)):
            fields = polling.report_fields(job, report, now)
            if fields is not None:
                self._emit("report", now, job.id, **fields)
        if state is JobState.SUCCEEDED:
            self._complete(job, report, now)
        elif state.terminal:  # failed, or cancelled from outside the backend
            self._finish_failed(job, now, report.error or state.value)

    # ------------------------------------------------------------- Backend API
    def views(self) -> list[JobView]:
        if self._should_stop():
            raise RunStopping  # before a decision: nothing is started only to be stopped
        self._poll()
        now = self.now()
        delays = self._measured_delays
        fallback = float(np.median(delays)) if delays else UNMEASURED_RESTART_DELAY_S
        out = []
        for job in self.jobs.values():
            if not job.submitted or job.finished or job.handle is None:
                continue
            view = polling.job_view(job, now, self._max_replicas(job), fallback,
                                    types=self.nodes.types)
            if view is not None:
                out.append(view)
        return out

    def apply(self, decision: Decision) -> None:
        now = self.now()
        moves = polling.plan_moves(self.jobs.values(), decision, self._node_ids)
        for job, target in moves:  # release first, so that growing jobs find the CPUs free
            self._pinning.shrink(job.id, target)
        for job, target in moves:
            old = job.placement
            cpus = self._pinning.grow(job.id, target)
            job.account(now)
            try:
                polling.command(job.handle, job.started, target, cpus, **self.nodes.command_kwargs(target))
            except InvalidProblem as exc:
                # The job finished (or failed) since the views were read; the next poll records it.
                log.warning("job %s: could not apply %s: %s", job.id, target, exc)
                self._pinning.release(job.id)
                continue
            if not job.started:
                job.started = True
                self._emit("start", now, job.id, placement=target, cpus=cpus)
            else:
                job.restarts += 1 if target else 0
                self._emit("rescale_begin", now, job.id, old_placement=old, placement=target, cpus=cpus)
            job.hold(now, target)
            job.change_t, job.report_t = now, math.nan

    def advance(self, seconds: float) -> None:
        deadline = self._clock() + seconds
        self._wake = False
        while True:
            if self._should_stop():
                raise RunStopping
            t0 = time.perf_counter()
            self._poll(full=False)
            self.poll_seconds += time.perf_counter() - t0
            left = deadline - self._clock()
            if self._wake or left <= 0 or self.finished():
                return
            self._sleep(min(self.poll_s, left))

    def finished(self) -> bool:
        return all(j.submitted and j.finished for j in self.jobs.values())
