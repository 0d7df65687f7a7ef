"""The real backend: a workload's CPU training jobs run on this machine
(:class:`RealBackend` over :class:`JobHandle` jobs; :func:`run_workload`, :func:`run_demo`)."""

from pollux_opt.backends.local.backend import RealBackend
from pollux_opt.backends.local.handle import JobHandle
from pollux_opt.backends.local.nodes import default_cluster
from pollux_opt.backends.local.run import DEFAULT_INTERVAL_S, QUICK_INTERVAL_S, RunInterrupted, run_demo, run_workload
from pollux_opt.backends.local.rundir import load_run_config

__all__ = [
    "DEFAULT_INTERVAL_S", "QUICK_INTERVAL_S", "JobHandle", "RealBackend", "RunInterrupted", "default_cluster",
    "load_run_config", "run_demo", "run_workload",
]
