"""The real backend: a workload's CPU training jobs run on this machine.

:mod:`~pollux_opt.backends.local.backend` (:class:`RealBackend`),
:mod:`~pollux_opt.backends.local.handle` (the :class:`JobHandle` it drives),
:mod:`~pollux_opt.backends.local.polling` (the jobs' reports read),
:mod:`~pollux_opt.backends.local.nodes` (the cluster, CPU pins and cgroups),
:mod:`~pollux_opt.backends.local.throttle` (cgroup CPU quotas),
:mod:`~pollux_opt.backends.local.rundir` (the run directory, its configuration
and lock) and :mod:`~pollux_opt.backends.local.run` (:func:`run_workload`, stop
signals, the live view, :func:`run_demo`).
"""

from pollux_opt.backends.local.backend import RealBackend
from pollux_opt.backends.local.handle import JobHandle
from pollux_opt.backends.local.nodes import default_cluster
from pollux_opt.backends.local.run import DEFAULT_INTERVAL_S, QUICK_INTERVAL_S, RunInterrupted, run_demo, run_workload
from pollux_opt.backends.local.rundir import load_run_config

__all__ = [
    "DEFAULT_INTERVAL_S", "QUICK_INTERVAL_S", "JobHandle", "RealBackend", "RunInterrupted", "default_cluster",
    "load_run_config", "run_demo", "run_workload",
]
