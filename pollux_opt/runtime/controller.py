"""The decisions of one elastic job's supervisor (:class:`JobController`),
taken in the supervisor thread of its :class:`~pollux_opt.runtime.job.ElasticJob`:
it applies the scheduler's requests at step boundaries, launches and pauses
the job's generations of workers (:class:`~pollux_opt.runtime.generation.Generation`),
acts on what they report (their liveness included), verifies the final
checkpoint, re-fits the job's throughput model and moves the job through its
states (:mod:`~pollux_opt.lifecycle`), recorded by its
:class:`~pollux_opt.runtime.status.JobStatus`.

**A reached target is never trained past.**  A final checkpoint (the one rank
0 writes when an evaluation reaches the target) that no fresh-process check
has rejected is verified, never resumed: a job re-opened with one (its
scheduler was killed while the job verified, or just before) starts verifying
it at once (``running``, holding no CPUs), and a launch that finds one (a
worker died between the final checkpoint and the pause) verifies it instead.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pollux_opt.lifecycle import JobState
from pollux_opt.model import BatchConfig
from pollux_opt.agent.agent import params_to_dict
from pollux_opt.runtime.allocation import FollowUp, WorkerAllocation
from pollux_opt.runtime.checkpoint import CheckpointInfo, checkpoint_dir, latest_good, wait_for_writer
from pollux_opt.runtime.generation import Generation
from pollux_opt.runtime.pool import WorkerPool
from pollux_opt.runtime.protocol import BATCH, ERROR, METRICS, RESUMED, STOP
from pollux_opt.runtime.report import RuntimeOptions
from pollux_opt.runtime.spec import JobSpec
from pollux_opt.runtime.status import JobStatus
from pollux_opt.runtime.verify import VerificationRun
from pollux_opt.runtime.worker import WRITER_WAIT_S

__all__ = ["SUPERVISOR_TICK_S", "JobController"]

logger = logging.getLogger("pollux_opt.runtime")

#: Seconds the supervisor thread waits for worker messages per loop turn (the
#: latency of reacting to commands and faults; small against a rescale budget of 1 s).
SUPERVISOR_TICK_S = 0.02
#: Event recorded when a launch of each kind has all its workers training.
_RESUMED_EVENT = {"rescale": "rescaled", "start": "started", "restart": "restarted"}


class JobController:
    """The decisions of one job's supervisor (see the module docstring), taken
    in the thread of its :class:`~pollux_opt.runtime.job.ElasticJob`: the
    scheduler's requests (:meth:`request_alloc`, :meth:`request_stop`) and one
    :meth:`tick` per turn of that thread.

    Args:
        job_id, spec, workdir, options: the job.
        pool: the :class:`WorkerPool` its workers come from (None until the
            handle makes a private one).

    Attributes:
        resume_check: the unchecked final checkpoint of a job re-opened with one
            (it is ``running``, verifying, and :meth:`resume_verification` starts
            the check), else None.
    """

    def __init__(self, job_id: str, spec: JobSpec, workdir: Path, options: RuntimeOptions,
                 pool: WorkerPool | None) -> None:
        self.job_id, self.spec, self.workdir, self.options = job_id, spec, Path(workdir), options
        self.status = JobStatus(job_id, spec, options, self.workdir)
        self.pool = pool
        self._gen = Generation()
        self._next: FollowUp | None = None  # what to do once the current transition ends
        self._verification = VerificationRun(self.status)
        self._params_sent = None
        self._last_adapt = 0.0
        self.resume_check: CheckpointInfo | None = None
        newest = self.status.restore()
        if newest is not None and newest.final and not self.status.lifecycle.state.terminal:
            info = latest_good(checkpoint_dir(self.workdir), on_corrupt=self._on_corrupt)
            if self._awaits_verification(info):
                self.status.enter(JobState.RUNNING, "re-opened with an unchecked final checkpoint", verifying=True)
                self.status.absorb_meta(info.meta)
                self.resume_check = info

    def tick(self) -> bool:
        """One turn of the supervisor thread after its commands: handle the
        workers' reports (waiting up to :data:`SUPERVISOR_TICK_S` for one) and
        faults, the end of a verification, and adaptation.  False once nothing
        is left to supervise."""
        self._pump(SUPERVISOR_TICK_S)
        self._check_workers()
        if self._verification.finish():
            self._after_failed_verification()
        self._maybe_adapt()
        return not self.status.lifecycle.state.terminal or self._verification.active

    def shutdown(self) -> None:
        """End the workers and any verification now (no checkpoint)."""
        workers = self._take_workers()
        if workers and self.pool is not None:
            self.pool.discard(workers)
        self._verification.kill()

    def resume_verification(self) -> None:
        """Start checking :attr:`resume_check`."""
        self._verification.start(self.pool, self.resume_check, None, "verification_resumed")

    # --------------------------------------------------------------- requests
    def request_alloc(self, alloc: WorkerAllocation, t0: float) -> None:
        """Serve a start or rescale to ``alloc`` asked for at ``t0`` (``time.monotonic`` seconds)."""
        state, pending = self.status.lifecycle.state, self._next
        if pending is not None and pending.cancel:
            return  # a cancel is final
        if state is JobState.QUEUED:
            self._launch(alloc, "start", t0)
        elif self.status.lifecycle.verifying:
            self._next = FollowUp(alloc, t0)  # served if the verification does not confirm the target
        elif not self._gen.pausing and alloc.same_workers(self.status.alloc):
            # The same workers: only the batch may change, at a step boundary, without a restart.
            self._next = None  # (while forming: asked for what is being launched)
            with self.status.lock:
                self.status.alloc = alloc
            if alloc.pin is not None and alloc.pin != self.status.config:
                self._send_batch(alloc.pin)
        elif state is JobState.RUNNING:
            self._next = FollowUp(alloc, t0)
            self._pause()
        else:  # forming elsewhere, or pausing: the newest request wins once the transition ends
            # The rescale time counts from the oldest unserved request.
            self._next = FollowUp(alloc, t0 if pending is None or pending.stop else pending.t0)

    def request_stop(self, cancel: bool) -> None:
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
        self.status.record("stopped", dict(details, cancel=True) if cancel else details)
        self._next = None
        if cancel or self.status.lifecycle.state is not JobState.QUEUED:
            self.status.enter(JobState.CANCELLED if cancel else JobState.QUEUED, f"stopped: {details['reason']}")
        self.status.persist()

    def _pause(self) -> None:
        """Ask the workers to finish their step, checkpoint and leave."""
        # The paused reports are not cleared here: while running, ranks may already
        # have paused on their own (target or step limit) and will not report
        # again; their reports complete this pause.
        self._gen.pausing = True
        self.status.enter(JobState.RESCALING, "pausing")
        self._send_to_rank0(STOP)

    def _send_to_rank0(self, *message) -> None:
        if self._gen.workers:
            self._gen.workers[0].send(*message)  # a dead worker: _check_workers handles it

    def _send_batch(self, config: BatchConfig) -> None:
        """Switch the running batch configuration (rank 0 applies it at the next step)."""
        old = self.status.config
        with self.status.lock:
            self.status.config = config
        params = self.status.agent.params
        self._send_to_rank0(BATCH, config.local_bsz, config.accum_steps, params_to_dict(params))
        self._params_sent = params
        self.status.record("batch_changed", {
            "from": None if old is None else [old.local_bsz, old.accum_steps],
            "to": [config.local_bsz, config.accum_steps], "step": self.status.step,
        })

    # ------------------------------------------------------------- launching
    def _launch(self, alloc: WorkerAllocation, kind: str, t0: float) -> None:
        """Start a new generation of workers on ``alloc`` from the newest good
        checkpoint (or verify it instead, if it is an unchecked final one)."""
        if not wait_for_writer(self.workdir, WRITER_WAIT_S):
            logger.warning("job %s: a previous worker still writes checkpoints after %.0f s; resuming anyway",
                           self.job_id, WRITER_WAIT_S)
        info = latest_good(checkpoint_dir(self.workdir), on_corrupt=self._on_corrupt)
        st = self.status
        if info is not None:
            with st.lock:
                st.absorb_meta(info.meta)
        if self._awaits_verification(info):
            self._verify_final(info, alloc)
            return
        config = st.batch_for(alloc, st.config if st.alloc is not None
                              and st.alloc.num_replicas == alloc.num_replicas else None)
        gen = Generation.launch(self.pool, self._gen, alloc, config, kind, t0, info, job_id=self.job_id,
                                spec_json=self.spec.to_json(), workdir=str(self.workdir), options=self.options,
                                params=params_to_dict(st.agent.params))
        with st.lock:
            self._gen = gen
            st.worker_pids = tuple(w.pid for w in gen.workers)
            st.alloc, st.config = alloc, config
            if st.first_start is None:
                st.first_start = time.time()
            st.enter(JobState.RESCALING, f"launching: {kind}")
        self._next = None
        st.persist()

    def _awaits_verification(self, info: CheckpointInfo | None) -> bool:
        """``info`` is a final checkpoint that no fresh-process check has rejected."""
        return info is not None and info.final and not self._verification.rejected(info)

    def _on_corrupt(self, info: CheckpointInfo) -> None:
        self.status.record("checkpoint_corrupt", {"step": info.step, "path": str(info.path)})

    def _take_workers(self) -> list:
        """The current generation's workers, which it no longer holds."""
        with self.status.lock:
            workers, self._gen.workers = self._gen.workers, []
        return workers

    def fail(self, error: str, details: dict | None = None) -> None:
        """End the job as failed, recording why, then end its workers (never left blocked)."""
        workers = self._take_workers()
        self.status.fail(error, details)
        if workers:
            self.pool.discard(workers)

    # ------------------------------------------------------ worker reports
    def _pump(self, timeout: float) -> None:
        """Handle the workers' reports, waiting up to ``timeout`` seconds for one."""
        if not self._gen.workers:
            time.sleep(timeout)
            return
        for w, (kind, info) in self.pool.receive(self._gen.workers, timeout):
            # Handling one report can end or replace the generation (a fault
            # restart, a rescale): reports of workers or generations no longer current are dropped.
            if w in self._gen.workers:
                self._on_message(self._gen.workers.index(w), kind, info)

    def _on_message(self, rank: int, kind: str, info: dict) -> None:
        if info.get("generation") != self._gen.number:
            return  # a late report of an earlier generation
        if kind == METRICS:
            self.status.take_metrics(info)
            return
        # CHECKPOINT reports: recorded on disk; the newest good one is looked up when needed.
        outcome = self._gen.take(rank, kind, info)
        if outcome is not None:
            what, data = outcome
            if what == ERROR:
                self.fail(data.pop("error"), data)
            else:
                (self._on_resumed if what == RESUMED else self._on_paused)(data)

    def _on_resumed(self, info0: dict) -> None:
        gen, st = self._gen, self.status
        seconds = time.monotonic() - gen.t0
        # The event is recorded before the state changes, so that whoever sees
        # the new state also sees the event explaining it.
        st.record(_RESUMED_EVENT[gen.kind], gen.resumed_details(st.alloc, st.config, st.worker_pids, seconds))
        with st.lock:
            st.take_position(info0)
            st.train_size = info0["train_size"]
            if gen.kind != "restart":
                (st.rescale_times if gen.kind == "rescale" else st.start_times).append(seconds)
            st.enter(JobState.RUNNING, f"workers resumed: {gen.kind}")
        # A warm spare with this job built makes the next scale-up cheap.
        self.pool.prepare(self.job_id, self.spec.to_json(), str(self.workdir))
        st.persist()
        if self._next is not None:  # a stop or another allocation was asked for meanwhile
            self._pause()

    def _on_paused(self, info0: dict) -> None:
        with self.status.lock:
            self.status.take_position(info0)
        reason, follow = info0["reason"], self._next
        if reason == "target":
            self.pool.release(self._take_workers())
            self.status.record("target_reached", {"step": info0["step"], "metric": info0["metric"]})
            self._start_verification()
        elif reason != "step_limit" and follow is not None and not follow.stop:
            self._launch(follow.alloc, "rescale", follow.t0)
        else:
            self.pool.release(self._take_workers())
            why = "step_limit" if reason == "step_limit" else "request"
            self._stopped(follow, {"reason": why, "step": info0["step"], "checksum": info0["checksum"]})

    def _check_workers(self) -> None:
        if not self.status.lifecycle.holds_cpus or (all(w.alive() for w in self._gen.workers)
                                                     and not self._gen.collective_errors):
            return
        # Error reports (or the last PAUSED) may still be on their way;
        # handling them may end or replace the generation.
        self._pump(0.0)
        gen = self._gen
        lost = gen.lost() if self.status.lifecycle.holds_cpus else None
        if lost is None:
            return
        rank, w = lost
        state = self.status.lifecycle.state
        pausing = gen.pausing and state is JobState.RESCALING
        if state is JobState.RUNNING or pausing:
            # Training survivors checkpoint the last completed step before they exit,
            # then report their final step rows (or an error of their own, which
            # fails the job here); forming ones may wait in the rendezvous for the
            # lost peer (nothing to save).
            gen.await_survivors(rank)
            self._pump(0.0)
            if not self.status.lifecycle.holds_cpus:
                return
        self.status.record("worker_lost", {
            "rank": rank, "pid": w.pid, "exitcode": w.exitcode, "step": self.status.step,
            "state": state.value, "pausing": pausing,
            "peers_reporting_failed_collectives": sorted(gen.collective_errors),
        })
        with self.status.lock:
            workers = self._take_workers()
            self.status.restarts += 1
            restarts = self.status.restarts
        self.pool.discard(workers)
        if restarts > self.options.max_restarts:
            self.fail(f"worker rank {rank} (pid {w.pid}) died with exit code {w.exitcode}; "
                       f"{restarts - 1} restarts already spent (max_restarts={self.options.max_restarts})")
            return
        follow = self._next
        if pausing and follow is not None and follow.stop:
            self._stopped(follow, {"reason": "request", "step": self.status.step, "after_fault": True})
            return
        self._launch(follow.alloc if follow is not None and not follow.stop else self.status.alloc,
                     "restart", time.monotonic())
        if follow is not None and follow.stop:
            self._next = follow  # the stop still stands once the restarted workers train

    # ---------------------------------------------------------- verification
    def _start_verification(self) -> None:
        info = latest_good(checkpoint_dir(self.workdir), on_corrupt=self._on_corrupt)
        if info is None or not info.final:
            self.status.record("verification_failed", {"reason": "no final checkpoint"})
            self._after_failed_verification()
            return
        self._verification.start(self.pool, info, "target reached")

    def _verify_final(self, info: CheckpointInfo, alloc: WorkerAllocation) -> None:
        """Verify the final checkpoint ``info`` instead of launching ``alloc``:
        the job reached its target before a fault ended that generation."""
        self.pool.release(self._take_workers())
        with self.status.lock:
            self.status.alloc = alloc  # where a job driven on its own trains on if the check fails
        self._next = None
        self._verification.start(self.pool, info, "target reached before the launch", "target_reached",
                                 from_checkpoint=True)

    def _after_failed_verification(self) -> None:
        if self._verification.count_failure():
            self.fail("the final metric did not reach the target when re-evaluated in a fresh process")
            return
        follow, self._next = self._next, None
        alloc = None if follow is None else follow.alloc
        if follow is None and self.options.resume_after_failed_verification:
            alloc = self.status.alloc
        if alloc is None:  # asked to stop, or waiting, holding nothing, for the scheduler's next allocation
            self._stopped(follow, {"reason": "verification_failed", "step": self.status.step})
            return
        self._launch(alloc, "restart", time.monotonic())

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
        new = self.status.batch_for(alloc, self.status.config)
        if new != self.status.config:
            self._send_batch(new)
        elif params is not self._params_sent:
            # Refresh the fitted model rank 0 stores in its checkpoints.
            self._send_to_rank0(BATCH, new.local_bsz, new.accum_steps, params_to_dict(params))
        self._params_sent = params
