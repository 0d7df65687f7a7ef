"""Stopping a real run on Ctrl-C or SIGTERM: checkpoint, stop, resume later.

While :func:`~pollux_opt.backends.local.run.run_workload` runs in the main
thread, :class:`StopSignals` handles SIGINT (what a terminal sends the whole
process group on Ctrl-C) and SIGTERM (``kill PID``, ``timeout``).  The first
one only asks the run to stop: the backend notices at its next poll (within
about a second), checkpoints and stops every job, logs a ``run_stop`` event,
and the run raises :class:`RunInterrupted` (a ``KeyboardInterrupt``; the
command line exits quietly with 128 + the signal number, 130 for Ctrl-C).
Running the same command again resumes every job.  A second signal stops
at once (``KeyboardInterrupt``): workers are ended without waiting, and the
jobs resume from their newest periodic checkpoints.

The pool's processes ignore SIGINT (:mod:`pollux_opt.runtime.lifeline`), so
that a Ctrl-C reaches only the scheduler.  They keep the default action of
SIGTERM, which multiprocessing relies on to end them at exit: a SIGTERM sent
to the whole process group ends them at once, and the stopped jobs then
resume from their newest checkpoints too.
"""

from __future__ import annotations

import signal
import threading
from typing import Sequence

__all__ = ["STOP_SIGNALS", "RunInterrupted", "StopSignals"]

#: The signals that stop a run with a checkpoint.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Exit statuses of a stopped run are this plus the signal number (the shell's convention).
SIGNAL_EXIT_BASE = 128


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by a signal after checkpointing and stopping its jobs.

    Attributes:
        signum: the signal; ``exit_status`` is 128 + it.
        run_dir: the run directory (rerun on it to resume).
        stopped: ids of the jobs checkpointed and stopped (they resume).
    """

    def __init__(self, signum: int, run_dir: str, stopped: Sequence[str]) -> None:
        self.signum, self.run_dir, self.stopped = int(signum), str(run_dir), list(stopped)
        name = signal.Signals(self.signum).name
        super().__init__(
            f"stopped by {name}: {len(self.stopped)} unfinished job(s) checkpointed and stopped in "
            f"{self.run_dir}; run the same command again to resume"
        )

    @property
    def exit_status(self) -> int:
        return SIGNAL_EXIT_BASE + self.signum


class StopSignals:
    """The run's handlers of :data:`STOP_SIGNALS` (see the module docstring),
    installed for a ``with`` block in the main thread (elsewhere: none)."""

    def __init__(self) -> None:
        #: The first stop signal received (None: none yet).
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self.signum is not None

    def _handle(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            return
        raise KeyboardInterrupt  # the second one: stop without waiting

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: not set from Python
        self._previous.clear()
