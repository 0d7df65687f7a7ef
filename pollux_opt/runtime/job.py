"""The non-blocking handle a scheduler holds per job: :class:`ElasticJob`.

Every method returns at once.  A supervisor thread per job watches the worker
processes (their pipes and their process sentinels), applies commands at step
boundaries, re-fits the throughput model, records events and persists the
job's state, so a job keeps adapting while the scheduler thread is busy.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, fields
from multiprocessing.connection import wait as wait_connections
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.records.events import jsonable
from pollux_opt.model.goodput import GradientStats, ThroughputParams
from pollux_opt.runtime.adapt import (
    BatchConfig,
    check_allocation,
    choose_batch,
    fit_params,
    params_from_dict,
    params_to_dict,
)
from pollux_opt.runtime.checkpoint import CheckpointInfo, atomic_write_json, checkpoint_dir, latest_good
from pollux_opt.runtime.pool import WorkerHandle, WorkerPool
from pollux_opt.runtime.report import Event, JobReport, JobState, Measurements, RuntimeOptions, normalize_placement
from pollux_opt.runtime.spec import JobSpec, workdir_path
from pollux_opt.runtime.lazy_torch import check_torch
from pollux_opt.runtime.verify import VERIFICATION_FILE, verify_process
from pollux_opt.runtime.worker import Assignment

__all__ = ["ElasticJob"]

logger = logging.getLogger("pollux_opt.runtime")

#: Seconds the supervisor thread waits for worker messages per loop turn (the
#: latency of reacting to commands and faults; small against a rescale budget of 1 s).
SUPERVISOR_TICK_S = 0.02

#: Longest pause, seconds, between two checks of :meth:`ElasticJob.wait`; it
#: also checks at once after each worker report, state change, event and
#: handled command.  Checking every supervisor tick (20 ms) instead kept the
#: caller's process at 6.5 % of a core while profiling digits-cnn, which on a
#: 2-core machine is taken from the workers (issue 4: see the README's
#: held-out MAPE figures); a fixed 0.1 s pause, 3.7 % (2.7 % once a report
#: reused its measurements), but saw a step up to 0.1 s after it was reported.
WAIT_POLL_S = 0.1

#: Seconds to wait, after workers exited reporting only failed collectives, for
#: the cause (a dead peer or a job error) to show before restarting anyway.
FAULT_GRACE_S = 2.0

#: Verification failures (metric not reproduced in a fresh process) tolerated
#: before a job is failed instead of resumed.
MAX_VERIFICATION_FAILURES = 2

#: Columns of ``<workdir>/steps.csv``: one row per optimizer step on rank 0.
STEP_COLUMNS = (
    "generation", "step", "time", "num_replicas", "local_bsz", "accum_steps", "step_time",
    "compute_time", "sync_time", "loss", "grad_sqr_est", "grad_var_est", "gain", "lr_factor", "progress",
)

JOB_FILE = "job.json"
STATE_FILE = "state.json"
EVENTS_FILE = "events.jsonl"
STEPS_FILE = "steps.csv"


@dataclass(frozen=True)
class _Allocation:
    placement: Mapping[str, int]
    cpus: tuple[int, ...] | None
    pin: BatchConfig | None

    @property
    def num_replicas(self) -> int:
        return sum(self.placement.values())

    @property
    def num_nodes(self) -> int:
        return len(self.placement)


class ElasticJob:
    """One elastic data-parallel training job, driven without blocking.

    Args:
        spec: the job (a :class:`JobSpec` or the name of a registered one).
        workdir: directory holding everything of this job (created); if it
            already holds a job, that job is resumed (its spec and options must
            match, or be omitted via :meth:`from_workdir`).
        job_id: identifier for reports (default: the work directory's name).
        options: :class:`RuntimeOptions` (default options if None).
        pool: a :class:`WorkerPool` shared with other jobs; if None the job
            makes a private pool with one spare worker, closed by :meth:`close`.
    """

    def __init__(
        self,
        spec: JobSpec | str,
        workdir: str | os.PathLike,
        *,
        job_id: str | None = None,
        options: RuntimeOptions | None = None,
        pool: WorkerPool | None = None,
    ) -> None:
        if isinstance(spec, str):
            from pollux_opt.runtime.registry import get_job

            spec = get_job(spec)
        if not isinstance(spec, JobSpec):
            raise InvalidProblem(f"spec must be a JobSpec or a registered job name, got {spec!r}")
        options = RuntimeOptions() if options is None else options
        if not isinstance(options, RuntimeOptions):
            raise InvalidProblem(f"options must be a RuntimeOptions, got {options!r}")
        if pool is not None and not isinstance(pool, WorkerPool):
            raise InvalidProblem(f"pool must be a WorkerPool or None, got {pool!r}")
        self.workdir = workdir_path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        job_file = self.workdir / JOB_FILE
        if job_file.exists():
            saved = json.loads(job_file.read_text())
            if saved["spec"] != spec.to_json():
                raise InvalidProblem(
                    f"workdir {str(self.workdir)!r} holds job {saved['job_id']!r} with a different spec; "
                    "use ElasticJob.from_workdir to resume it, or another workdir"
                )
            if RuntimeOptions(**saved["options"]) != options:
                raise InvalidProblem(
                    f"workdir {str(self.workdir)!r} holds job {saved['job_id']!r} with options "
                    f"{saved['options']!r}, not {options!r}"
                )
            if job_id is not None and job_id != saved["job_id"]:
                raise InvalidProblem(f"job_id {job_id!r} differs from {saved['job_id']!r} stored in the workdir")
            job_id = saved["job_id"]
        else:
            job_id = self.workdir.name if job_id is None else job_id
            if not isinstance(job_id, str) or not job_id:
                raise InvalidProblem(f"job_id must be a non-empty string, got {job_id!r}")
            atomic_write_json(job_file, {
                "job_id": job_id, "spec": spec.to_json(), "options": jsonable(options.__dict__),
                "created": time.time(),
            })
        self.job_id: str = job_id
        self.spec = spec
        self.options = options
        self.limits = spec.limits()
        self._own_pool = pool is None
        self._pool = pool
        self._lock = threading.RLock()
        # Notified (lock held) whenever a report, state, event or handled command
        # changes what wait() checks, so a waiter checks then, not on a timer.
        self._changed = threading.Condition(self._lock)
        self._commands: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._submitted = 0  # commands put on the queue
        self._handled = 0  # commands the supervisor has taken off it

        # ---- state guarded by self._lock
        self._state = JobState.PENDING
        self._events: list[Event] = []
        self._error: str | None = None
        self._final_metric: float | None = None
        self._rescale_times: list[float] = []
        self._start_times: list[float] = []
        self._restarts = 0
        self._verification_failures = 0
        self._first_start: float | None = None
        self._step = 0
        self._progress = 0.0
        self._samples = 0
        self._metric: float | None = None
        self._stats: tuple[float, float] | None = None
        self._stats_steps = 0
        self._profile: dict = {}
        # (profile, its Measurements): the profile is replaced, never mutated, by
        # each worker report (5 a second); report() may be called many times between.
        self._profile_rows: tuple[dict, Measurements] | None = None
        self._params: ThroughputParams | None = None
        self._fitted_profile_size = -1
        self._alloc: _Allocation | None = None
        self._config: BatchConfig | None = None
        self._workers: list[WorkerHandle] = []
        self._worker_pids: tuple[int, ...] = ()
        self._train_size: int | None = None  # reported by the workers
        self._load_persisted()

        # ---- supervisor-thread-only state
        self._gen = 0
        self._phase = "idle"  # idle | launching | running | pausing
        self._pending: _Allocation | None = None
        self._pending_t0 = 0.0
        self._last_pause: dict | None = None
        self._collective_errors: dict[int, dict] = {}  # rank -> report of a failed collective
        self._fault_seen: float | None = None  # when only symptoms of a fault were first seen
        self._params_sent: ThroughputParams | None = None
        self._pause_reason: str | None = None  # rescale | stop
        self._transition: tuple[str, float] | None = None  # (kind, t0)
        self._resumed: dict[int, dict] = {}
        self._paused: dict[int, dict] = {}
        self._resume_from: CheckpointInfo | None = None
        self._verify_proc = None  # multiprocessing process of the completion check
        self._last_adapt = 0.0

    # ================================================================ construction
    @classmethod
    def from_workdir(cls, workdir: str | os.PathLike, *, pool: WorkerPool | None = None) -> "ElasticJob":
        """Re-open the job stored in ``workdir`` (after a scheduler restart).

        Its state is restored from disk: completed and failed jobs stay so;
        a job that was running is ``stopped`` and resumes from its newest good
        checkpoint on :meth:`start`.
        """
        path = workdir_path(workdir)
        job_file = path / JOB_FILE
        if not job_file.exists():
            raise InvalidProblem(f"workdir {str(path)!r} holds no job (no {JOB_FILE})")
        saved = json.loads(job_file.read_text())
        return cls(
            JobSpec.from_json(saved["spec"]), path, job_id=saved["job_id"],
            options=RuntimeOptions(**saved["options"]), pool=pool,
        )

    def _load_persisted(self) -> None:
        state_file = self.workdir / STATE_FILE
        if state_file.exists():
            try:
                saved = json.loads(state_file.read_text())
            except ValueError:
                logger.warning("%s is unreadable; starting from the checkpoints alone", state_file)
                saved = {}
            state = JobState(saved.get("state", "pending"))
            if state in (JobState.RUNNING, JobState.RESCALING, JobState.VERIFYING):
                state = JobState.STOPPED  # the previous controller went away mid-run
            self._state = state
            self._error = saved.get("error")
            self._final_metric = saved.get("final_metric")
            self._rescale_times = list(saved.get("rescale_times", []))
            self._start_times = list(saved.get("start_times", []))
            self._restarts = int(saved.get("num_restarts", 0))
            self._first_start = saved.get("first_start")
        events_file = self.workdir / EVENTS_FILE
        if events_file.exists():
            for line in events_file.read_text().splitlines():
                try:
                    data = json.loads(line)
                    self._events.append(Event(data["time"], data["kind"], data.get("details", {})))
                except (ValueError, KeyError):
                    continue  # a torn last line from a crash
        from pollux_opt.runtime.checkpoint import list_checkpoints

        infos = list_checkpoints(checkpoint_dir(self.workdir))
        if infos:
            self._absorb_meta(infos[0].meta)

    def _absorb_meta(self, meta: dict) -> None:
        self._step = int(meta.get("step", 0))
        self._progress = float(meta.get("progress", 0.0))
        self._samples = int(meta.get("samples", 0))
        self._metric = meta.get("metric")
        self._profile = meta.get("profile") or {}
        self._params = params_from_dict(meta.get("params"))
        stats = meta.get("stats")
        self._stats = None if stats is None else (float(stats[0]), float(stats[1]))
        self._stats_steps = int(meta.get("stats_steps", 0))
        config = meta.get("config")
        if config:
            self._config = BatchConfig(int(config[0]), int(config[1]))

    # ====================================================================== API
    def start(
        self,
        replicas: int | Mapping[Any, int] = 1,
        num_nodes: int | None = None,
        *,
        cpus: Sequence[int] | None = None,
        local_bsz: int | None = None,
        accum_steps: int | None = None,
    ) -> None:
        """Start (or resume from the newest good checkpoint) on an allocation.

        Args:
            replicas: number of replicas K, or a placement ``{node: replicas}``.
            num_nodes: nodes the K replicas span (default 1; omit with a placement).
            cpus: optional CPU ids, one per replica (rank order), to pin workers to.
            local_bsz, accum_steps: pin the batch configuration (no adaptation
                until the next start/rescale without them); for profiling and
                baseline policies.

        Returns at once; the job is ``rescaling`` until its workers train.
        Raises InvalidProblem for a bad allocation or a finished job.
        """
        self._submit("alloc", self._allocation(replicas, num_nodes, cpus, local_bsz, accum_steps))

    def rescale(
        self,
        replicas: int | Mapping[Any, int],
        num_nodes: int | None = None,
        *,
        cpus: Sequence[int] | None = None,
        local_bsz: int | None = None,
        accum_steps: int | None = None,
    ) -> None:
        """Move the job to a new allocation (arguments as in :meth:`start`).

        The job finishes its current step, checkpoints, re-forms its workers
        (reusing warm ones) and resumes; the time from this call until all new
        workers resume is recorded as a rescale time (``report().rescale_times``).
        A job that is stopped or pending is started.  Only the batch pin
        changing (same placement and CPUs) applies without a restart.
        """
        self._submit("alloc", self._allocation(replicas, num_nodes, cpus, local_bsz, accum_steps))

    def stop(self) -> None:
        """Checkpoint and release all workers (state ``stopped``; resume with start)."""
        self._submit("stop", None)

    def report(self) -> JobReport:
        """A consistent snapshot of the job (never blocks on the workers)."""
        with self._lock:
            stats = None
            if self._stats is not None and self._stats[0] > 0:
                stats = GradientStats(self._stats[0], max(self._stats[1], 0.0), self.spec.init_batch_size)
            alloc = self._alloc if self._state.holds_workers else None
            config = self._config or BatchConfig(0, 0)
            replicas = alloc.num_replicas if alloc else 0
            return JobReport(
                job_id=self.job_id, kind=self.spec.name, state=self._state, step=self._step,
                progress=self._progress, samples=self._samples,
                epoch=self._samples / self._train_size if self._train_size else math.nan,
                metric_name=self.spec.metric, target=self.spec.target,
                higher_is_better=self.spec.higher_is_better, metric=self._metric,
                final_metric=self._final_metric, placement=dict(alloc.placement) if alloc else {},
                num_replicas=replicas, num_nodes=alloc.num_nodes if alloc else 0,
                local_bsz=config.local_bsz, accum_steps=config.accum_steps,
                batch_size=config.batch_size(replicas) if replicas else 0,
                fixed_batch_size=self.options.fixed_batch_size,
                measurements=self._measurements(),
                throughput_params=self._params, grad_stats=stats, limits=self.limits,
                restart_delay=float(np.median(self._rescale_times)) if self._rescale_times else None,
                rescale_times=tuple(self._rescale_times), start_times=tuple(self._start_times),
                num_restarts=self._restarts,
                age=0.0 if self._first_start is None else time.time() - self._first_start,
                worker_pids=self._worker_pids if alloc else (), error=self._error, events=tuple(self._events),
            )

    def _measurements(self) -> Measurements:
        """The current profile as :class:`Measurements`, rebuilt only when a worker
        report has replaced the profile (read-only arrays: reports share them).
        Call with the lock held."""
        if self._profile_rows is None or self._profile_rows[0] is not self._profile:
            rows = Measurements.from_profile(self._profile)
            for f in fields(rows):
                getattr(rows, f.name).flags.writeable = False
            self._profile_rows = (self._profile, rows)
        return self._profile_rows[1]

    def poll(self) -> JobState:
        """The job's current state (cheap)."""
        with self._lock:
            return self._state

    def wait(self, timeout: float | None = None, until: Callable[[JobReport], bool] | None = None) -> JobReport:
        """Block until ``until(report)`` holds (default: the job is stopped,
        completed or failed) and return that report.

        Raises TimeoutError after ``timeout`` seconds, and RuntimeError if the
        job settles (stopped, completed or failed, with no command pending)
        without ``until`` holding.
        """
        settled = (JobState.STOPPED, JobState.COMPLETED, JobState.FAILED)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                idle = self._handled == self._submitted
            report = self.report()
            if (until(report) if until is not None else idle and report.state in settled):
                return report
            if idle and report.state in settled:
                raise RuntimeError(
                    f"job {self.job_id!r} is {report.state.value} at step {report.step} and the awaited "
                    f"condition does not hold" + (f": {report.error}" if report.error else "")
                )
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {self.job_id!r} still {report.state.value} at step {report.step} after {timeout} s"
                )
            with self._lock:
                self._changed.wait(WAIT_POLL_S)

    def close(self) -> None:
        """End the supervisor and any workers now (no checkpoint: call stop()
        and wait first for a graceful end) and close a private pool."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self._commands.put(("close", None, time.monotonic()))
            self._thread.join()
        else:
            self._shutdown()

    def step_log(self):
        """Per-step measurements of rank 0 as a pandas DataFrame (see STEP_COLUMNS)."""
        import pandas as pd

        path = self.workdir / STEPS_FILE
        if not path.exists():
            return pd.DataFrame(columns=list(STEP_COLUMNS))
        return pd.read_csv(path, on_bad_lines="skip")

    def __enter__(self) -> "ElasticJob":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ElasticJob({self.job_id!r}, kind={self.spec.name!r}, state={self.poll().value!r})"

    # ============================================================ API helpers
    def _allocation(self, replicas, num_nodes, cpus, local_bsz, accum_steps) -> _Allocation:
        placement = normalize_placement(replicas, num_nodes)
        k = sum(placement.values())
        if cpus is not None:
            cpus = tuple(cpus)
            if len(cpus) != k or any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 0 for c in cpus):
                raise InvalidProblem(f"cpus must list one CPU id >= 0 per replica ({k}), got {cpus!r}")
            cpus = tuple(int(c) for c in cpus)
        pin = None
        if local_bsz is not None or accum_steps is not None:
            m = self.limits.min_local_bsz if local_bsz is None else local_bsz
            s = 0 if accum_steps is None else accum_steps
            if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not (
                self.limits.min_local_bsz <= m <= self.limits.max_local_bsz
            ):
                raise InvalidProblem(
                    f"local_bsz must be an integer in [{self.limits.min_local_bsz}, "
                    f"{self.limits.max_local_bsz}], got {local_bsz!r}"
                )
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s <= self.limits.max_accum_steps:
                raise InvalidProblem(
                    f"accum_steps must be an integer in [0, {self.limits.max_accum_steps}], got {accum_steps!r}"
                )
            pin = BatchConfig(int(m), int(s))
        else:
            check_allocation(self.limits, len(placement), k, self.options.fixed_batch_size)
        return _Allocation(placement, cpus, pin)

    def _submit(self, kind: str, payload: Any) -> None:
        if self._closed:
            raise InvalidProblem(f"job {self.job_id!r} is closed")
        state = self.poll()
        if state.terminal:
            raise InvalidProblem(f"job {self.job_id!r} is {state.value}; it cannot be started or rescaled")
        if kind == "alloc":
            check_torch()
        with self._lock:
            self._submitted += 1
        self._commands.put((kind, payload, time.monotonic()))
        if self._thread is None:
            if self._pool is None:
                self._pool = WorkerPool(spares=1)
            self._thread = threading.Thread(target=self._supervise, name=f"pollux-job-{self.job_id}", daemon=True)
            self._thread.start()

    # ====================================================== supervisor thread
    def _supervise(self) -> None:
        try:
            while True:
                if not self._handle_commands():
                    break
                self._pump(SUPERVISOR_TICK_S)
                self._check_workers()
                self._check_verification()
                self._maybe_adapt()
                if self._state.terminal and self._phase == "idle" and self._verify_proc is None:
                    break  # nothing left to supervise; close() cleans up
        except Exception as exc:  # noqa: BLE001 - a controller bug must not hang the scheduler
            logger.exception("supervisor of job %s crashed", self.job_id)
            self._fail(f"controller error: {type(exc).__name__}: {exc}")
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        if workers and self._pool is not None:
            self._pool.discard(workers)
        if self._verify_proc is not None and self._verify_proc.is_alive():
            self._verify_proc.kill()
            self._verify_proc.join()
        if self._own_pool and self._pool is not None:
            self._pool.close()

    def _handle_commands(self) -> bool:
        while True:
            try:
                kind, payload, t0 = self._commands.get_nowait()
            except queue.Empty:
                return True
            if kind == "close":
                return False
            try:
                if self._state.terminal:
                    continue
                if kind == "alloc":
                    self._request_alloc(payload, t0)
                elif kind == "stop":
                    self._request_stop()
            finally:
                with self._lock:
                    self._handled += 1
                    self._changed.notify_all()

    # --------------------------------------------------------------- requests
    def _request_alloc(self, alloc: _Allocation, t0: float) -> None:
        state = self._state
        if state in (JobState.PENDING, JobState.STOPPED) and self._phase == "idle":
            self._launch(alloc, "start", t0)
        elif state is JobState.VERIFYING:
            self._pending, self._pending_t0 = alloc, t0  # used if the verification does not confirm the target
        elif self._phase == "running":
            current = self._alloc
            if current is not None and alloc.placement == current.placement and alloc.cpus == current.cpus:
                self._apply_pin(alloc)
                return
            self._pending, self._pending_t0 = alloc, t0
            self._pause("rescale", t0)
        elif self._phase == "launching" and alloc == self._alloc:
            self._pending = None  # asked for what is being launched: no follow-up
            self._pause_reason = None
        else:  # launching or pausing: the newest request wins once the transition ends
            if self._pending is None:
                self._pending_t0 = t0  # the rescale time counts from the oldest unserved request
            self._pending = alloc
            self._pause_reason = "rescale"

    def _request_stop(self) -> None:
        if self._phase == "running":
            self._pending = None
            self._pause("stop", time.monotonic())
        elif self._phase in ("launching", "pausing"):
            self._pending = None
            self._pause_reason = "stop"
        elif self._state is JobState.VERIFYING:
            self._pending = None
        elif self._state is JobState.PENDING:
            self._record("stopped", {"reason": "request", "step": self._step, "never_started": True})
            self._set_state(JobState.STOPPED)

    def _apply_pin(self, alloc: _Allocation) -> None:
        with self._lock:
            self._alloc = alloc
        if alloc.pin is not None and alloc.pin != self._config:
            self._send_batch(alloc.pin)

    def _pause(self, reason: str, t0: float) -> None:
        self._phase = "pausing"
        self._pause_reason = reason
        self._transition = (reason, t0)
        # Not cleared here: while running, ranks may already have paused on
        # their own (target or step limit) and will not report again; their
        # reports complete this pause.  _launch clears them for a new generation.
        with self._lock:
            self._state = JobState.RESCALING
        self._send(0, ("stop",))

    def _send(self, rank: int, msg: tuple) -> None:
        try:
            self._workers[rank].conn.send(msg)
        except (BrokenPipeError, OSError, IndexError):
            pass  # a dead worker: _check_workers handles it

    def _send_batch(self, config: BatchConfig) -> None:
        old = self._config
        with self._lock:
            self._config = config
        self._send(0, ("batch", config.local_bsz, config.accum_steps, params_to_dict(self._params)))
        self._params_sent = self._params
        self._record("batch_changed", {
            "from": None if old is None else [old.local_bsz, old.accum_steps],
            "to": [config.local_bsz, config.accum_steps], "step": self._step,
        })

    # ------------------------------------------------------------- launching
    def _launch(self, alloc: _Allocation, kind: str, t0: float) -> None:
        """Start a new generation of workers on ``alloc`` from the newest good checkpoint."""
        info = latest_good(checkpoint_dir(self.workdir), on_corrupt=self._on_corrupt)
        if info is not None:
            with self._lock:
                self._absorb_meta(info.meta)
        k, n = alloc.num_replicas, alloc.num_nodes
        if alloc.pin is not None:
            config = alloc.pin
        else:
            current = self._config if (self._alloc is not None and self._alloc.num_replicas == k) else None
            config = choose_batch(
                self.limits, n, k, params=self._params, stats=self._stats_obj(), stats_steps=self._stats_steps,
                fixed_batch_size=self.options.fixed_batch_size, current=current,
            )
        reuse = [w for w in self._workers if w.alive()][:k]
        surplus = [w for w in self._workers if w not in reuse]
        if surplus:
            self._pool.release(surplus)
        workers = reuse + (self._pool.acquire(k - len(reuse), job_key=self.job_id) if len(reuse) < k else [])
        self._gen += 1
        self._launch_wall = time.time()
        store = None
        if k > 1:
            rdzv = self.workdir / "rendezvous"
            rdzv.mkdir(exist_ok=True)
            store = rdzv / f"gen-{self._gen}"
            store.unlink(missing_ok=True)
        for rank, w in enumerate(workers):
            w.job_key = self.job_id
            a = Assignment(
                job_id=self.job_id, spec_json=self.spec.to_json(), workdir=str(self.workdir), generation=self._gen,
                rank=rank, world=k, num_nodes=n, store_path=None if store is None else str(store),
                checkpoint_meta=None if info is None else str(info.meta_path), local_bsz=config.local_bsz,
                accum_steps=config.accum_steps, options=self.options, params=params_to_dict(self._params),
                cpu=None if alloc.cpus is None else alloc.cpus[rank],
            )
            try:
                w.conn.send(("run", a))
            except (BrokenPipeError, OSError):
                pass  # noticed as a lost worker
        with self._lock:
            self._workers = workers
            self._worker_pids = tuple(w.pid for w in workers)
            self._alloc = alloc
            self._config = config
            self._state = JobState.RESCALING
            if self._first_start is None:
                self._first_start = time.time()
        self._phase = "launching"
        self._resumed = {}
        self._paused = {}
        self._collective_errors = {}
        self._fault_seen = None
        self._resume_from = info
        self._transition = (kind, t0)
        self._pause_reason = None
        self._persist()

    def _on_corrupt(self, info: CheckpointInfo) -> None:
        self._record("checkpoint_corrupt", {"step": info.step, "path": str(info.path)})

    def _stats_obj(self) -> GradientStats | None:
        if self._stats is None or not self._stats[0] > 0:
            return None
        return GradientStats(self._stats[0], max(self._stats[1], 0.0), self.spec.init_batch_size)

    # ------------------------------------------------------------- messages
    def _pump(self, timeout: float) -> None:
        conns = [w.conn for w in self._workers]
        if not conns:
            time.sleep(timeout)
            return
        for conn in wait_connections(conns, timeout=timeout):
            # Handling one worker's message can replace the worker set (a
            # fault restart, a rescale): skip connections no longer current.
            rank = next((i for i, w in enumerate(self._workers) if w.conn is conn), None)
            if rank is not None:
                self._drain(rank)

    def _drain(self, rank: int) -> None:
        if rank >= len(self._workers):
            return
        conn = self._workers[rank].conn
        try:
            while conn.poll():
                kind, info = conn.recv()
                self._on_message(rank, kind, info)
                if rank >= len(self._workers) or self._workers[rank].conn is not conn:
                    return  # the message changed the worker set
        except (EOFError, OSError):
            pass  # the process ended; _check_workers decides what that means

    def _on_message(self, rank: int, kind: str, info: dict) -> None:
        if info.get("generation") != self._gen:
            return  # hello, or a late message of an earlier generation
        if kind == "error":
            self._on_error(info)
        elif kind == "resumed":
            self._on_resumed(rank, info)
        elif kind == "metrics":
            self._on_metrics(info)
        elif kind == "checkpoint":
            pass  # recorded on disk; the newest good one is looked up when needed
        elif kind == "paused":
            self._on_paused(rank, info)

    def _on_resumed(self, rank: int, info: dict) -> None:
        self._resumed[rank] = info
        if len(self._resumed) < len(self._workers):
            return
        checksums = {r["checksum"] for r in self._resumed.values()}
        expected = None if self._resume_from is None else self._resume_from.meta.get("checksum")
        if len(checksums) != 1 or (expected is not None and checksums != {expected}):
            self._fail(f"workers resumed with inconsistent parameters: {sorted(checksums)} vs checkpoint {expected}")
            return
        kind, t0 = self._transition
        seconds = time.monotonic() - t0
        info0 = self._resumed[0]
        details = {
            "seconds": seconds, "step": info0["step"], "progress": info0["progress"], "checksum": info0["checksum"],
            "from_checkpoint": info0["from_checkpoint"], "placement": dict(self._alloc.placement),
            "num_replicas": self._alloc.num_replicas, "pids": list(self._worker_pids),
            "config": [self._config.local_bsz, self._config.accum_steps],
            # Where the time went, per rank: waiting for the worker to take the
            # assignment (busy or still starting), building, joining the group, loading.
            "queue_s": [self._resumed[r]["received"] - self._launch_wall for r in sorted(self._resumed)],
            "build_s": [self._resumed[r]["build_s"] for r in sorted(self._resumed)],
            "group_s": [self._resumed[r]["group_s"] for r in sorted(self._resumed)],
            "load_s": [self._resumed[r]["load_s"] for r in sorted(self._resumed)],
            "checkpoint_checksum": expected,
        }
        if kind == "rescale" and self._last_pause is not None:
            details["paused_step"] = self._last_pause["step"]
            details["paused_checksum"] = self._last_pause["checksum"]
        # The event is recorded before the state changes, so that whoever sees
        # the new state also sees the event explaining it.
        self._record({"rescale": "rescaled", "start": "started", "restart": "restarted"}[kind], details)
        with self._lock:
            self._state = JobState.RUNNING
            self._step, self._progress, self._samples = info0["step"], info0["progress"], info0["samples"]
            self._train_size = info0["train_size"]
            if kind == "rescale":
                self._rescale_times.append(seconds)
            elif kind == "start":
                self._start_times.append(seconds)
        self._phase = "running"
        # A warm spare with this job built makes the next scale-up cheap.
        self._pool.prepare(self.job_id, self.spec.to_json(), str(self.workdir))
        self._persist()
        if self._pause_reason == "stop":
            self._pause("stop", time.monotonic())
        elif self._pending is not None:
            self._pause("rescale", self._pending_t0)

    def _on_metrics(self, info: dict) -> None:
        with self._lock:
            self._step, self._progress, self._samples = info["step"], info["progress"], info["samples"]
            if info["metric"] is not None:
                self._metric = info["metric"]
            self._stats = None if info["stats"] is None else tuple(info["stats"])
            self._stats_steps = info["stats_steps"]
            self._profile = info["profile"]
            self._changed.notify_all()
        rows = info["rows"]
        if rows:
            path = self.workdir / STEPS_FILE
            new = not path.exists()
            with open(path, "a", newline="") as fh:
                writer = csv.writer(fh)
                if new:
                    writer.writerow(STEP_COLUMNS)
                writer.writerows(rows)

    def _on_paused(self, rank: int, info: dict) -> None:
        self._paused[rank] = info
        if len(self._paused) < len(self._workers):
            return
        info0 = self._paused[0]
        self._last_pause = info0
        checksums = {p["checksum"] for p in self._paused.values()}
        if len(checksums) != 1:
            self._fail(f"workers paused with inconsistent parameters: {sorted(checksums)}")
            return
        with self._lock:
            self._step, self._progress, self._samples = info0["step"], info0["progress"], info0["samples"]
            if info0["metric"] is not None:
                self._metric = info0["metric"]
        reason = info0["reason"]
        if reason == "target":
            self._release_all()
            self._record("target_reached", {"step": info0["step"], "metric": info0["metric"]})
            self._start_verification()
        elif reason == "step_limit":
            self._release_all()
            self._record("stopped", {"reason": "step_limit", "step": info0["step"], "checksum": info0["checksum"]})
            self._set_state(JobState.STOPPED)
        elif self._pause_reason == "rescale" and self._pending is not None:
            alloc, self._pending = self._pending, None
            self._launch(alloc, "rescale", self._pending_t0)
        else:
            self._release_all()
            self._record("stopped", {"reason": "request", "step": info0["step"], "checksum": info0["checksum"]})
            self._set_state(JobState.STOPPED)

    def _release_all(self) -> None:
        with self._lock:
            workers, self._workers = self._workers, []
        self._pool.release(workers)
        self._phase = "idle"
        self._transition = None

    def _set_state(self, state: JobState) -> None:
        with self._lock:
            self._state = state
            self._changed.notify_all()
        self._persist()

    # ---------------------------------------------------------------- faults
    def _on_error(self, info: dict) -> None:
        if info.get("collective"):
            # A symptom: a peer died or failed; _check_workers finds the cause.
            self._collective_errors[info["rank"]] = info
            return
        self._fail(f"rank {info['rank']}: {info['error']}", {"rank": info["rank"], "traceback": info["traceback"]})

    def _fail(self, error: str, details: dict | None = None) -> None:
        """End the job as failed: record why, then end its workers (never left blocked)."""
        self._record("failed", dict(details or {}, error=error))
        with self._lock:
            workers, self._workers = self._workers, []
            self._error = error
            self._state = JobState.FAILED
        if workers:
            self._pool.discard(workers)
        self._phase = "idle"
        self._persist()

    def _check_workers(self) -> None:
        if self._phase == "idle" or self._state.terminal:
            return
        if all(w.alive() for w in self._workers) and not self._collective_errors:
            return
        # Error reports (or the last "paused") may still be in the pipes;
        # handling them may end or replace the generation.
        for w in list(self._workers):
            if w in self._workers:
                self._drain(self._workers.index(w))
            if self._state.terminal or self._phase == "idle":
                return
        dead = [(rank, w) for rank, w in enumerate(self._workers) if not w.alive()]
        if not dead:
            return
        # The cause is a worker that died without reporting a failed collective;
        # peers that saw it fail are symptoms.  If only those have exited so
        # far, give the cause (a death or a job error) a moment to show.
        causes = [(rank, w) for rank, w in dead if rank not in self._collective_errors]
        if not causes:
            now = time.monotonic()
            if self._fault_seen is None:
                self._fault_seen = now
            if now - self._fault_seen < FAULT_GRACE_S:
                return
            causes = dead
        rank, w = causes[0]
        self._record("worker_lost", {
            "rank": rank, "pid": w.pid, "exitcode": w.process.exitcode, "step": self._step, "phase": self._phase,
            "peers_reporting_failed_collectives": sorted(self._collective_errors),
        })
        with self._lock:
            workers, self._workers = self._workers, []
            self._restarts += 1
            restarts = self._restarts
        self._pool.discard(workers)
        if restarts > self.options.max_restarts:
            self._fail(f"worker rank {rank} (pid {w.pid}) died with exit code {w.process.exitcode}; "
                       f"{restarts - 1} restarts already spent (max_restarts={self.options.max_restarts})")
            return
        if self._phase == "pausing" and self._pause_reason == "stop" and self._pending is None:
            self._phase = "idle"
            self._record("stopped", {"reason": "request", "step": self._step, "after_fault": True})
            self._set_state(JobState.STOPPED)
            return
        alloc = self._pending or self._alloc
        self._pending = None
        self._launch(alloc, "restart", time.monotonic())

    # ---------------------------------------------------------- verification
    def _start_verification(self) -> None:
        info = latest_good(checkpoint_dir(self.workdir), on_corrupt=self._on_corrupt)
        if info is None or not info.final:
            self._record("verification_failed", {"reason": "no final checkpoint"})
            self._after_failed_verification()
            return
        (self.workdir / VERIFICATION_FILE).unlink(missing_ok=True)
        log_dir = self.workdir / "logs"
        log_dir.mkdir(exist_ok=True)
        # A new process from the pool's fork server: torch already imported,
        # none of the training processes' memory (see _verify).
        self._verify_proc = self._pool.start_process(
            verify_process, (str(self.workdir), str(info.meta_path), str(log_dir / "verify.log")),
            name=f"pollux-verify-{self.job_id}",
        )
        self._set_state(JobState.VERIFYING)

    def _check_verification(self) -> None:
        proc = self._verify_proc
        if proc is None or proc.is_alive():
            return
        proc.join()
        self._verify_proc = None
        if proc.exitcode != 0:
            self._fail(f"verification process exited with status {proc.exitcode} (see logs/verify.log)")
            return
        record = json.loads((self.workdir / VERIFICATION_FILE).read_text())
        if record["reached"]:
            self._record("verified", record)
            with self._lock:
                self._final_metric = record["metric"]
                self._state = JobState.COMPLETED
            self._persist()
        else:
            self._record("verification_failed", record)
            self._after_failed_verification()

    def _after_failed_verification(self) -> None:
        self._verification_failures += 1
        if self._verification_failures >= MAX_VERIFICATION_FAILURES:
            self._fail("the final metric did not reach the target when re-evaluated in a fresh process")
            return
        alloc, self._pending = self._pending, None
        if alloc is None and self.options.resume_after_failed_verification:
            alloc = self._alloc
        if alloc is None:  # wait, holding nothing, for the scheduler's next allocation
            self._record("stopped", {"reason": "verification_failed", "step": self._step})
            self._set_state(JobState.STOPPED)
            return
        self._launch(alloc, "restart", time.monotonic())

    # ------------------------------------------------------------ adaptation
    def _maybe_adapt(self) -> None:
        if self._phase != "running":
            return
        now = time.monotonic()
        if now - self._last_adapt < self.options.adapt_interval_s:
            return
        self._last_adapt = now
        size = sum(int(v["count"]) for v in self._profile.values())
        if size != self._fitted_profile_size and self._profile:
            try:
                params = fit_params(self._profile)
            except (InvalidProblem, ValueError, FloatingPointError) as exc:
                logger.warning("throughput fit of job %s failed: %s", self.job_id, exc)
                params = None
            if params is not None:
                with self._lock:
                    self._params = params
                self._fitted_profile_size = size
        alloc = self._alloc
        if alloc is None or alloc.pin is not None:
            return
        new = choose_batch(
            self.limits, alloc.num_nodes, alloc.num_replicas, params=self._params, stats=self._stats_obj(),
            stats_steps=self._stats_steps, fixed_batch_size=self.options.fixed_batch_size, current=self._config,
        )
        if new != self._config:
            self._send_batch(new)
        elif self._params is not self._params_sent:
            # Refresh the fitted model rank 0 stores in its checkpoints.
            self._send(0, ("batch", new.local_bsz, new.accum_steps, params_to_dict(self._params)))
        self._params_sent = self._params

    # ----------------------------------------------------------- persistence
    def _record(self, kind: str, details: dict) -> None:
        event = Event(time.time(), kind, jsonable(details))
        with self._lock:
            self._events.append(event)
            self._changed.notify_all()
        logger.info("job %s: %s %s", self.job_id, kind, details)
        # One write per line, flushed and fsynced: a crash can tear only the
        # last line, which readers skip.
        with open(self.workdir / EVENTS_FILE, "a") as fh:
            fh.write(json.dumps({"time": event.time, "kind": kind, "details": event.details}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def _persist(self) -> None:
        with self._lock:
            data = {
                "job_id": self.job_id, "state": self._state.value, "error": self._error,
                "final_metric": self._final_metric, "rescale_times": self._rescale_times,
                "start_times": self._start_times, "num_restarts": self._restarts,
                "first_start": self._first_start, "step": self._step, "progress": self._progress,
                "placement": None if self._alloc is None else dict(self._alloc.placement),
                "params": params_to_dict(self._params), "time": time.time(),
            }
        atomic_write_json(self.workdir / STATE_FILE, jsonable(data))
