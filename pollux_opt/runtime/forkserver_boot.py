"""The first (and only) module of the worker pool's fork-server preload list.

Imported in the fork server, and only there, it:

1. arms ``PR_SET_PDEATHSIG`` (:func:`~pollux_opt.runtime.lifeline.arm_parent_death_signal`),
   so that a scheduler killed while the server imports torch takes the server
   with it;
2. imports :data:`MODULES`, the code every pool process runs (torch is the slow
   one: seconds on a loaded 2-core machine);
3. disarms the signal: from then on the server watches its pipe from the
   scheduler, whose end of file ends it, and the signal is tied to the
   scheduler *thread* that started the server, which may end long before the
   scheduler does;
4. owns its multiprocessing temporary folder and, when it ends after its
   scheduler died, removes the scheduler's (see :mod:`~pollux_opt.runtime.lifeline`);
5. calls ``setsid``, which every process it forks inherits.  Under
   Linux's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``,
   on by default on most distributions) each setsid group is one scheduling group:
   the scheduler's process (its loop, its jobs' supervisors, a service's API)
   then gets its share of the CPUs as a group, rather than competing thread
   for thread with workers that hold every core (a service's
   ``GET /api/v1/jobs`` p99 during a burst of submissions, two jobs training
   on 2 vCPUs: 31 ms with it, 104 ms without).  The pool's processes end with their scheduler
   by the lifeline's watchdog, never by its process group; a restarted
   scheduler's new workers wait for an orphaned rank 0's checkpoint by the
   job's writer lock (:mod:`~pollux_opt.runtime.checkpoint`).

Imported anywhere else it does nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys

from pollux_opt.runtime.lifeline import arm_parent_death_signal, own_temp_dir, sweep_temp_dirs

__all__ = ["MODULES"]

#: What the fork server imports before forking workers.
MODULES = ("torch", "torch.distributed", "pollux_opt.runtime.worker", "pollux_opt.runtime.verify")


def _in_fork_server() -> bool:
    """True in a multiprocessing fork server (its ``-c`` command runs ``forkserver.main``)."""
    server = sys.modules.get("multiprocessing.forkserver")
    main = getattr(sys.modules.get("__main__"), "main", None)
    return server is not None and main is getattr(server, "main", object())


def _boot() -> None:
    scheduler_pid = os.getppid()
    armed = arm_parent_death_signal()
    try:
        for name in MODULES:
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # as the fork server treats its preload list: the worker reports it
    finally:
        if armed:
            arm_parent_death_signal(0)
    own_temp_dir()
    atexit.register(sweep_temp_dirs, scheduler_pid)
    with contextlib.suppress(OSError):  # EPERM: already a group leader; the workers share the scheduler's group
        os.setsid()


if _in_fork_server():
    _boot()
