"""Telling a lost worker's cause from its symptoms, and the fresh-process
check of a final checkpoint: the two pieces of state the supervisor keeps to
recover from faults and to confirm completion."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

from pollux_opt.runtime.checkpoint import CheckpointInfo
from pollux_opt.runtime.pool import Worker, WorkerPool
from pollux_opt.runtime.verify import VERIFICATION_FILE, verify_process

__all__ = ["FAULT_GRACE_S", "FaultMonitor", "VerificationRun"]

#: Seconds to wait, after workers exited reporting only failed collectives, for
#: the cause (a dead peer or a job error) to show before restarting anyway.
FAULT_GRACE_S = 2.0


class FaultMonitor:
    """The failed collectives reported by one generation of workers.

    A worker that dies is the cause of a fault; its peers then see their
    collectives fail and exit reporting that (symptoms).  The cause is named
    once it shows, or after :data:`FAULT_GRACE_S` with only symptoms.
    """

    def __init__(self) -> None:
        self.collective_errors: dict[int, dict] = {}  # rank -> report of a failed collective
        self._first_seen: float | None = None  # when only symptoms were first seen (monotonic s)

    def reset(self) -> None:
        """Forget the previous generation."""
        self.collective_errors = {}
        self._first_seen = None

    def note_collective(self, info: dict) -> None:
        self.collective_errors[info["rank"]] = info

    @property
    def suspect(self) -> bool:
        """Some rank reported a failed collective."""
        return bool(self.collective_errors)

    def lost(self, workers: Sequence[Worker]) -> tuple[int, Worker] | None:
        """The (rank, worker) to blame, or None while no worker has exited (or
        only symptoms have, within the grace period)."""
        dead = [(rank, w) for rank, w in enumerate(workers) if not w.alive()]
        if not dead:
            return None
        causes = [(rank, w) for rank, w in dead if rank not in self.collective_errors]
        if not causes:
            now = time.monotonic()
            if self._first_seen is None:
                self._first_seen = now
            if now - self._first_seen < FAULT_GRACE_S:
                return None
            causes = dead
        return causes[0]


class VerificationRun:
    """The re-evaluation of a job's final checkpoint in a fresh process
    (:func:`~pollux_opt.runtime.verify.verify_process`)."""

    def __init__(self, workdir: Path, job_id: str) -> None:
        self.workdir = Path(workdir)
        self.job_id = job_id
        self._proc = None  # the multiprocessing process, while one exists

    @property
    def active(self) -> bool:
        return self._proc is not None

    def start(self, pool: WorkerPool, info: CheckpointInfo) -> None:
        """Start checking ``info`` in a new process from the pool's fork server
        (torch already imported, none of the training processes' memory)."""
        (self.workdir / VERIFICATION_FILE).unlink(missing_ok=True)
        log_dir = self.workdir / "logs"
        log_dir.mkdir(exist_ok=True)
        self._proc = pool.start_process(
            verify_process, (str(self.workdir), str(info.meta_path), str(log_dir / "verify.log")),
            name=f"pollux-verify-{self.job_id}",
        )

    def poll(self) -> int | None:
        """None while none runs or it is still running; else its exit status (it is then joined)."""
        proc = self._proc
        if proc is None or proc.is_alive():
            return None
        proc.join()
        self._proc = None
        return proc.exitcode

    def record(self) -> dict:
        """What the finished check wrote (see :func:`~pollux_opt.runtime.verify.verify_checkpoint`)."""
        return json.loads((self.workdir / VERIFICATION_FILE).read_text())

    def rejected(self, info: CheckpointInfo) -> bool:
        """True if the last finished check was of ``info`` and did not confirm the
        target (then the job trains on from it rather than checking it again)."""
        try:
            record = self.record()
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict):
            return False
        checked = Path(str(record.get("checkpoint", ""))).name
        return checked == info.meta_path.name and record.get("reached") is False

    def kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
