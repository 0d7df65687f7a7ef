"""Ending what a dead scheduler leaves behind: its pool's processes and temporary folders.

The pool's processes (workers and verification checks) are forked by
multiprocessing's fork server, not by the scheduler, so the kernel does not end
them with it, and the fork server and the resource tracker live as long as any
of them does.  A scheduler killed with SIGKILL would leave all of them running.

* Every process the pool starts runs under a :class:`Lifeline`: it ignores
  SIGINT (the scheduler stops its jobs with a checkpoint on a Ctrl-C, then
  ends the workers; the fork server detached them from the
  terminal by setsid, see :mod:`~pollux_opt.runtime.forkserver_boot`) and a watchdog thread checks
  every :data:`WATCH_S` seconds that the scheduler still exists (by pid and
  start time: a reused pid does not count).  Once it is gone the process ends
  with ``os._exit`` at once or, while it holds state worth saving
  (:meth:`Lifeline.saving_state`: rank 0 while it trains), after up to
  :data:`ORPHAN_GRACE_S` seconds in which it may end by itself (rank 0 notices
  at its next step boundary and checkpoints that step first).
* The fork server arms ``PR_SET_PDEATHSIG`` while it imports torch
  (:mod:`pollux_opt.runtime.forkserver_boot`: seconds on a loaded 2-core
  machine), before it watches its pipe from the scheduler, whose end of file
  ends it afterwards.
* multiprocessing's temporary folder (the fork server's socket) is named
  ``pollux-opt-mp-<pid>-*`` (:func:`own_temp_dir`), so that
  :func:`sweep_temp_dirs` can remove those of processes that no longer exist
  (Python's own ``pymp-*`` folders carry no owner); each pool sweeps when it is
  created, and a fork server removes its dead scheduler's folder when it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = [
    "ORPHAN_GRACE_S", "WATCH_S", "Lifeline", "ProcessIdentity", "arm_parent_death_signal",
    "own_temp_dir", "pool_process_main", "process_identity", "sweep_temp_dirs",
]

logger = logging.getLogger("pollux_opt.runtime")

#: Seconds between two checks of the watchdog that the scheduler still exists
#: (the latency of noticing its death; one check reads one small /proc file).
WATCH_S = 0.5
#: Seconds an orphaned process gets to end by itself after the scheduler is
#: gone: enough for rank 0 to reach its next step boundary and write a
#: checkpoint (steps and saves of the built-in jobs take well under a second).
ORPHAN_GRACE_S = 5.0
#: Seconds between the watchdog's checks whether an orphan still saves its state.
_SAVING_POLL_S = 0.1
#: Exit status of a process its watchdog ended.
ORPHAN_EXIT_STATUS = 3
#: ``prctl`` option that sends the calling process a signal when its parent
#: thread ends (<linux/prctl.h>).
PR_SET_PDEATHSIG = 1
#: Prefix of the temporary folders of :func:`own_temp_dir` (then the owner's pid).
TEMP_PREFIX = "pollux-opt-mp-"
_TEMP_RE = re.compile(rf"^{re.escape(TEMP_PREFIX)}(\d+)-")
#: Field of ``/proc/<pid>/stat`` (1-based, proc(5)) holding the start time in clock ticks.
_STAT_STARTTIME = 22


# ----------------------------------------------------------------- processes
ProcessIdentity = tuple[int, "int | None"]


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of ``pid`` from /proc; None if it has no entry."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is parenthesised and may hold spaces or parentheses.
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[_STAT_STARTTIME - 3])


def process_identity(pid: int | None = None) -> ProcessIdentity:
    """``(pid, start time)`` of a process (default: this one); the start time
    is None where /proc is missing (then only the pid identifies it)."""
    pid = os.getpid() if pid is None else int(pid)
    stat = _proc_stat(pid)
    return pid, None if stat is None else stat[1]


def process_exists(identity: ProcessIdentity) -> bool:
    """True while the process ``identity`` names runs (a zombie, or another
    process that reuses its pid, does not count)."""
    pid, start = identity
    if start is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # it exists, owned by another user
            pass
        return True
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X", "x") and stat[1] == start


class Lifeline:
    """The watchdog of one pool process: ends it once the scheduler ``scheduler``
    is gone (see the module docstring)."""

    def __init__(self, scheduler: ProcessIdentity) -> None:
        self.scheduler = scheduler
        self.saving = threading.Event()

    def start(self) -> "Lifeline":
        """Ignore SIGINT and start the watchdog thread; returns ``self``."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        threading.Thread(target=self._watch, name="pollux-lifeline", daemon=True).start()
        return self

    @contextlib.contextmanager
    def saving_state(self) -> Iterator[None]:
        """Within the block, an orphaned process gets up to :data:`ORPHAN_GRACE_S`
        seconds to end by itself before the watchdog ends it."""
        self.saving.set()
        try:
            yield
        finally:
            self.saving.clear()

    def _watch(self) -> None:
        while process_exists(self.scheduler):
            time.sleep(WATCH_S)
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while self.saving.is_set() and time.monotonic() < deadline:
            time.sleep(_SAVING_POLL_S)
        logging.getLogger().warning("scheduler process %d is gone; ending orphaned pool process %d",
                                    self.scheduler[0], os.getpid())
        os._exit(ORPHAN_EXIT_STATUS)


def pool_process_main(scheduler: ProcessIdentity, target: Callable[..., Any], args: tuple) -> Any:
    """Entry point of a pool process other than a worker: ``target(*args)`` under a :class:`Lifeline`."""
    Lifeline(scheduler).start()
    return target(*args)


def arm_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when the thread that started
    it ends (0 disarms); True where that is available (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - an unusual libc
        return False


# ---------------------------------------------------------- temporary folders
def own_temp_dir() -> Path | None:
    """Make multiprocessing's temporary folder of this process one named after
    its pid (removed when the process exits normally); None if multiprocessing
    already made its own, or keeps it elsewhere."""
    import multiprocessing.util

    # multiprocessing keeps that folder in its per-process configuration and
    # offers no public way to choose it other than ``tempfile.tempdir``, which
    # would move every temporary file of the process.
    config = getattr(multiprocessing.current_process(), "_config", None)
    if not isinstance(config, dict) or config.get("tempdir") is not None:
        return None
    path = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
    config["tempdir"] = path
    # After multiprocessing's own finalizers (priority >= 0), as it orders its folder.
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(path,), kwargs={"ignore_errors": True},
                                  exitpriority=-100)
    return Path(path)


def sweep_temp_dirs(only_pid: int | None = None) -> list[Path]:
    """Remove this user's :func:`own_temp_dir` folders whose process no longer
    exists (only ``only_pid``'s, if given); returns those removed."""
    root = Path(tempfile.gettempdir())
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_RE.match(entry.name)
        if match is None or (only_pid is not None and int(match.group(1)) != only_pid):
            continue
        try:
            if entry.stat().st_uid != os.getuid() or process_exists(process_identity(int(match.group(1)))):
                continue
        except OSError:
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    if removed:
        logger.info("removed %d temporary folder(s) of ended processes: %s", len(removed), removed)
    return removed
