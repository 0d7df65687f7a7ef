"""The real backend: runs a workload's CPU training jobs on this machine.

:class:`RealBackend` implements :class:`pollux_opt.scheduling.loop.Backend` on the
elastic job runtime (one :class:`ElasticJob` per job, sharing one warm
:class:`WorkerPool`), and translates what the jobs report into the unified
event log.  :func:`run_real` runs one policy on one workload in a *run
directory*::

    run_dir/config.json     policy, workload, cluster, interval, start time (written once)
    run_dir/events.jsonl    the event log (see pollux_opt.records.events)
    run_dir/summary.json    metrics (pollux_opt.records.metrics), written at the end
    run_dir/jobs/<id>/      each job's work directory (checkpoints, logs)

**Recovery.**  If the scheduler process is killed, running :func:`run_real`
again on the same run directory resumes the run: the configuration comes from
``config.json``, the clock from its recorded start time (so JCTs include the
outage), the submitted/finished jobs and CPUs held from the event log, and
each unfinished job is re-opened from its work directory, so that it resumes
from its newest good checkpoint when next started; completed jobs stay
completed.  Jobs that were running get a ``restart_after_fault`` event with
an empty placement (their workers ended with the scheduler).

**Rounds.**  The loop decides every ``interval`` seconds, and also as soon as a
job arrives, finishes or fails (``advance`` returns early), so CPUs freed by a
finishing job are not left idle until the next round; this applies to every
policy alike.

**Batch mode.**  A policy whose ``adapts_batch`` is false (``fixed``,
``dynamic``) runs each job at its submitted batch size
(``RuntimeOptions.fixed_batch_size``); otherwise the job co-adapts its batch
size with its goodput model (Pollux).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from solvers import InvalidProblem

from pollux_opt.records.events import EventLog, goodput_model_to_json, read_events
from pollux_opt.model.core import Cluster, Node
from pollux_opt.scheduling.loop import Decision, JobView
from pollux_opt.workloads.sets import Workload, WorkloadJob

__all__ = [
    "DEFAULT_INTERVAL_S",
    "RealBackend",
    "default_cluster",
    "run_real",
    "load_run_config",
]

log = logging.getLogger(__name__)

#: Default round interval for real runs (issue 5: 30 s; Pollux uses 60 s).
DEFAULT_INTERVAL_S = 30.0
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
DEFAULT_RESTART_DELAY_S = 10.0
#: Idle warm workers the shared pool keeps ready (one spare cuts a cold start
#: of about two CPU-seconds from most starts and scale-ups).
POOL_SPARES = 1
#: Seconds :meth:`RealBackend.close` waits for jobs to checkpoint on a graceful stop.
STOP_GRACE_S = 20.0

CONFIG_FILE = "config.json"
EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"
JOBS_DIR = "jobs"

_CKPT_META_RE = re.compile(r"^ckpt-(\d+)\.json$")


# --------------------------------------------------------------- runtime adapter
def _runtime():
    """The runtime's classes (imported lazily: torch-free import of this module)."""
    from pollux_opt.runtime.job import ElasticJob
    from pollux_opt.runtime.pool import WorkerPool
    from pollux_opt.runtime.report import JobState, RuntimeOptions

    return ElasticJob, WorkerPool, JobState, RuntimeOptions


def _state_name(state: Any) -> str:
    return getattr(state, "value", str(state))


#: Runtime states -> what a policy sees (None: not shown to policies).
_VIEW_STATE = {
    "pending": "pending",
    "stopped": "pending",
    "running": "running",
    "rescaling": "running",
    "verifying": None,  # reached the target, holds no CPUs, re-checking the metric
    "completed": "completed",
    "failed": "failed",
}


def default_cluster(num_nodes: int = 1, cpus: int | None = None) -> Cluster:
    """This machine: ``num_nodes`` nodes splitting the CPUs this process may use
    (``cpus`` of them, default all) as evenly as possible."""
    avail = len(os.sched_getaffinity(0))
    total = avail if cpus is None else cpus
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise InvalidProblem(f"cpus must be an integer >= 1, got {cpus!r}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or not 1 <= num_nodes <= total:
        raise InvalidProblem(f"num_nodes must be an integer in [1, {total}], got {num_nodes!r}")
    base, extra = divmod(total, num_nodes)
    return Cluster(tuple(Node(f"n{i}", base + (1 if i < extra else 0)) for i in range(num_nodes)))


def _atomic_write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, allow_nan=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _clean(placement: Mapping[str, int] | None) -> dict[str, int]:
    return {str(n): int(k) for n, k in (placement or {}).items() if int(k) > 0}


def _max_feasible_replicas(spec, batch_size: int | None) -> int:
    """Largest replica count with a feasible batch configuration (K * min_local_bsz <= B)."""
    b = spec.max_batch_size if batch_size is None else batch_size
    return max(1, b // spec.min_local_bsz)


# ---------------------------------------------------------------- per-job state
@dataclass
class _Tracked:
    wl: WorkloadJob
    spec: Any
    handle: Any = None
    submitted: bool = False
    submit_t: float = math.nan
    finished: bool = False
    started: bool = False
    placement: dict[str, int] = field(default_factory=dict)
    cpus: tuple[int, ...] | None = None
    restarts: int = 0
    seen_event_time: float = -math.inf
    ckpt_names: frozenset = frozenset()
    last_ckpt_step: int = -1
    last_metric: float | None = None
    report_t: float = math.nan
    report_progress: float = math.nan
    report_samples: float = math.nan
    service: float = 0.0
    service_since: float = 0.0
    change_t: float = math.nan
    target_t: float = math.nan
    startup_s: float | None = None
    state: str = "pending"
    report: Any = None
    read_t: float = -math.inf


class RealBackend:
    """:class:`pollux_opt.scheduling.loop.Backend` over real elastic CPU jobs.

    Args:
        run_dir: the run directory (jobs' work directories go under ``jobs/``).
        workload: the jobs and their arrivals.
        cluster: nodes and CPUs (node ids must be those the policy places on).
        events: the run's event log (job events are appended to it).
        adapts_batch: jobs co-adapt their batch size (Pollux) instead of
            training at their submitted batch size.
        started_unix: Unix time of the run's start (the clock's zero).
        pin_cpus: pin each replica to its own CPU, node by node (only when the
            cluster has no more CPUs than this process may use).
        runtime_options: extra :class:`RuntimeOptions` fields for every job.
        job_factory, job_opener: how to create a job handle
            ``(spec, workdir, job_id, options, pool)`` and re-open one from its
            work directory ``(workdir, pool)``; default ``ElasticJob`` (tests
            inject stand-ins).
        pool: a shared worker pool (default: a new one with
            :data:`POOL_SPARES` spares; closed by :meth:`close`).
        clock, sleep: time sources (tests inject fakes).
        poll_s, report_every_s: polling and report periods, seconds.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        workload: Workload,
        cluster: Cluster,
        events: EventLog,
        *,
        adapts_batch: bool,
        started_unix: float,
        pin_cpus: bool = True,
        runtime_options: Mapping[str, Any] | None = None,
        job_factory: Callable | None = None,
        job_opener: Callable | None = None,
        pool: Any = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        poll_s: float = POLL_S,
        report_every_s: float = REPORT_EVERY_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.workload = workload
        self.cluster = cluster
        self.events = events
        self.adapts_batch = bool(adapts_batch)
        self.started_unix = float(started_unix)
        self._clock, self._sleep = clock, sleep
        self.poll_s, self.report_every_s = float(poll_s), float(report_every_s)
        self._runtime_options = dict(runtime_options or {})
        if job_factory is None or job_opener is None:
            ElasticJob, WorkerPool, _, _ = _runtime()
            job_factory = job_factory or (
                lambda spec, workdir, job_id, options, pool: ElasticJob(
                    spec, workdir, job_id=job_id, options=options, pool=pool)
            )
            job_opener = job_opener or (lambda workdir, pool: ElasticJob.from_workdir(workdir, pool=pool))
            if pool is None:
                pool = WorkerPool(spares=POOL_SPARES)
                self._own_pool = True
            else:
                self._own_pool = False
        else:
            self._own_pool = False
        self._factory, self._opener, self.pool = job_factory, job_opener, pool
        self.poll_seconds = 0.0  # wall time spent polling jobs in advance(): scheduler overhead
        self._wake = False
        affinity = sorted(os.sched_getaffinity(0))
        self._pin = bool(pin_cpus) and cluster.total_cpus <= len(affinity)
        if pin_cpus and not self._pin:
            log.warning("cluster has %d CPUs but only %d are available: replicas are not pinned",
                        cluster.total_cpus, len(affinity))
        self._node_cpus: dict[str, list[int]] = {}
        i = 0
        for node in cluster.nodes:
            self._node_cpus[node.id] = affinity[i:i + node.cpus] if self._pin else []
            i += node.cpus
        self._cpu_owner: dict[int, str] = {}
        self.jobs: dict[str, _Tracked] = {}
        for wl in workload.jobs:
            spec = wl.job_spec()
            self.jobs[wl.id] = _Tracked(wl, spec)
        self._measured_delays: list[float] = []
        self._queued: list[tuple] = []
        self._last_t = -math.inf
        self._restore()

    # ------------------------------------------------------------------ clock
    def now(self) -> float:
        return self._clock() - self.started_unix

    # ---------------------------------------------------------------- resume
    def _restore(self) -> None:
        """Rebuild per-job state from the event log (a resumed run); no-op for a new one."""
        path = self.events.path
        events = read_events(path) if path.exists() else []
        for e in events:
            self._last_t = max(self._last_t, float(e["t"]))
            job = self.jobs.get(e.get("job_id") or "")
            if job is None:
                continue
            t, etype = float(e["t"]), e["type"]
            if etype == "submit":
                job.submitted, job.submit_t, job.service_since = True, t, t
            elif etype in ("start", "rescale_begin", "rescale_end", "restart_after_fault"):
                self._account(job, t)
                job.placement = _clean(e.get("placement"))
                job.cpus = tuple(e["cpus"]) if e.get("cpus") else None
                job.started = True
                if etype in ("rescale_begin", "restart_after_fault") and job.placement:
                    job.restarts += 1
            elif etype == "validation":
                job.last_metric = e.get("value")
                if e.get("target_reached"):
                    self._account(job, t)
                    job.placement, job.cpus, job.target_t = {}, None, t
            elif etype == "checkpoint":
                job.last_ckpt_step = max(job.last_ckpt_step, int(e.get("step", -1)))
            elif etype in ("complete", "failed"):
                self._account(job, t)
                job.placement, job.cpus, job.finished = {}, None, True
                job.state = "completed" if etype == "complete" else "failed"
            if e.get("src_time") is not None:
                job.seen_event_time = max(job.seen_event_time, float(e["src_time"]))
            if e.get("duration_s") is not None:
                self._measured_delays.append(float(e["duration_s"]))
        now = self.now()
        # Runtime events older than the newest logged event were translated before the kill.
        logged_until = self.started_unix + max((float(e["t"]) for e in events), default=-math.inf)
        for job in self.jobs.values():
            job.seen_event_time = max(job.seen_event_time, logged_until)
            if not job.submitted or job.finished:
                continue
            workdir = self.run_dir / JOBS_DIR / job.wl.id
            try:
                job.handle = self._opener(workdir, self.pool)
            except InvalidProblem:
                job.handle = None  # never created (killed between the submit event and creation)
            if job.handle is None:
                try:
                    job.handle = self._create(job)
                except InvalidProblem as exc:
                    self._finish_failed(job, now, f"could not re-create the job on resume: {exc}")
                    continue
            if job.placement:
                self._account(job, now)
                self._emit("restart_after_fault", now, job.wl.id, placement={},
                           reason="scheduler restarted; workers ended with it")
                job.placement, job.cpus = {}, None
            job.report_t = math.nan

    # ----------------------------------------------------------- submissions
    def _create(self, job: _Tracked):
        opts_kwargs = dict(self._runtime_options)
        opts_kwargs["fixed_batch_size"] = None if self.adapts_batch else job.wl.batch_size
        # Its CPUs are released when it reaches the target: after a failed
        # check it must wait for the scheduler, not reclaim them.
        opts_kwargs["resume_after_failed_verification"] = False
        options = _make_options(opts_kwargs)
        workdir = self.run_dir / JOBS_DIR / job.wl.id
        return self._factory(job.spec, workdir, job.wl.id, options, self.pool)

    def _submit_arrivals(self, now: float) -> None:
        for job in self.jobs.values():
            if job.submitted or job.wl.arrival_s > now:
                continue
            self._emit(
                "submit", now, job.wl.id, kind=job.wl.kind, arrival_s=job.wl.arrival_s,
                submitted_replicas=job.wl.replicas, submitted_batch_size=job.wl.batch_size,
                max_replicas=self._max_replicas(job), min_replicas=job.wl.min_replicas,
                target=job.spec.target, metric=job.spec.metric, adapts_batch=self.adapts_batch,
            )
            job.submitted, job.submit_t, job.service_since = True, now, now
            try:
                job.handle = self._create(job)
            except InvalidProblem as exc:
                self._finish_failed(job, now, f"could not create the job: {exc}")
            self._wake = True

    def _max_replicas(self, job: _Tracked) -> int:
        cap = job.wl.max_replicas or self.cluster.total_cpus
        return max(1, min(cap, self.cluster.total_cpus,
                          _max_feasible_replicas(job.spec, None if self.adapts_batch else job.wl.batch_size)))

    # --------------------------------------------------------------- events
    def _emit(self, etype: str, t: float, job_id: str | None, **fields: Any) -> None:
        """Append an event, never earlier than the last one (one ordered history;
        a runtime event stamped a moment before an already-written one moves up to it)."""
        t = max(float(t), self._last_t)
        self._last_t = t
        self.events.emit(etype, t, job_id, **fields)

    def _queue(self, etype: str, t: float, job_id: str, **fields: Any) -> None:
        """Queue a translated runtime event; :meth:`_poll` writes the queue in time order."""
        self._queued.append((float(t), len(self._queued), etype, job_id, fields))

    # --------------------------------------------------------------- polling
    def _account(self, job: _Tracked, t: float) -> None:
        held = sum(job.placement.values())
        job.service += held * max(t - job.service_since, 0.0)
        job.service_since = t

    def _finish_failed(self, job: _Tracked, t: float, reason: str) -> None:
        self._account(job, t)
        self._release_cpus(job)
        job.placement, job.finished, job.state = {}, True, "failed"
        self._emit("failed", t, job.wl.id, reason=reason)
        self._wake = True

    def _poll(self, full: bool = True) -> None:
        """Submit arrivals and read the jobs.  A full read (``report()``, event
        translation, checkpoints, reports) is done for every job when ``full``,
        else only for jobs whose state changed or whose last full read is
        :data:`FULL_READ_S` old; the others cost one ``poll()`` each."""
        now = self.now()
        self._submit_arrivals(now)
        polled = []
        for job in self.jobs.values():
            if not job.submitted or job.finished or job.handle is None:
                continue
            try:
                if not full and now - job.read_t < FULL_READ_S and (
                    _state_name(job.handle.poll()) == job.state
                ):
                    continue
                report = job.handle.report()
                job.read_t = now
            except Exception as exc:  # noqa: BLE001 - one broken job must not stop the others
                log.exception("report of job %s failed", job.wl.id)
                self._finish_failed(job, now, f"report failed: {type(exc).__name__}: {exc}")
                continue
            job.report = report
            self._translate(job, report)
            polled.append((job, report))
        for t, _, etype, jid, fields in sorted(self._queued):
            self._emit(etype, t, jid, **fields)
        self._queued.clear()
        for job, report in polled:
            self._checkpoints(job, now)
            if report.metric is not None and report.metric != job.last_metric:
                job.last_metric = report.metric
                self._emit("validation", now, job.wl.id, value=report.metric,
                           metric=report.metric_name, step=report.step, progress=report.progress)
            state = _state_name(report.state)
            job.state = state
            if state == "running" and (math.isnan(job.report_t) or now - job.report_t >= self.report_every_s):
                self._report(job, report, now)
            if state == "completed":
                self._complete(job, report, now)
            elif state == "failed":
                self._finish_failed(job, now, report.error or "failed")

    def _translate(self, job: _Tracked, report) -> None:
        """Runtime events newer than the last translated one -> unified events."""
        for ev in report.events:
            if ev.time <= job.seen_event_time:
                continue
            job.seen_event_time = ev.time
            t, d, jid = ev.time - self.started_unix, dict(ev.details), job.wl.id
            if ev.kind == "started":
                seconds = d.get("seconds")
                if seconds is not None:
                    self._measured_delays.append(float(seconds))
                if job.startup_s is None and seconds is not None:
                    job.startup_s = float(seconds)
                if job.restarts:  # a resume from a stop: the end of that rescale
                    self._queue("rescale_end", t, jid, placement=job.placement, duration_s=seconds,
                                resumed_step=d.get("step"), from_checkpoint=d.get("from_checkpoint"),
                                src_time=ev.time)
            elif ev.kind == "rescaled":
                if d.get("seconds") is not None:
                    self._measured_delays.append(float(d["seconds"]))
                self._queue("rescale_end", t, jid, placement=job.placement, duration_s=d.get("seconds"),
                            resumed_step=d.get("step"), from_checkpoint=d.get("from_checkpoint"),
                            src_time=ev.time)
            elif ev.kind == "stopped" and d.get("reason") == "request":
                dur = t - job.change_t if math.isfinite(job.change_t) else None
                self._queue("rescale_end", t, jid, placement={}, duration_s=dur, src_time=ev.time)
            elif ev.kind in ("worker_lost", "verification_failed"):
                placement = job.placement if ev.kind == "worker_lost" else _clean(report.placement)
                self._account(job, t)
                job.placement = placement
                job.restarts += 1 if placement else 0
                self._queue("restart_after_fault", t, jid, placement=placement, reason=ev.kind,
                            details={k: d[k] for k in ("rank", "exitcode", "reason") if k in d},
                            src_time=ev.time)
            elif ev.kind == "target_reached":
                self._account(job, t)
                self._release_cpus(job)
                job.placement, job.target_t = {}, t
                job.last_metric = d.get("metric")
                self._queue("validation", t, jid, value=d.get("metric"), metric=job.spec.metric,
                            step=d.get("step"), progress=report.progress, target_reached=True,
                            src_time=ev.time)
                self._wake = True

    def _checkpoints(self, job: _Tracked, now: float) -> None:
        directory = self.run_dir / JOBS_DIR / job.wl.id / "checkpoints"
        try:
            names = frozenset(os.listdir(directory))
        except OSError:
            return
        if names == job.ckpt_names:
            return
        job.ckpt_names = names
        for name in sorted(names):
            m = _CKPT_META_RE.match(name)
            if not m or int(m.group(1)) <= job.last_ckpt_step:
                continue
            step = int(m.group(1))
            try:
                meta = json.loads((directory / name).read_text())
            except (OSError, ValueError):
                continue  # being written; seen next poll
            job.last_ckpt_step = step
            self._emit("checkpoint", now, job.wl.id, step=step, progress=meta.get("progress"),
                       final=bool(meta.get("final", False)))

    def _report(self, job: _Tracked, report, now: float) -> None:
        m0 = job.spec.init_batch_size
        goodput = throughput = math.nan
        if math.isfinite(job.report_t) and now > job.report_t:
            dt = now - job.report_t
            goodput = (report.progress - job.report_progress) * m0 / dt
            throughput = (report.samples - job.report_samples) / dt
        job.report_t, job.report_progress, job.report_samples = now, report.progress, report.samples
        model = _model_of(report)
        base = math.nan
        if model is not None:
            choice = model.optimize(1, 1, fixed_batch_size=m0)
            base = float(choice.goodput) if bool(choice.feasible) else math.nan
        noise = report.grad_stats.noise_scale if report.grad_stats is not None else None
        if not math.isfinite(goodput):
            return  # the first report of a running spell only sets the reference point
        self._emit(
            "report", now, job.wl.id, throughput=throughput, goodput=goodput, goodput_base=base,
            batch_size=report.batch_size, local_bsz=report.local_bsz, accum_steps=report.accum_steps,
            noise_scale=noise, progress=report.progress, step=report.step, replicas=report.num_replicas,
            metric=report.metric,
        )

    def _complete(self, job: _Tracked, report, now: float) -> None:
        self._account(job, now)
        self._release_cpus(job)
        verify_s = now - job.target_t if math.isfinite(job.target_t) else None
        self._emit(
            "complete", now, job.wl.id, verified=True, value=report.final_metric, metric=report.metric_name,
            target=report.target, progress=report.progress, step=report.step,
            model=goodput_model_to_json(_final_model(report)), startup_s=job.startup_s, verify_s=verify_s,
            cpu_seconds=job.service,
        )
        job.placement, job.finished = {}, True
        self._wake = True

    # ------------------------------------------------------------- Backend API
    def views(self) -> list[JobView]:
        self._poll()
        now = self.now()
        fallback = float(np.median(self._measured_delays)) if self._measured_delays else DEFAULT_RESTART_DELAY_S
        out = []
        for job in self.jobs.values():
            if not job.submitted or job.finished or job.handle is None:
                continue
            state = _VIEW_STATE.get(job.state, "pending")
            if state is None or state in ("completed", "failed") or job.report is None:
                continue
            if state == "running" and not job.placement:
                state = "pending"  # stopping: holds nothing the policy may keep
            report = job.report
            delays = list(report.rescale_times) or list(report.start_times)
            delay = float(np.median(delays)) if delays else fallback
            self._account(job, now)
            out.append(JobView(
                job_id=job.wl.id, submit_time=job.submit_t, state=state,
                placement=dict(job.placement) if state == "running" else {},
                restarts=job.restarts, age=max(now - job.submit_t, 0.0),
                min_replicas=min(job.wl.min_replicas, self._max_replicas(job)),
                max_replicas=self._max_replicas(job), submitted_replicas=job.wl.replicas,
                submitted_batch_size=job.wl.batch_size, goodput_model=_model_of(report),
                restart_delay=delay, progress=float(report.progress), attained_service=job.service,
                max_profiled_replicas=_max_profiled(report),
            ))
        return out

    def apply(self, decision: Decision) -> None:
        now = self.now()
        moves = []
        for job in self.jobs.values():
            if not job.submitted or job.finished or job.handle is None or _VIEW_STATE.get(job.state) is None:
                continue
            target = _clean(decision.placement.get(job.wl.id))
            if target == job.placement:
                continue
            for nid in target:
                if nid not in self._node_cpus:
                    raise InvalidProblem(f"decision places job {job.wl.id!r} on unknown node {nid!r}")
            moves.append((job, target))
        for job, target in moves:  # release first, so that growing jobs find the CPUs free
            self._shrink_cpus(job, target)
        for job, target in moves:
            old = job.placement
            cpus = self._grow_cpus(job, target)
            self._account(job, now)
            try:
                if not target:
                    job.handle.stop()
                elif not job.started:
                    job.handle.start(target, cpus=cpus)
                else:
                    job.handle.rescale(target, cpus=cpus)
            except InvalidProblem as exc:
                # The job finished (or failed) since the views were read; the next poll records it.
                log.warning("job %s: could not apply %s: %s", job.wl.id, target, exc)
                self._release_cpus(job)
                continue
            if not job.started:
                job.started = True
                self._emit("start", now, job.wl.id, placement=target, cpus=cpus)
            else:
                job.restarts += 1 if target else 0
                self._emit("rescale_begin", now, job.wl.id, old_placement=old, placement=target, cpus=cpus)
            job.placement, job.change_t = target, now
            job.report_t = math.nan

    def advance(self, seconds: float) -> None:
        deadline = self._clock() + seconds
        self._wake = False
        while True:
            t0 = time.perf_counter()
            self._poll(full=False)
            self.poll_seconds += time.perf_counter() - t0
            left = deadline - self._clock()
            if self._wake or left <= 0 or self.finished():
                return
            self._sleep(min(self.poll_s, left))

    def finished(self) -> bool:
        return all(j.submitted and j.finished for j in self.jobs.values())

    def close(self, *, graceful: bool = True, timeout: float = STOP_GRACE_S) -> None:
        """Stop unfinished jobs (checkpointing them if ``graceful``) and end all workers."""
        handles = [j.handle for j in self.jobs.values() if j.handle is not None and not j.finished]
        if graceful:
            for h in handles:
                try:
                    h.stop()
                except InvalidProblem:
                    pass
            deadline = time.monotonic() + timeout
            for h in handles:
                try:
                    h.wait(timeout=max(deadline - time.monotonic(), 0.1))
                except (TimeoutError, RuntimeError):
                    pass
        for j in self.jobs.values():
            if j.handle is not None:
                j.handle.close()
        if self._own_pool and self.pool is not None:
            self.pool.close()

    # ---------------------------------------------------------------- CPU pinning
    def _release_cpus(self, job: _Tracked) -> None:
        for cpu in [c for c, owner in self._cpu_owner.items() if owner == job.wl.id]:
            del self._cpu_owner[cpu]
        job.cpus = None

    def _owned(self, job: _Tracked, nid: str) -> list[int]:
        return [c for c in self._node_cpus[nid] if self._cpu_owner.get(c) == job.wl.id]

    def _shrink_cpus(self, job: _Tracked, target: dict[str, int]) -> None:
        if not self._pin:
            return
        for nid in self._node_cpus:
            owned = self._owned(job, nid)
            for cpu in owned[target.get(nid, 0):]:
                del self._cpu_owner[cpu]

    def _grow_cpus(self, job: _Tracked, target: dict[str, int]) -> list[int] | None:
        if not self._pin or not target:
            return None
        cpus: list[int] = []
        for nid, k in target.items():
            owned = self._owned(job, nid)
            free = [c for c in self._node_cpus[nid] if c not in self._cpu_owner]
            take = owned + free[: max(k - len(owned), 0)]
            if len(take) < k:  # over-committed node (a job still holding CPUs it was told to free)
                return None
            for cpu in take:
                self._cpu_owner[cpu] = job.wl.id
            cpus.extend(take[:k])
        job.cpus = tuple(cpus)
        return cpus


def _make_options(kwargs: Mapping[str, Any]):
    _, _, _, RuntimeOptions = _runtime()
    try:
        return RuntimeOptions(**kwargs)
    except TypeError as exc:
        raise InvalidProblem(f"unknown runtime option in {sorted(kwargs)}: {exc}") from exc


def _max_profiled(report) -> int:
    """Most replicas the job's measurements cover (0 before any)."""
    k = report.measurements.num_replicas
    return int(k.max()) if len(k) else 0


def _final_model(report):
    """The job's goodput model for its ``complete`` event: the runtime's, else one
    fitted here to its measurements (a short job may finish before the runtime's
    first periodic fit), with neutral gradient statistics if none were measured."""
    model = _model_of(report)
    if model is not None or len(report.measurements) == 0:
        return model
    from pollux_opt.model.goodput import GoodputModel, GradientStats

    try:
        params = report.measurements.fit()
    except (InvalidProblem, ValueError, FloatingPointError):
        return None
    stats = report.grad_stats or GradientStats(1.0, 0.0, report.limits.init_batch_size)
    return GoodputModel(params, stats, report.limits)


def _model_of(report):
    try:
        return report.goodput_model()
    except (InvalidProblem, ValueError):
        return None


# ------------------------------------------------------------------ the run
def load_run_config(run_dir: str | os.PathLike) -> dict:
    """The ``config.json`` of a run directory."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise InvalidProblem(f"run directory {str(run_dir)!r} has no {CONFIG_FILE}")
    return json.loads(path.read_text())


def cluster_to_json(cluster: Cluster) -> list[dict]:
    return [{"id": n.id, "cpus": n.cpus} for n in cluster.nodes]


def cluster_from_json(data: list[dict]) -> Cluster:
    try:
        return Cluster(tuple(Node(str(n["id"]), n["cpus"]) for n in data))
    except (KeyError, TypeError) as exc:
        raise InvalidProblem(f"bad cluster in run config: {data!r}") from exc


def run_real(
    run_dir: str | os.PathLike,
    workload: Workload | None = None,
    policy: str | None = None,
    *,
    cluster: Cluster | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    pin_cpus: bool = True,
    runtime_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    backend_kwargs: Mapping[str, Any] | None = None,
) -> dict:
    """Run (or resume) one policy on one workload of real jobs; return the summary.

    A new run needs ``workload`` and ``policy``; if ``run_dir`` already holds a
    ``config.json`` the run resumes with that configuration (``workload`` and
    ``policy``, if given, must match it).  Writes ``summary.json`` at the end.

    Args:
        run_dir: the run directory (created).
        workload: the jobs and arrivals (new runs).
        policy: a name in :data:`pollux_opt.scheduling.policies.adaptive.POLICIES` (new runs).
        cluster: nodes and CPUs (default: this machine, one node).
        interval: seconds between scheduling rounds (default 30 s).
        pin_cpus: pin replicas to CPUs (see :class:`RealBackend`).
        runtime_options: extra RuntimeOptions fields for every job.
        progress: show a live table (rich) while running.
        backend_kwargs: extra keyword arguments of :class:`RealBackend` (tests).
    """
    from pollux_opt.records.metrics import summarize
    from pollux_opt.scheduling.policies.adaptive import make_policy
    from pollux_opt.scheduling.loop import run

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / CONFIG_FILE
    resumed = cfg_path.exists()
    if resumed:
        cfg = load_run_config(run_dir)
        if policy is not None and policy != cfg["policy"]:
            raise InvalidProblem(f"run directory {str(run_dir)!r} holds a {cfg['policy']!r} run, not {policy!r}")
        if workload is not None and workload.to_json() != cfg["workload"]:
            raise InvalidProblem(f"run directory {str(run_dir)!r} holds a different workload "
                                 f"({cfg['workload']['name']!r}); use another directory")
    else:
        if workload is None or policy is None:
            raise InvalidProblem(f"run directory {str(run_dir)!r} is new: give a workload and a policy")
        make_policy(policy)  # validates the name
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not (
            math.isfinite(interval) and interval > 0
        ):
            raise InvalidProblem(f"interval must be a finite number of seconds > 0, got {interval!r}")
        cluster = cluster or default_cluster()
        cfg = {
            "version": 1, "policy": policy, "workload": workload.to_json(),
            "cluster": cluster_to_json(cluster), "interval_s": float(interval), "pin_cpus": bool(pin_cpus),
            "runtime_options": dict(runtime_options or {}), "started_unix": time.time(),
        }
        _atomic_write_json(cfg_path, cfg)
    workload = Workload.from_json(cfg["workload"])
    cluster = cluster_from_json(cfg["cluster"])
    pol = make_policy(cfg["policy"])
    events = EventLog(run_dir / EVENTS_FILE)
    backend = None
    try:
        t_start = time.time() - cfg["started_unix"]
        events.emit("run_start", t_start, None, policy=pol.name, resumed=resumed, workload=workload.name,
                    cluster_cpus=cluster.total_cpus, node_cpus=max(n.cpus for n in cluster.nodes),
                    cluster=cfg["cluster"], interval_s=cfg["interval_s"])
        backend = RealBackend(
            run_dir, workload, cluster, events, adapts_batch=pol.adapts_batch,
            started_unix=cfg["started_unix"], pin_cpus=cfg["pin_cpus"],
            runtime_options=cfg["runtime_options"], **dict(backend_kwargs or {}),
        )
        display = ConsoleProgress(pol.name, workload, cluster) if progress else None
        if display is not None:
            display.done_fn = lambda: sum(j.finished for j in backend.jobs.values())
        try:
            if display is not None:
                display.__enter__()
            run(backend, pol, cluster, events, interval=cfg["interval_s"],
                progress=display.update if display else None)
        finally:
            if display is not None:
                display.__exit__(None, None, None)
    finally:
        if backend is not None:
            backend.close(graceful=not backend.finished())
        events.close()
    summary = summarize(read_events(run_dir / EVENTS_FILE))
    summary["workload"] = workload.name
    _atomic_write_json(run_dir / SUMMARY_FILE, summary)
    return summary


class ConsoleProgress:
    """Live progress table (rich): jobs done, elapsed time and current allocation.

    Used as the ``progress`` callback of :func:`pollux_opt.scheduling.loop.run`;
    refreshed once per round (no refresh thread, so it costs no CPU between rounds).
    """

    def __init__(self, policy: str, workload: Workload, cluster: Cluster) -> None:
        from rich.console import Console

        self.policy, self.workload, self.cluster = policy, workload, cluster
        self.console = Console(stderr=True)
        self._live = None
        #: returns the number of finished jobs (set by run_real to the backend's count)
        self.done_fn: Callable[[], int] | None = None

    def __enter__(self) -> "ConsoleProgress":
        from rich.live import Live

        if self.console.is_terminal:
            self._live = Live(console=self.console, auto_refresh=False, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def update(self, now: float, views, decision: Decision) -> None:
        from rich.table import Table

        total = len(self.workload.jobs)
        done = self.done_fn() if self.done_fn is not None else 0
        table = Table(title=f"{self.policy} on {self.workload.name}: {done}/{total} jobs done, "
                            f"t = {now:.0f} s, {self.cluster.total_cpus} CPUs", title_justify="left")
        for col in ("job", "state", "CPUs", "batch", "progress", "restarts"):
            table.add_column(col)
        for v in views:
            p = decision.placement.get(v.job_id, {})
            b = decision.batch.get(v.job_id)
            table.add_row(v.job_id, v.state, str(sum(p.values())), str(b.batch_size) if b else "-",
                          f"{v.progress:.0f}", str(v.restarts))
        if self._live is not None:
            self._live.update(table, refresh=True)
        else:
            alloc = ", ".join(f"{v.job_id}:{sum(decision.placement.get(v.job_id, {}).values())}" for v in views)
            self.console.print(f"[{self.policy}] t={now:.0f}s done {done}/{total} alloc {alloc}")


#: Round interval of ``demo --quick`` (seconds): jobs of the quick sets train for
#: 20-90 s, so a 30 s round would leave a job's first fitted model unused for
#: most of its life; 10 s keeps the scheduler's overhead (about 0.05 s a round
#: on this machine) well under 2 % of the interval.
QUICK_INTERVAL_S = 10.0
#: Policies of the demo, in the order they run.
DEMO_POLICIES = ("fixed", "dynamic", "pollux")


def run_demo(
    out_dir: str | os.PathLike,
    workload: str = "mixed",
    *,
    quick: bool = False,
    interval: float | None = None,
    policies: tuple[str, ...] = DEMO_POLICIES,
    cluster: Cluster | None = None,
    progress: bool = True,
) -> dict[str, dict]:
    """Run ``workload`` under each policy one after another into ``out_dir/<policy>``,
    then write ``out_dir/comparison.json`` and the plots; return policy -> summary.

    A policy whose run directory already exists is resumed (a finished one
    just has its summary recomputed).  ``interval`` defaults to
    :data:`QUICK_INTERVAL_S` with ``quick``, else :data:`DEFAULT_INTERVAL_S`.
    """
    from pollux_opt.records.plots import plot_all
    from pollux_opt.workloads.sets import load_workload

    wl = load_workload(workload, quick=quick)
    interval = interval if interval is not None else (QUICK_INTERVAL_S if quick else DEFAULT_INTERVAL_S)
    out = Path(out_dir)
    summaries: dict[str, dict] = {}
    for name in policies:
        run_dir = out / name
        existing = (run_dir / CONFIG_FILE).exists()
        summaries[name] = run_real(
            run_dir, None if existing else wl, None if existing else name,
            cluster=cluster, interval=interval, progress=progress,
        )
    runs = {name: read_events(out / name / EVENTS_FILE) for name in policies}
    plot_all(runs, summaries, out)
    _atomic_write_json(out / "comparison.json", summaries)
    return summaries
