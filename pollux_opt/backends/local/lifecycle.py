"""The real backend's run lifecycle: resuming a run from its event log, and
stopping it (:class:`RunLifecycle`, a part of
:class:`~pollux_opt.backends.local.backend.RealBackend`).

**Recovery.**  A backend created on a run directory whose event log already
has events resumes the run: the submitted and finished jobs and the CPUs
they held come from a replay of the log (:func:`pollux_opt.records.replay.replay`),
and each unfinished job is re-opened from its work directory, so that it
resumes from its newest good checkpoint when next started; completed jobs
stay completed.  Jobs that were running get a ``restart_after_fault`` event
with an empty placement (their workers ended with the scheduler).

**Stopping early.**  ``should_stop`` (a stop signal, see
:mod:`~pollux_opt.backends.local.signals`) is checked at every poll of
:meth:`RealBackend.advance` and before each round's views, which then raise
:class:`~pollux_opt.backends.local.backend.RunStopping`; :meth:`RunLifecycle.stop_run` checkpoints and stops every unfinished job, logs
the stops (``rescale_begin`` and ``rescale_end`` to ``{}``) and a
``run_stop`` event, and the run resumes from there like after a kill.
"""

from __future__ import annotations

import math
import time

from solvers import InvalidProblem

from pollux_opt.backends.local.bookkeeping import JobBookkeeping
from pollux_opt.records.events import read_events
from pollux_opt.records.replay import replay

__all__ = ["STOP_GRACE_S", "RunLifecycle"]

#: Seconds :meth:`RunLifecycle.close` waits for jobs to checkpoint on a graceful stop.
STOP_GRACE_S = 20.0


class RunLifecycle:
    """Resume and stop, over the state of a :class:`~pollux_opt.backends.local.backend.RealBackend`."""

    def _restore(self) -> None:
        """Rebuild per-job state from the event log (a resumed run); no-op for a new one."""
        path = self.events.path
        events = read_events(path) if path.exists() else []
        replay(events, self.jobs)
        self._measured_delays = [float(e["duration_s"]) for e in events
                                 if e.get("job_id") in self.jobs and e.get("duration_s") is not None]
        last_t = max((float(e["t"]) for e in events), default=-math.inf)
        now = self.now()
        # Runtime events older than the newest logged event were translated before the kill.
        logged_until = self.started_unix + last_t
        for job in self.jobs.values():
            job.src_time = max(job.src_time, logged_until)
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

    def _stop_jobs(self, jobs: list[JobBookkeeping], timeout: float) -> None:
        """Ask ``jobs`` to checkpoint and stop; wait up to ``timeout`` seconds for them all."""
        for job in jobs:
            try:
                job.handle.stop()
            except InvalidProblem:
                pass
        deadline = time.monotonic() + timeout
        for job in jobs:
            try:
                job.handle.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except (TimeoutError, RuntimeError):
                pass

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
        self._stop_jobs(live, timeout)
        self._poll(arrivals=False)
        stopped = [j.id for j in self.jobs.values() if j.submitted and not j.finished]
        self._emit("run_stop", self.now(), None, reason=reason, stopped=stopped)
        return stopped

    def close(self, *, graceful: bool = True, timeout: float = STOP_GRACE_S) -> None:
        """Stop unfinished jobs (checkpointing them if ``graceful``) and end all workers."""
        if graceful:
            self._stop_jobs([j for j in self.jobs.values() if j.handle is not None and not j.finished], timeout)
        for j in self.jobs.values():
            if j.handle is not None:
                j.handle.close()
        if self._own_pool and self.pool is not None:
            self.pool.close()
