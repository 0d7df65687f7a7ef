"""The supervisor of one elastic job (:class:`JobController`): a thread that
watches the job's workers (their reports, through the pool, and their liveness),
applies the scheduler's commands at step boundaries, moves the job through its
states (:mod:`~pollux_opt.lifecycle`), re-fits its throughput model
(:class:`~pollux_opt.agent.agent.JobAgent`), records events and persists the
job's state, so that a job keeps adapting while the scheduler thread is busy.

The scheduler's handle, :class:`~pollux_opt.runtime.job.ElasticJob`, puts
commands on the queue (:meth:`JobController.submit`) and reads snapshots
(:meth:`JobController.report`); everything else happens in the thread.

**A reached target is never trained past.**  A final checkpoint (the one rank
0 writes when an evaluation reaches the target) that no fresh-process check
has rejected is verified, never resumed: a job re-opened with one (its
scheduler was killed while the job verified, or just before) starts verifying
it at once (``running``, holding no CPUs), and a launch that finds one (a
worker died between the final checkpoint and the pause) verifies it instead.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from pollux_opt.lifecycle import JobState
from pollux_opt.model import BatchConfig
from pollux_opt.records.events import jsonable
from pollux_opt.agent.agent import params_to_dict
from pollux_opt.agent.batch import choose_batch
from pollux_opt.runtime.allocation import FollowUp, WorkerAllocation
from pollux_opt.runtime.checkpoint import (
    CheckpointInfo, checkpoint_dir, latest_good, list_checkpoints, wait_for_writer,
)
from pollux_opt.runtime.intake import WorkerIntake
from pollux_opt.runtime.journal import JobJournal
from pollux_opt.runtime.pool import Worker, WorkerPool
from pollux_opt.runtime.recovery import FaultMonitor, VerificationRun
from pollux_opt.runtime.report import Event, JobReport, RuntimeOptions
from pollux_opt.runtime.spec import JobSpec
from pollux_opt.runtime.status import JobStatus
from pollux_opt.runtime.protocol import RUN, STOP, Assignment
from pollux_opt.runtime.worker import WRITER_WAIT_S

__all__ = ["SUPERVISOR_TICK_S", "JobController"]

logger = logging.getLogger("pollux_opt.runtime")

#: Seconds the supervisor thread waits for worker messages per loop turn (the
#: latency of reacting to commands and faults; small against a rescale budget of 1 s).
SUPERVISOR_TICK_S = 0.02


class JobController(WorkerIntake):
    """Supervises the workers of one job (see the module docstring; the
    handling of worker reports, faults and verification is in
    :class:`~pollux_opt.runtime.intake.WorkerIntake`).

    Args:
        job_id, spec, workdir, options: the job.
        pool: the shared :class:`WorkerPool`, or None for a private one with one
            spare worker (made when the thread starts, closed at shutdown).
    """

    def __init__(self, job_id: str, spec: JobSpec, workdir: Path, options: RuntimeOptions,
                 pool: WorkerPool | None) -> None:
        self.job_id, self.spec, self.workdir, self.options = job_id, spec, Path(workdir), options
        self.limits = spec.limits()
        self.journal = JobJournal(self.workdir)
        self.status = JobStatus(job_id, spec, options)
        self._own_pool = pool is None
        self._pool = pool
        self._commands: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        # ---- supervisor-thread-only state
        self._workers: list[Worker] = []  # the current generation, by rank
        self._gen = 0
        self._next: FollowUp | None = None  # what to do once the current transition ends
        # Within ``rescaling``: the old generation is pausing (True) or a new one forming (False).
        self._pausing = False
        self._launch_kind, self._launch_t0, self._launch_wall = "start", 0.0, 0.0
        self._resume_from: CheckpointInfo | None = None
        self._resumed: dict[int, dict] = {}
        self._paused: dict[int, dict] = {}
        self._last_pause: dict | None = None
        self._faults = FaultMonitor()
        self._verification = VerificationRun(self.workdir, job_id)
        self._verification_failures = 0
        self._params_sent = None
        self._last_adapt = 0.0
        self.status.restore(self.journal.read_state(), self.journal.read_events())
        infos = list_checkpoints(checkpoint_dir(self.workdir))
        if infos:
            self.status.absorb_meta(infos[0].meta)
        if infos and infos[0].final and not self.status.lifecycle.state.terminal:
            info = latest_good(checkpoint_dir(self.workdir), on_corrupt=self._on_corrupt)
            if self._awaits_verification(info):
                # The check resumes as soon as the thread runs.
                self._enter(JobState.RUNNING, "re-opened with an unchecked final checkpoint", verifying=True)
                self.status.absorb_meta(info.meta)
                self._queue("verify", info)

    # ============================================================ handle side
    def report(self) -> JobReport:
        with self.status.lock:
            return self.status.report()

    def state(self) -> JobState:
        with self.status.lock:
            return self.status.lifecycle.state

    def submit(self, kind: str, payload: Any) -> None:
        """Queue a command (``"alloc"`` with a :class:`WorkerAllocation`, ``"stop"``
        or ``"cancel"``) and start the thread if it is not running."""
        self._queue(kind, payload)

    def _queue(self, kind: str, payload: Any) -> None:
        with self.status.lock:
            self.status.submitted += 1
        self._commands.put((kind, payload, time.monotonic()))
        if self._thread is None:
            if self._pool is None:
                self._pool = WorkerPool(spares=1)
            self._thread = threading.Thread(target=self._supervise, name=f"pollux-job-{self.job_id}", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """End the thread and any workers now (no checkpoint)."""
        if self._thread is not None and self._thread.is_alive():
            self._commands.put(("close", None, time.monotonic()))
            self._thread.join()
        else:
            self._shutdown()

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
                if self.status.lifecycle.state.terminal and not self._verification.active:
                    break  # nothing left to supervise; close() cleans up
        except Exception as exc:  # noqa: BLE001 - a controller bug must not hang the scheduler
            logger.exception("supervisor of job %s crashed", self.job_id)
            if not self.status.lifecycle.state.terminal:
                self._fail(f"controller error: {type(exc).__name__}: {exc}")
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        with self.status.lock:
            workers, self._workers = self._workers, []
        if workers and self._pool is not None:
            self._pool.discard(workers)
        self._verification.kill()
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
                if self.status.lifecycle.state.terminal:
                    continue
                if kind == "alloc":
                    self._request_alloc(payload, t0)
                elif kind in ("stop", "cancel"):
                    self._request_stop(cancel=kind == "cancel")
                elif kind == "verify":
                    self._resume_verification(payload)
            finally:
                with self.status.lock:
                    self.status.handled += 1
                    self.status.changed.notify_all()

    def _enter(self, state: JobState, reason: str, *, verifying: bool = False) -> None:
        """Move to ``state``: the one place the state changes, checked against the table."""
        with self.status.lock:
            step = self.status.lifecycle.move(state, reason, verifying=verifying)
            self.status.changed.notify_all()
        logger.debug("job %s: %s -> %s (%s)", self.job_id, step.old.value, step.new.value, reason)

    # --------------------------------------------------------------- requests
    def _request_alloc(self, alloc: WorkerAllocation, t0: float) -> None:
        state, pending = self.status.lifecycle.state, self._next
        if pending is not None and pending.cancel:
            return  # a cancel is final
        if state is JobState.QUEUED:
            self._launch(alloc, "start", t0)
        elif self.status.lifecycle.verifying:
            self._next = FollowUp(alloc, t0)  # served if the verification does not confirm the target
        elif not self._pausing and alloc.same_workers(self.status.alloc):
            # The same workers: only the batch may change, at a step boundary, without a restart.
            self._next = None  # (while forming: asked for what is being launched)
            self._apply_pin(alloc)
        elif state is JobState.RUNNING:
            self._next = FollowUp(alloc, t0)
            self._pause()
        else:  # forming elsewhere, or pausing: the newest request wins once the transition ends
            # The rescale time counts from the oldest unserved request.
            self._next = FollowUp(alloc, t0 if pending is None or pending.stop else pending.t0)

    def _request_stop(self, cancel: bool) -> None:
        """Checkpoint and release the workers once the current transition ends;
        end the job ``cancelled`` when ``cancel``."""
        lifecycle, follow = self.status.lifecycle, FollowUp(None, time.monotonic(), cancel)
        if lifecycle.state is JobState.RUNNING and not lifecycle.verifying:
            self._next = follow
            self._pause()
        elif lifecycle.state.holds_workers:
            self._next = FollowUp(None, follow.t0, cancel or (self._next is not None and self._next.cancel))
        elif cancel or self.status.first_start is None:
            self._stopped(follow, {"reason": "request", "step": self.status.step,
                                   "never_started": self.status.first_start is None})

    def _stopped(self, follow: FollowUp | None, details: dict) -> None:
        """Record a stop (its event's ``details``) and hold no workers: ``queued``,
        or ``cancelled`` when ``follow`` cancels the job."""
        cancel = follow is not None and follow.cancel
        self._record("stopped", dict(details, cancel=True) if cancel else details)
        self._next = None
        if cancel or self.status.lifecycle.state is not JobState.QUEUED:
            self._enter(JobState.CANCELLED if cancel else JobState.QUEUED, f"stopped: {details['reason']}")
        self._persist()

    def _apply_pin(self, alloc: WorkerAllocation) -> None:
        with self.status.lock:
            self.status.alloc = alloc
        if alloc.pin is not None and alloc.pin != self.status.config:
            self._send_batch(alloc.pin)

    def _pause(self) -> None:
        """Ask the workers to finish their step, checkpoint and leave."""
        # The paused reports are not cleared here: while running, ranks may already
        # have paused on their own (target or step limit) and will not report
        # again; their reports complete this pause.  _launch clears them.
        self._pausing = True
        self._enter(JobState.RESCALING, "pausing")
        self._send(0, (STOP,))

    def _send(self, rank: int, msg: tuple) -> None:
        if rank < len(self._workers):
            self._workers[rank].send(*msg)  # a dead worker: _check_workers handles it

    def _send_batch(self, config: BatchConfig) -> None:
        """Switch the running batch configuration (rank 0 applies it at the next step)."""
        old = self.status.config
        with self.status.lock:
            self.status.config = config
        params = self.status.agent.params
        self._send(0, ("batch", config.local_bsz, config.accum_steps, params_to_dict(params)))
        self._params_sent = params
        self._record("batch_changed", {
            "from": None if old is None else [old.local_bsz, old.accum_steps],
            "to": [config.local_bsz, config.accum_steps], "step": self.status.step,
        })

    # ------------------------------------------------------------- launching
    def _batch_for(self, alloc: WorkerAllocation, current: BatchConfig | None) -> BatchConfig:
        """The batch to run on ``alloc``: the user's pin, else the job's own choice
        (:func:`~pollux_opt.agent.batch.choose_batch` with its freshest model),
        keeping ``current`` unless a better one is clear."""
        if alloc.pin is not None:
            return alloc.pin
        return choose_batch(self.limits, alloc.num_nodes, alloc.num_replicas, self.status.agent.batch_model(),
                            fixed_batch_size=self.options.fixed_batch_size, current=current)

    def _launch(self, alloc: WorkerAllocation, kind: str, t0: float) -> None:
        """Start a new generation of workers on ``alloc`` from the newest good
        checkpoint (or verify it instead, if it is an unchecked final one)."""
        if not wait_for_writer(self.workdir, WRITER_WAIT_S):
            logger.warning("job %s: a previous worker still writes checkpoints after %.0f s; resuming anyway",
                           self.job_id, WRITER_WAIT_S)
        info = latest_good(checkpoint_dir(self.workdir), on_corrupt=self._on_corrupt)
        if info is not None:
            with self.status.lock:
                self.status.absorb_meta(info.meta)
        if self._awaits_verification(info):
            self._verify_final(info, alloc)
            return
        k, n = alloc.num_replicas, alloc.num_nodes
        st = self.status
        config = self._batch_for(alloc, st.config if st.alloc is not None and st.alloc.num_replicas == k else None)
        workers = self._pool.regroup(self._workers, alloc, job_key=self.job_id)
        self._gen += 1
        self._launch_wall = time.time()
        store = self._pool.rendezvous(workers, self.workdir, self._gen) if k > 1 else None
        params = params_to_dict(self.status.agent.params)
        rank_nodes = alloc.rank_nodes()
        for rank, w in enumerate(workers):
            w.job_key = self.job_id
            a = Assignment(
                job_id=self.job_id, spec_json=self.spec.to_json(), workdir=str(self.workdir), generation=self._gen,
                rank=rank, world=k, num_nodes=n, store_path=None if store is None else str(store),
                checkpoint_meta=None if info is None else str(info.meta_path), local_bsz=config.local_bsz,
                accum_steps=config.accum_steps, options=self.options, params=params,
                cpu=None if alloc.cpus is None else alloc.cpus[rank], node_type=alloc.node_type,
                cgroup=None if alloc.cgroups is None else alloc.cgroups[rank_nodes[rank]],
            )
            w.send(RUN, a)  # a worker gone is noticed as a lost worker
        with self.status.lock:
            self._workers = workers
            self.status.worker_pids = tuple(w.pid for w in workers)
            self.status.alloc, self.status.config = alloc, config
            if self.status.first_start is None:
                self.status.first_start = time.time()
            self._pausing = False
            self._enter(JobState.RESCALING, f"launching: {kind}")
        self._resumed, self._paused = {}, {}
        self._faults.reset()
        self._resume_from = info
        self._launch_kind, self._launch_t0 = kind, t0
        self._next = None
        self._persist()

    def _awaits_verification(self, info: CheckpointInfo | None) -> bool:
        """``info`` is a final checkpoint that no fresh-process check has rejected."""
        return info is not None and info.final and not self._verification.rejected(info)

    def _verify_final(self, info: CheckpointInfo, alloc: WorkerAllocation) -> None:
        """Verify the final checkpoint ``info`` instead of launching ``alloc``:
        the job reached its target before a fault ended that generation."""
        self._release_all()
        with self.status.lock:
            self.status.alloc = alloc  # where a job driven on its own trains on if the check fails
        self._next = None
        self._record("target_reached", {"step": info.step, "metric": info.meta.get("metric"),
                                        "from_checkpoint": True})
        self._verification.start(self._pool, info)
        self._enter(JobState.RUNNING, "target reached before the launch", verifying=True)
        self._persist()

    def _resume_verification(self, info: CheckpointInfo) -> None:
        """Check the final checkpoint ``info`` of a job re-opened verifying it."""
        self._record("verification_resumed", {"step": info.step, "metric": info.meta.get("metric")})
        self._verification.start(self._pool, info)
        self._persist()

    def _on_corrupt(self, info: CheckpointInfo) -> None:
        self._record("checkpoint_corrupt", {"step": info.step, "path": str(info.path)})

    def _release_all(self) -> None:
        with self.status.lock:
            workers, self._workers = self._workers, []
        self._pool.release(workers)

    def _fail(self, error: str, details: dict | None = None) -> None:
        """End the job as failed: record why, then end its workers (never left blocked)."""
        self._record("failed", dict(details or {}, error=error))
        with self.status.lock:
            workers, self._workers = self._workers, []
            self.status.error = error
            self._enter(JobState.FAILED, error)
        if workers:
            self._pool.discard(workers)
        self._persist()

    # ------------------------------------------------------------ adaptation
    def _maybe_adapt(self) -> None:
        """Re-fit the throughput model and, unless the user pinned the batch,
        re-choose it for the current allocation (every ``adapt_interval_s``)."""
        lifecycle = self.status.lifecycle
        if lifecycle.state is not JobState.RUNNING or lifecycle.verifying:
            return
        now = time.monotonic()
        if now - self._last_adapt < self.options.adapt_interval_s:
            return
        self._last_adapt = now
        params = self.status.refit()
        alloc = self.status.alloc
        if alloc is None or alloc.pin is not None:
            return
        new = self._batch_for(alloc, self.status.config)
        if new != self.status.config:
            self._send_batch(new)
        elif params is not self._params_sent:
            # Refresh the fitted model rank 0 stores in its checkpoints.
            self._send(0, ("batch", new.local_bsz, new.accum_steps, params_to_dict(params)))
        self._params_sent = params

    # ----------------------------------------------------------- persistence
    def _record(self, kind: str, details: dict) -> None:
        event = Event(time.time(), kind, jsonable(details))
        with self.status.lock:
            self.status.events.append(event)
            self.status.changed.notify_all()
        logger.info("job %s: %s %s", self.job_id, kind, details)
        self.journal.append_event(event)

    def _persist(self) -> None:
        with self.status.lock:
            data = self.status.persistent()
        self.journal.write_state(data)
