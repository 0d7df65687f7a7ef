"""The real backend: runs a workload's CPU training jobs on this machine.

:class:`RealBackend` implements :class:`pollux_opt.scheduling.loop.Backend`
over one :class:`~pollux_opt.backends.local.handle.JobHandle` per job (by
default the runtime's ``ElasticJob``, sharing one warm ``WorkerPool``): it
takes its jobs from a :class:`~pollux_opt.workloads.source.JobSource` (a
workload's arrivals, or the service's open queue with its cancel and weight
requests), reads what they report into the event log and the policy's views
(:mod:`~pollux_opt.backends.local.polling`), and turns each decision into
commands on CPUs, node types and cgroups (:mod:`~pollux_opt.backends.local.nodes`).
It is one class past the usual module size because it is the one owner of
each job's bookkeeping, which every one of these steps reads and moves.  The loop decides every
``interval`` seconds, and also as soon as a job arrives, finishes, fails or
reaches its target (``advance`` returns early), so that freed CPUs are not
left idle.  Each job picks its batch for its placement with its own goodput
model (:func:`pollux_opt.agent.batch.choose_batch`), or trains at its
submitted batch under a ``fixed_batch`` policy.

**Recovery.**  On a run directory whose event log has events, the jobs and the
CPUs they held come from a replay of the log, and each unfinished job is
re-opened from its work directory (it resumes from its newest good
checkpoint); jobs that held CPUs get a ``restart_after_fault`` event with an
empty placement (their workers ended with the scheduler).

**Stopping early.**  Once ``should_stop`` holds, :meth:`RealBackend.advance`
and :meth:`RealBackend.views` raise :class:`RunStopping`;
:meth:`RealBackend.stop_run` then checkpoints and stops every unfinished job,
logs the stops (``rescale_begin`` to ``{}``, then what the jobs report) and a
``run_stop`` event, and the run resumes from there like after a kill.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from solvers import InvalidProblem

import pollux_opt.backends.local.polling as polling
from pollux_opt.backends.local.handle import (
    STOP_GRACE_S, JobBookkeeping, JobFactory, JobOpener, elastic_factory, elastic_opener, stop_jobs,
)
from pollux_opt.backends.local.nodes import ReplicaSlots, RunNodes
from pollux_opt.lifecycle import JobState
from pollux_opt.model import Cluster
from pollux_opt.records.events import EventLog, read_events
from pollux_opt.records.files import safe_name
from pollux_opt.records.replay import clean_placement, replay
from pollux_opt.scheduling.loop import Decision, JobView
from pollux_opt.model.domains import check
from pollux_opt.model.job import WEIGHT
from pollux_opt.workloads.job import Workload
from pollux_opt.workloads.source import ClosedSource, JobSource

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
#: them a poll reads only the job's state: reading fully at every poll doubles
#: the polls' cost).  Translated runtime events keep their own timestamps;
#: validation values are stamped when read, so up to this late.
FULL_READ_S = 2.0
#: Restart delay assumed for a job before any restart of any job was measured:
#: the first (re)starts of the built-in jobs measured 3.5-9 s on a loaded
#: 2-core machine (cold worker spawn and ``import torch``); 10 s is the rounded-up top.
UNMEASURED_RESTART_DELAY_S = 10.0
#: Idle warm workers the default pool keeps ready (one spare cuts a cold start
#: of about two CPU-seconds from most starts and scale-ups).
POOL_SPARES = 1
#: Folder of the run directory holding each job's work directory (``jobs/<id>``).
JOBS_DIR = "jobs"


class RunStopping(Exception):
    """Raised by :meth:`RealBackend.advance` once ``should_stop`` holds (see the module docstring)."""


class RealBackend:
    """:class:`pollux_opt.scheduling.loop.Backend` over real elastic CPU jobs.

    Args:
        run_dir: the run directory (jobs' work directories go under ``jobs/``).
        source: where the jobs come from: a workload (its jobs and their
            arrivals) or a :class:`~pollux_opt.workloads.source.JobSource` (the
            service's open queue, with its cancel and weight requests).
        cluster: nodes and CPUs (node ids must be those the policy places on).
        events: the run's event log (events already in it are replayed).
        history: the events ``events`` held when the run (re)started, where the
            caller has read them already (None: read them from ``events``).
        fixed_batch: jobs train at their submitted batch size (the policy's
            ``fixed_batch``) instead of co-adapting it (Pollux).
        started_unix: Unix time of the run's start (the clock's zero).
        pin_cpus: pin each replica to its own CPU, node by node (only when the
            cluster has no more CPUs than this process may use).
        runtime_options: extra ``RuntimeOptions`` fields for every job.
        job_factory, job_opener: how to create a job's handle and re-open one
            from its work directory (default ``ElasticJob``; tests inject stand-ins).
        pool: a shared worker pool (default with the default handles: a new
            one, closed by :meth:`close`).
        clock, sleep: time sources (tests inject fakes).
        report_every_s: period of each running job's ``report`` events, seconds.
        should_stop: once true, the backend stops (see the module docstring).
        cpu_quota: ``{node type: fraction}`` of the cluster's throttled types,
            whose nodes get a cgroup CPU quota (:class:`~pollux_opt.backends.local.nodes.RunNodes`).
        gpu_types: the cluster's node types whose slots are GPUs: each replica
            there holds one of this machine's GPUs (:class:`~pollux_opt.backends.local.nodes.GpuSlots`).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        source: Workload | JobSource,
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
        report_every_s: float = REPORT_EVERY_S,
        should_stop: Callable[[], bool] = lambda: False,
        cpu_quota: Mapping[str, float] | None = None,
        gpu_types: Sequence[str] = (),
        history: Sequence[dict] | None = None,
        cancel_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.source = source if isinstance(source, JobSource) else ClosedSource(source, sleep)
        self.cluster = cluster
        self.events = events
        self.started_unix = float(started_unix)
        self._clock, self._should_stop = clock, should_stop
        self.fixed_batch, self.cancel_grace_s = fixed_batch, float(cancel_grace_s)
        self._request_seq = 0  # the newest request applied (from the log on a resumed run)
        self.report_every_s = float(report_every_s)
        self._runtime_options = dict(runtime_options or {})
        self._own_pool = False
        if job_factory is None or job_opener is None:
            job_factory, job_opener = job_factory or elastic_factory, job_opener or elastic_opener
            if pool is None:
                from pollux_opt.runtime.pool import WorkerPool

                pool, self._own_pool = WorkerPool(spares=POOL_SPARES), True
        self._factory, self._opener, self.pool = job_factory, job_opener, pool
        self.poll_seconds = 0.0  # wall time spent polling in advance(): scheduler overhead
        self._wake = False
        self._pinning = ReplicaSlots(cluster, pin_cpus, gpu_types)
        self._node_ids = frozenset(n.id for n in cluster.nodes)
        self.jobs: dict[str, JobBookkeeping] = {}
        self._add_jobs()
        self.nodes = RunNodes(cluster, cpu_quota)
        try:
            self._restore(history)
        except BaseException:
            self.nodes.close()
            raise

    def _restore(self, logged: Sequence[dict] | None) -> None:
        """Replay the event log (``logged``, else read) into the jobs and re-open the unfinished
        ones (see the module docstring); runtime events older than its newest event were logged."""
        if logged is None:
            logged = read_events(self.events.path) if self.events.path.exists() else []
        replay(logged, self.jobs)
        logged_until = self.started_unix + max((float(e["t"]) for e in logged), default=-math.inf)
        self._request_seq = max((int(e["request"]) for e in logged if e.get("request") is not None), default=0)
        now = self.now()
        for job in self.jobs.values():
            job.src_time = max(job.src_time, logged_until)
            if not job.submitted or job.finished:
                continue
            try:
                job.handle = self._opener(self.job_dir(job.id), self.pool)
            except InvalidProblem:  # never created (killed between the submit event and creation)
                try:
                    job.handle = self._create(job)
                except InvalidProblem as exc:
                    self._finish_failed(job, now, f"could not re-create the job on resume: {exc}")
                    continue
            if job.placement:
                job.hold(now, {})
                self._emit("restart_after_fault", now, job.id, placement={},
                           reason="scheduler restarted; workers ended with it")
            if job.cancelling:  # asked before the restart: ask again
                self._cancel(job, now)

    def stop_run(self, reason: str, timeout: float = STOP_GRACE_S) -> list[str]:
        """Checkpoint and stop every unfinished job and log it (see the module
        docstring).  Returns the ids of the jobs left stopped (they resume when the run does)."""
        now = self.now()
        live = [j for j in self.jobs.values() if j.live and j.started]
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
                stop_jobs([j for j in self.jobs.values() if j.live], timeout)
            for j in self.jobs.values():
                if j.handle is not None:
                    j.handle.close()
            if self._own_pool and self.pool is not None:
                self.pool.close()
        finally:
            self.nodes.close()

    def now(self) -> float:
        return self._clock() - self.started_unix

    # ----------------------------------------------------------- submissions
    def job_dir(self, job_id: str) -> Path:
        """The work directory of job ``job_id`` (checkpoints, ``logs/``): ``<run dir>/jobs/<id>``."""
        return self.run_dir / JOBS_DIR / safe_name("job id", job_id)

    def _create(self, job: JobBookkeeping):
        from pollux_opt.runtime.report import RuntimeOptions

        # Its CPUs are released when it reaches the target: after a failed
        # check it must wait for the scheduler, not reclaim them.
        fields = {**self._runtime_options, "fixed_batch_size": job.fixed_batch_size,
                  "resume_after_failed_verification": False}
        try:
            options = RuntimeOptions(**fields)
        except TypeError as exc:
            raise InvalidProblem(f"unknown runtime option in {sorted(fields)}: {exc}") from exc
        return self._factory(job.spec, self.job_dir(job.id), job.id, options, self.pool)

    def _add_jobs(self) -> None:
        """Take the source's new jobs (each is submitted once its arrival is due).

        A job of an open source whose spec no longer resolves (its script was
        removed since it was accepted) fails when submitted; a closed source's
        is refused before the run starts."""
        for wl in self.source.new_jobs():
            if wl.id in self.jobs:
                continue
            spec, invalid = None, None
            try:
                spec = wl.job_spec()
            except InvalidProblem as exc:
                if self.source.closed:
                    raise
                invalid = str(exc)
            self.jobs[wl.id] = JobBookkeeping(id=wl.id, wl=wl, spec=spec, weight=wl.weight, invalid=invalid,
                                              fixed_batch_size=wl.batch_size if self.fixed_batch else None)

    def _submit_arrivals(self, now: float) -> None:
        self._add_jobs()
        for job in self.jobs.values():
            if job.submitted or job.wl.arrival_s > now:
                continue
            self._emit("submit", now, job.id, **polling.submit_fields(job, self.cluster.total_cpus))
            job.submit_at(now)
            try:
                if job.invalid is not None:
                    raise InvalidProblem(job.invalid)
                job.handle = self._create(job)
            except InvalidProblem as exc:
                self._finish_failed(job, now, f"could not create the job: {exc}")
            self._wake = True
        self._take_requests(now)

    def _take_requests(self, now: float) -> None:
        """Apply the source's new requests (each once: the log records the last one applied)."""
        for request in self.source.requests(self._request_seq):
            self._request_seq = request.seq
            job = self.jobs.get(request.job_id)
            if job is None or not job.submitted or job.finished:
                log.info("request %d (%s of job %s): the job has ended or is unknown; nothing to do",
                         request.seq, request.kind, request.job_id)
            elif request.kind == "weight":
                job.weight = check("weight", request.weight, WEIGHT)
                self._emit("weight", now, job.id, weight=job.weight, request=request.seq)
                self._wake = True
            elif not job.cancelling:
                self._emit("cancel", now, job.id, reason="request", request=request.seq)
                self._cancel(job, now)

    def _cancel(self, job: JobBookkeeping, now: float) -> None:
        """Free ``job``'s CPUs now and ask it to checkpoint and end (``cancelled``);
        it is ended without a checkpoint once :attr:`cancel_grace_s` have passed."""
        job.cancelling, job.cancel_deadline = True, now + self.cancel_grace_s
        self._pinning.release(job.id)
        job.hold(now, {})
        self._wake = True
        try:
            job.handle.cancel()
        except InvalidProblem:
            pass  # it ended meanwhile: the next poll records how

    # --------------------------------------------------------------- events
    def _emit(self, etype: str, t: float, job_id: str | None, **fields: Any) -> None:
        self.events.emit(etype, t, job_id, **fields)  # in time order: see EventLog.emit

    def _end(self, job: JobBookkeeping, t: float, state: JobState, etype: str, **fields: Any) -> None:
        """Log ``job``'s end at ``t`` (``complete`` or ``failed``); it holds nothing from then on."""
        self._pinning.release(job.id)
        self._emit(etype, t, job.id, **fields)
        job.hold(t, {})
        job.state, job.end = state, t
        self._wake = True

    def _finish_failed(self, job: JobBookkeeping, t: float, reason: str) -> None:
        self._end(job, t, JobState.FAILED, "failed", reason=reason)

    # --------------------------------------------------------------- polling
    def _poll(self, full: bool = True, arrivals: bool = True) -> None:
        """Submit arrivals (if ``arrivals``) and read the live jobs: fully (when
        ``full``, when its state changed, or :data:`FULL_READ_S` after the last
        full read), logging the runtime events of all jobs in time order, then
        each job's checkpoints, metric, periodic report and end."""
        now = self.now()
        if arrivals:
            self._submit_arrivals(now)
        read, translated = [], []
        for job in self.jobs.values():
            if not job.live:
                continue
            try:
                if not full and now - job.read_t < FULL_READ_S and job.handle.poll() is job.state:
                    continue
                job.report, job.read_t = job.handle.report(), now
            except Exception as exc:  # noqa: BLE001 - one broken job must not stop the others
                log.exception("report of job %s failed", job.id)
                self._finish_failed(job, now, f"report failed: {type(exc).__name__}: {exc}")
                continue
            for t, etype, fields in polling.translate_runtime_events(job, job.report, self.started_unix):
                translated.append((t, len(translated), etype, job.id, fields))  # equal times keep their order
                if fields.get("target_reached"):
                    self._pinning.release(job.id)
                    self._wake = True
            read.append(job)
        for t, _, etype, jid, fields in sorted(translated):
            self._emit(etype, t, jid, **fields)
        for job in read:
            report = job.report
            for fields in polling.checkpoint_events(job, self.job_dir(job.id) / "checkpoints"):
                self._emit("checkpoint", now, job.id, **fields)
            if report.metric is not None and report.metric != job.last_metric:
                job.last_metric = report.metric
                self._emit("validation", now, job.id, value=report.metric,
                           metric=report.metric_name, step=report.step, progress=report.progress)
            fields = polling.report_fields(job, report, now, self.report_every_s)
            if fields is not None:
                self._emit("report", now, job.id, **fields)
            job.state = state = report.state
            if state is JobState.SUCCEEDED:
                self._end(job, now, state, "complete", **polling.complete_fields(job, report, now))
            elif state is JobState.CANCELLED:
                self._end(job, now, state, "cancelled", reason="checkpointed and stopped on request")
            elif state.terminal:
                self._finish_failed(job, now, report.error or state.value)
            elif job.cancelling and now >= job.cancel_deadline:
                job.handle.close()
                self._end(job, now, JobState.CANCELLED, "cancelled",
                          reason=f"not stopped within the {self.cancel_grace_s:g} s grace period; ended")

    # ------------------------------------------------------------- Backend API
    def views(self) -> list[JobView]:
        if self._should_stop():
            raise RunStopping  # before a decision: nothing is started only to be stopped
        self._poll()
        now = self.now()
        delays = [d for job in self.jobs.values() for d in job.durations]
        fallback = float(np.median(delays)) if delays else UNMEASURED_RESTART_DELAY_S
        views = (polling.job_view(job, now, self.cluster.total_cpus, fallback, types=self.nodes.types)
                 for job in self.jobs.values() if job.live)
        return [v for v in views if v is not None]

    def apply(self, decision: Decision) -> None:
        """Move each job whose placement ``decision`` changes: free the CPUs it
        no longer holds (first, so that growing jobs find them), pin it to its
        new ones and command it there with its nodes' types and cgroups.

        Raises:
            InvalidProblem: the decision places a job on a node not in the cluster.
        """
        moves = []
        for job in self.jobs.values():
            if not job.live or polling.verifying(job) or job.cancelling:
                continue
            target = clean_placement(decision.placement.get(job.id))
            if target == job.placement:
                continue
            unknown = [nid for nid in target if nid not in self._node_ids]
            if unknown:
                raise InvalidProblem(f"decision places job {job.id!r} on unknown node {unknown[0]!r}")
            moves.append((job, target))
        for job, target in moves:
            self._pinning.shrink(job.id, target)
        now = self.now()
        for job, target in moves:
            self._move(job, target, now)

    def _move(self, job: JobBookkeeping, target: dict[str, int], now: float) -> None:
        """Stop ``job`` (``target`` empty), start it (its first placement) or rescale it, and log it."""
        old, (cpus, gpus) = job.placement, self._pinning.grow(job.id, target)
        try:
            if not target:
                job.handle.stop()
            else:
                job.handle.start(target, cpus=cpus, **_gpu_field(gpus), **self.nodes.command_kwargs(target))
        except InvalidProblem as exc:
            # The job finished (or failed) since the views were read; the next poll records it.
            log.warning("job %s: could not apply %s: %s", job.id, target, exc)
            self._pinning.release(job.id)
            return
        if not job.started:
            job.started = True
            self._emit("start", now, job.id, placement=target, cpus=cpus, **_gpu_field(gpus))
        else:
            job.restarts += 1 if target else 0
            self._emit("rescale_begin", now, job.id, old_placement=old, placement=target, cpus=cpus,
                       **_gpu_field(gpus))
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
            self.source.wait(min(POLL_S, left))

    def finished(self) -> bool:
        return self.source.closed and all(j.submitted and j.finished for j in self.jobs.values())


def _gpu_field(gpus: list[int | None] | None) -> dict:
    """``{"gpus": gpus}`` of a command or event on a placement with a GPU node (else nothing)."""
    return {} if gpus is None else {"gpus": gpus}
