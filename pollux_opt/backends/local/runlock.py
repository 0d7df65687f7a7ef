"""One scheduler per run directory: an OS file lock on ``run_dir/scheduler.lock``.

:func:`hold_run_lock` takes an exclusive ``fcntl.flock`` on the file, without
waiting, and holds it for the whole run; the scheduler's process id is written
into the file so that a refusal can name the holder.  A second scheduler on
the same directory (``pollux-opt run --out`` on a directory another run is
using) is refused with :class:`solvers.InvalidProblem`, so that two writers
never interleave one event log.  The kernel drops the lock when the holding
process ends, however it ends (SIGKILL included), so a stale lock file never
blocks a resume.  The lock's descriptor is not inherited by the processes the
run starts (the worker pool's fork server is spawned fresh, and its workers are
its children), so a left-over worker cannot hold it.  Where ``fcntl`` is
missing (Windows) no lock is taken.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator

from solvers import InvalidProblem

__all__ = ["LOCK_FILE", "hold_run_lock"]

log = logging.getLogger(__name__)

LOCK_FILE = "scheduler.lock"


def _holder(path: Path) -> str:
    """What the lock file says about its holder (for the refusal)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return "another process"
    return f"process {text}" if text.isdigit() else "another process"


@contextlib.contextmanager
def hold_run_lock(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold the run directory's lock for the duration of the ``with`` block.

    Raises:
        InvalidProblem: another process holds it (a scheduler running on this directory).
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        log.warning("no fcntl here: run directory %s is not locked against a second scheduler", run_dir)
        yield Path(run_dir) / LOCK_FILE
        return
    path = Path(run_dir) / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidProblem(
                f"run directory {str(run_dir)!r} is in use by another scheduler ({_holder(path)} holds "
                f"{LOCK_FILE}); wait for it to end, or stop it (Ctrl-C) and rerun, or use another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        os.close(fd)  # drops the lock (the file stays: removing it would race a new holder)
