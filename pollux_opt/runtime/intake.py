"""What the supervisor of a job does with what its workers report: the
resume and pause reports of a generation, rank 0's step metrics (the
measurement intake: the job agent's profile and gradient statistics, and
``steps.csv``), errors and lost workers, and the fresh-process check of the
final checkpoint.

:class:`WorkerIntake` is a part of :class:`~pollux_opt.runtime.controller.JobController`
kept in its own module: a mixin that uses the controller's state (``status``,
``journal``, ``options``, the current generation's ``_workers``, ``_gen``,
``_resumed``, ``_paused``, ``_pausing``, ``_faults``, ``_verification``,
``_next``) and its transitions (``_enter``, ``_launch``, ``_pause``,
``_stopped``, ``_release_all``, ``_fail``, ``_record``, ``_persist``).
"""

from __future__ import annotations

import time

from pollux_opt.lifecycle import JobState
from pollux_opt.runtime.checkpoint import checkpoint_dir, latest_good
from pollux_opt.runtime.protocol import CHECKPOINT, ERROR, METRICS, PAUSED, RESUMED

__all__ = ["MAX_VERIFICATION_FAILURES", "SURVIVOR_EXIT_S", "WorkerIntake"]

#: Verification failures (metric not reproduced in a fresh process) tolerated
#: before a job is failed instead of resumed.
MAX_VERIFICATION_FAILURES = 2
#: Most seconds the other workers of a generation that lost one get to end by
#: themselves (their collectives fail at once; rank 0 then checkpoints its last
#: completed step, milliseconds for the built-in jobs) before they are killed.
SURVIVOR_EXIT_S = 5.0

#: Event recorded when a launch of each kind has all its workers training.
_RESUMED_EVENT = {"rescale": "rescaled", "start": "started", "restart": "restarted"}


class WorkerIntake:
    """Handling of worker reports, faults and verification (see the module docstring)."""

    # ------------------------------------------------------------- messages
    def _pump(self, timeout: float) -> None:
        """Handle the workers' reports, waiting up to ``timeout`` seconds for one."""
        if not self._workers:
            time.sleep(timeout)
            return
        for w, (kind, info) in self._pool.receive(self._workers, timeout):
            # Handling one report can replace the worker set (a fault restart, a
            # rescale): reports of workers no longer current are dropped.
            if w in self._workers:
                self._on_message(self._workers.index(w), kind, info)

    def _on_message(self, rank: int, kind: str, info: dict) -> None:
        if info.get("generation") != self._gen:
            return  # a late report of an earlier generation
        if kind == ERROR:
            self._on_error(info)
        elif kind == RESUMED:
            self._on_resumed(rank, info)
        elif kind == METRICS:
            self._on_metrics(info)
        elif kind == CHECKPOINT:
            pass  # recorded on disk; the newest good one is looked up when needed
        elif kind == PAUSED:
            self._on_paused(rank, info)

    def _resumed_details(self, seconds: float) -> dict:
        """Details of the event recording that every rank of a launch trains."""
        info0, ranks = self._resumed[0], sorted(self._resumed)
        alloc, config = self.status.alloc, self.status.config
        details = {
            "seconds": seconds, "step": info0["step"], "progress": info0["progress"], "checksum": info0["checksum"],
            "from_checkpoint": info0["from_checkpoint"], "placement": dict(alloc.placement),
            "num_replicas": alloc.num_replicas, "pids": list(self.status.worker_pids),
            "config": [config.local_bsz, config.accum_steps],
            # Where the time went, per rank: waiting for the worker to take the
            # assignment (busy or still starting), building, joining the group, loading.
            "queue_s": [self._resumed[r]["received"] - self._launch_wall for r in ranks],
            "build_s": [self._resumed[r]["build_s"] for r in ranks],
            "group_s": [self._resumed[r]["group_s"] for r in ranks],
            "load_s": [self._resumed[r]["load_s"] for r in ranks],
            "checkpoint_checksum": None if self._resume_from is None else self._resume_from.meta.get("checksum"),
        }
        if self._launch_kind == "rescale" and self._last_pause is not None:
            details["paused_step"] = self._last_pause["step"]
            details["paused_checksum"] = self._last_pause["checksum"]
        return details

    def _on_resumed(self, rank: int, info: dict) -> None:
        self._resumed[rank] = info
        if len(self._resumed) < len(self._workers):
            return
        checksums = {r["checksum"] for r in self._resumed.values()}
        expected = None if self._resume_from is None else self._resume_from.meta.get("checksum")
        if len(checksums) != 1 or (expected is not None and checksums != {expected}):
            self._fail(f"workers resumed with inconsistent parameters: {sorted(checksums)} vs checkpoint {expected}")
            return
        kind, seconds = self._launch_kind, time.monotonic() - self._launch_t0
        # The event is recorded before the state changes, so that whoever sees
        # the new state also sees the event explaining it.
        self._record(_RESUMED_EVENT[kind], self._resumed_details(seconds))
        with self.status.lock:
            self.status.take_position(self._resumed[0])
            self.status.train_size = self._resumed[0]["train_size"]
            if kind == "rescale":
                self.status.rescale_times.append(seconds)
            elif kind == "start":
                self.status.start_times.append(seconds)
            self._enter(JobState.RUNNING, f"workers resumed: {kind}")
        # A warm spare with this job built makes the next scale-up cheap.
        self._pool.prepare(self.job_id, self.spec.to_json(), str(self.workdir))
        self._persist()
        if self._next is not None:  # a stop or another allocation was asked for meanwhile
            self._pause()

    def _on_metrics(self, info: dict) -> None:
        with self.status.lock:
            self.status.take_position(info)
            self.status.take_measurements(info)
            self.status.changed.notify_all()
        self.journal.append_steps(info["rows"])

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
        with self.status.lock:
            self.status.take_position(info0)
        reason, follow = info0["reason"], self._next
        if reason == "target":
            self._release_all()
            self._record("target_reached", {"step": info0["step"], "metric": info0["metric"]})
            self._start_verification()
        elif reason != "step_limit" and follow is not None and not follow.stop:
            self._launch(follow.alloc, "rescale", follow.t0)
        else:
            self._release_all()
            why = "step_limit" if reason == "step_limit" else "request"
            self._stopped(follow, {"reason": why, "step": info0["step"], "checksum": info0["checksum"]})

    # ---------------------------------------------------------------- faults
    def _on_error(self, info: dict) -> None:
        if info.get("collective"):
            self._faults.note_collective(info)  # a symptom: _check_workers finds the cause
            return
        self._fail(f"rank {info['rank']}: {info['error']}", {"rank": info["rank"], "traceback": info["traceback"]})

    def _check_workers(self) -> None:
        if not self.status.lifecycle.holds_cpus:
            return
        if all(w.alive() for w in self._workers) and not self._faults.suspect:
            return
        # Error reports (or the last PAUSED) may still be on their way;
        # handling them may end or replace the generation.
        self._pump(0.0)
        if not self.status.lifecycle.holds_cpus:
            return
        lost = self._faults.lost(self._workers)
        if lost is None:
            return
        rank, w = lost
        state = self.status.lifecycle.state
        pausing = self._pausing and state is JobState.RESCALING
        if state is JobState.RUNNING or pausing:
            # Training survivors checkpoint the last completed step before they exit;
            # forming ones may wait in the rendezvous for the lost peer (nothing to save).
            self._await_survivors(rank)
            if not self.status.lifecycle.holds_cpus:
                return
        self._record("worker_lost", {
            "rank": rank, "pid": w.pid, "exitcode": w.exitcode, "step": self.status.step,
            "state": state.value, "pausing": pausing,
            "peers_reporting_failed_collectives": sorted(self._faults.collective_errors),
        })
        with self.status.lock:
            workers, self._workers = self._workers, []
            self.status.restarts += 1
            restarts = self.status.restarts
        self._pool.discard(workers)
        if restarts > self.options.max_restarts:
            self._fail(f"worker rank {rank} (pid {w.pid}) died with exit code {w.exitcode}; "
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

    def _await_survivors(self, lost_rank: int) -> None:
        """Wait up to :data:`SURVIVOR_EXIT_S` for the workers other than
        ``lost_rank`` to end by themselves, then take what they reported last
        (their final step rows; an error of their own may fail the job here)."""
        deadline = time.monotonic() + SURVIVOR_EXIT_S
        for rank, w in enumerate(self._workers):
            if rank != lost_rank:
                w.join(max(deadline - time.monotonic(), 0.0))
        self._pump(0.0)

    # ---------------------------------------------------------- verification
    def _start_verification(self) -> None:
        info = latest_good(checkpoint_dir(self.workdir), on_corrupt=self._on_corrupt)
        if info is None or not info.final:
            self._record("verification_failed", {"reason": "no final checkpoint"})
            self._after_failed_verification()
            return
        self._verification.start(self._pool, info)
        self._enter(JobState.RUNNING, "target reached", verifying=True)
        self._persist()

    def _check_verification(self) -> None:
        exitcode = self._verification.poll()
        if exitcode is None:
            return
        if exitcode != 0:
            self._fail(f"verification process exited with status {exitcode} (see logs/verify.log)")
            return
        record = self._verification.record()
        if record["reached"]:
            self._record("verified", record)
            with self.status.lock:
                self.status.final_metric = record["metric"]
                self._enter(JobState.SUCCEEDED, "verified")
            self._persist()
        else:
            self._record("verification_failed", record)
            self._after_failed_verification()

    def _after_failed_verification(self) -> None:
        self._verification_failures += 1
        if self._verification_failures >= MAX_VERIFICATION_FAILURES:
            self._fail("the final metric did not reach the target when re-evaluated in a fresh process")
            return
        follow, self._next = self._next, None
        alloc = None if follow is None else follow.alloc
        if follow is None and self.options.resume_after_failed_verification:
            alloc = self.status.alloc
        if alloc is None:  # asked to stop, or waiting, holding nothing, for the scheduler's next allocation
            self._stopped(follow, {"reason": "verification_failed", "step": self.status.step})
            return
        self._launch(alloc, "restart", time.monotonic())
