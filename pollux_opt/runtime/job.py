"""The non-blocking handle a scheduler holds per job: :class:`ElasticJob`.

Every method returns at once: it checks its arguments, queues a command for
the job's supervisor thread, which applies it at the next turn through the
job's :class:`~pollux_opt.runtime.controller.JobController`, or reads a
snapshot of the job's state.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from solvers import InvalidProblem

from pollux_opt.lifecycle import JobState
from pollux_opt.model.domains import Text, check
from pollux_opt.runtime.allocation import parse_allocation
from pollux_opt.runtime.controller import JobController
from pollux_opt.extras import TORCH_MISSING, check_installed
from pollux_opt.runtime.pool import WorkerPool
from pollux_opt.runtime.report import JobReport, RuntimeOptions
from pollux_opt.runtime.spec import JobSpec, check_declared_builder, workdir_path
from pollux_opt.runtime.status import JOB_FILE, read_job, step_log, write_job

__all__ = ["WAIT_POLL_S", "ElasticJob"]

logger = logging.getLogger("pollux_opt.runtime")

#: A job's id (its work directory's name by default).
_JOB_ID = Text()

#: Longest pause, seconds, between two checks of :meth:`ElasticJob.wait`; it
#: also checks at once after each worker report, state change, event and
#: handled command.  Checking every supervisor tick (20 ms) instead kept the
#: caller's process at 6.5 % of a core while profiling digits-cnn, which on a
#: 2-core machine is taken from the workers (see the README's held-out MAPE
#: figures); a fixed 0.1 s pause cost 3.7 % (2.7 % once a report reused its
#: measurements), but saw a step up to 0.1 s after it was reported.
WAIT_POLL_S = 0.1


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
            from pollux_opt.runtime.entry import get_job

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
        self.job_id: str = self._claim_workdir(spec, options, job_id)
        self.spec = spec
        self.options = options
        self.limits = spec.limits()
        self._closed = False
        self._own_pool = pool is None
        self._commands: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._ctl = JobController(self.job_id, spec, self.workdir, options, pool)
        self._status = self._ctl.status
        if self._ctl.resume_check is not None:
            self._queue(self._ctl.resume_verification)  # at once, without a scheduler's command

    def _claim_workdir(self, spec: JobSpec, options: RuntimeOptions, job_id: str | None) -> str:
        """The job id, after checking a job already in the work directory is this
        one (or recording this job there)."""
        saved = read_job(self.workdir)
        if saved is None:
            job_id = self.workdir.name if job_id is None else job_id
            check("job_id", job_id, _JOB_ID)
            write_job(self.workdir, job_id, spec.to_json(), options)
            return job_id
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
        return saved["job_id"]

    @classmethod
    def from_workdir(cls, workdir: str | os.PathLike, *, pool: WorkerPool | None = None) -> "ElasticJob":
        """Re-open the job stored in ``workdir`` (after a scheduler restart).

        Its state is restored from disk: an ended job stays so; a job that
        held workers is ``queued`` and resumes from its newest good checkpoint
        on :meth:`start`; a job whose newest checkpoint is an unchecked final
        one (it reached its target) is ``running`` and verifies that checkpoint
        at once, holding no CPUs, without training further.  The builder that ``job.json`` names must be
        from a declared module (the trust model of :mod:`pollux_opt.runtime.spec`).
        """
        path = workdir_path(workdir)
        saved = read_job(path)
        if saved is None:
            raise InvalidProblem(f"workdir {str(path)!r} holds no job (no {JOB_FILE})")
        spec = JobSpec.from_json(saved["spec"])
        check_declared_builder(spec.builder, where=f"{JOB_FILE} in {str(path)!r}")
        return cls(spec, path, job_id=saved["job_id"], options=RuntimeOptions(**saved["options"]), pool=pool)

    # ====================================================================== API
    def start(
        self,
        replicas: int | Mapping[Any, int] = 1,
        num_nodes: int | None = None,
        *,
        cpus: Sequence[int] | None = None,
        local_bsz: int | None = None,
        accum_steps: int | None = None,
        node_types: Mapping[str, str] | None = None,
        cgroups: Mapping[str, str] | None = None,
        gpus: Sequence[int | None] | None = None,
    ) -> None:
        """Start (or resume from the newest good checkpoint) on an allocation.

        Args:
            replicas: number of replicas K, or a placement ``{node: replicas}``.
            num_nodes: nodes the K replicas span (default 1; omit with a placement).
            cpus: optional CPU ids, one per replica (rank order), to pin workers to.
            local_bsz, accum_steps: pin the batch configuration: the job runs
                exactly this, with no adaptation, until the next start/rescale
                without them (a user's choice, e.g. to profile it; otherwise
                the job picks its own for each allocation).
            node_types: ``{node: node type}`` of the placement's nodes on a
                cluster of several types (the job's measurements go to the
                type it runs on); None on an untyped cluster.
            cgroups: ``{node: cgroup directory}`` each replica moves itself
                into (a throttled node's CPU quota); None: no cgroups.
            gpus: the GPU of each replica (rank order; None for one on CPU
                cores), as torch numbers this machine's GPUs; None: CPU cores only.

        Returns at once; the job is ``rescaling`` until its workers train.
        Raises InvalidProblem for a bad allocation or a finished job.
        """
        alloc = parse_allocation(self.limits, self.options.fixed_batch_size, replicas, num_nodes, cpus,
                                 local_bsz, accum_steps, node_types, cgroups, gpus)
        self._check_open()
        check_installed("torch", TORCH_MISSING)  # a launch needs torch
        self._queue(self._ctl.request_alloc, alloc, time.monotonic())  # its rescale time counts from now

    def rescale(
        self,
        replicas: int | Mapping[Any, int],
        num_nodes: int | None = None,
        *,
        cpus: Sequence[int] | None = None,
        local_bsz: int | None = None,
        accum_steps: int | None = None,
        node_types: Mapping[str, str] | None = None,
        cgroups: Mapping[str, str] | None = None,
        gpus: Sequence[int | None] | None = None,
    ) -> None:
        """Move the job to a new allocation (arguments as in :meth:`start`).

        The job finishes its current step, checkpoints, re-forms its workers
        (reusing warm ones) and resumes; the time from this call until all new
        workers resume is recorded as a rescale time (``report().rescale_times``).
        A ``queued`` job is started.  Only the batch pin
        changing (same placement and CPUs) applies at the next step, without a
        restart, also while the job is still starting.
        """
        self.start(replicas, num_nodes, cpus=cpus, local_bsz=local_bsz, accum_steps=accum_steps,
                   node_types=node_types, cgroups=cgroups, gpus=gpus)

    def stop(self) -> None:
        """Checkpoint and release all workers (state ``queued``; resume with start)."""
        self._check_open()
        self._queue(self._ctl.request_stop, False)

    def cancel(self) -> None:
        """Checkpoint and release all workers like :meth:`stop`, then end the job
        (state ``cancelled``; a job verifying its final checkpoint may still
        succeed first).  A start or rescale meanwhile is ignored; once the job
        has ended, every command raises InvalidProblem."""
        self._check_open()
        self._queue(self._ctl.request_stop, True)

    def report(self) -> JobReport:
        """A consistent snapshot of the job (never blocks on the workers)."""
        return self._status.report()

    def poll(self) -> JobState:
        """The job's current state (cheap)."""
        with self._status.lock:
            return self._status.lifecycle.state

    def wait(self, timeout: float | None = None, until: Callable[[JobReport], bool] | None = None) -> JobReport:
        """Block until ``until(report)`` holds (default: the job settles: it has
        ended, or is ``queued`` with no command pending) and return that report.

        Raises TimeoutError after ``timeout`` seconds, and RuntimeError if the
        job settles without ``until`` holding.
        """
        status = self._status
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with status.lock:
                idle = status.handled == status.submitted
            report = self.report()
            # An ended job drops its pending commands (one queued as it ended is never handled).
            settled = report.state.terminal or (idle and report.state is JobState.QUEUED)
            if until(report) if until is not None else settled:
                return report
            if settled:
                raise RuntimeError(
                    f"job {self.job_id!r} is {report.state.value} at step {report.step} and the awaited "
                    f"condition does not hold" + (f": {report.error}" if report.error else "")
                )
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {self.job_id!r} still {report.state.value} at step {report.step} after {timeout} s"
                )
            with status.lock:
                status.changed.wait(WAIT_POLL_S)

    def close(self) -> None:
        """End the supervisor and any workers now (no checkpoint: call stop()
        and wait first for a graceful end) and close a private pool."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self._commands.put(None)
            self._thread.join()
        else:
            self._shutdown()

    def step_log(self):
        """Per-step measurements of rank 0 as a pandas DataFrame (see
        :data:`~pollux_opt.runtime.status.STEP_COLUMNS`)."""
        return step_log(self.workdir)

    def __enter__(self) -> "ElasticJob":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ElasticJob({self.job_id!r}, kind={self.spec.name!r}, state={self.poll().value!r})"

    # ============================================================ API helpers
    def _check_open(self) -> None:
        """Raise InvalidProblem where the job takes no more commands (closed, or ended)."""
        if self._closed:
            raise InvalidProblem(f"job {self.job_id!r} is closed")
        state = self.poll()
        if state.terminal:
            raise InvalidProblem(f"job {self.job_id!r} has ended ({state.value}); it takes no more commands")

    # ======================================================= supervisor thread
    def _queue(self, request: Callable, *args: Any) -> None:
        """Have the supervisor thread call ``request(*args)`` (starting the thread)."""
        with self._status.lock:
            self._status.submitted += 1
        self._commands.put((request, args))
        if self._thread is None:
            if self._ctl.pool is None:
                self._ctl.pool = WorkerPool(spares=1)
            self._thread = threading.Thread(target=self._supervise, name=f"pollux-job-{self.job_id}", daemon=True)
            self._thread.start()

    def _supervise(self) -> None:
        """The job's supervisor thread: each turn, the queued commands, then a
        :meth:`JobController.tick`, until the job has ended or is closed."""
        try:
            while self._handle_commands() and self._ctl.tick():
                pass
        except Exception as exc:  # noqa: BLE001 - a controller bug must not hang the scheduler
            logger.exception("supervisor of job %s crashed", self.job_id)
            if not self.poll().terminal:
                self._ctl.fail(f"controller error: {type(exc).__name__}: {exc}")
        finally:
            self._shutdown()

    def _handle_commands(self) -> bool:
        """Apply the queued commands (ignored once the job has ended); False on close."""
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
            if command is None:
                return False
            try:
                if not self.poll().terminal:
                    request, args = command
                    request(*args)
            finally:
                with self._status.lock:
                    self._status.handled += 1
                    self._status.changed.notify_all()

    def _shutdown(self) -> None:
        self._ctl.shutdown()
        if self._own_pool and self._ctl.pool is not None:
            self._ctl.pool.close()
