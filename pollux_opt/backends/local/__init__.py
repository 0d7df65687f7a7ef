"""The real backend: a workload's CPU training jobs run on this machine.

:mod:`~pollux_opt.backends.local.backend` (:class:`RealBackend`, the
scheduler's backend over job handles), :mod:`~pollux_opt.backends.local.handle`
(the :class:`JobHandle` protocol it drives), :mod:`~pollux_opt.backends.local.polling`
(reports in, commands out), :mod:`~pollux_opt.backends.local.cpus` (the default
cluster and CPU pinning), :mod:`~pollux_opt.backends.local.rundir` (the run
directory and its configuration), :mod:`~pollux_opt.backends.local.run`
(:func:`run_workload`), :mod:`~pollux_opt.backends.local.runlock` (one scheduler
per run directory), :mod:`~pollux_opt.backends.local.signals` (Ctrl-C and
SIGTERM: checkpoint, stop, resume), :mod:`~pollux_opt.backends.local.console`
(the live view) and :mod:`~pollux_opt.backends.local.demo` (:func:`run_demo`).
"""

from pollux_opt.backends.local.backend import RealBackend
from pollux_opt.backends.local.console import ConsoleProgress
from pollux_opt.backends.local.cpus import default_cluster
from pollux_opt.backends.local.demo import QUICK_INTERVAL_S, run_demo
from pollux_opt.backends.local.handle import JobHandle
from pollux_opt.backends.local.run import DEFAULT_INTERVAL_S, run_workload
from pollux_opt.backends.local.signals import RunInterrupted
from pollux_opt.backends.local.rundir import load_run_config

__all__ = [
    "DEFAULT_INTERVAL_S", "QUICK_INTERVAL_S", "ConsoleProgress", "JobHandle", "RealBackend", "RunInterrupted",
    "default_cluster", "load_run_config", "run_demo", "run_workload",
]
