"""Workloads: training jobs with arrival times and their users' configurations.

:mod:`~pollux_opt.workloads.job` (the :class:`WorkloadJob` and
:class:`Workload` types), :mod:`~pollux_opt.workloads.sets` (the built-in sets
of real runs), :mod:`~pollux_opt.workloads.load` (a set by name or from a JSON
file) and :mod:`~pollux_opt.workloads.adaptdl` (the AdaptDL workload CSVs of
simulations and a Philly-style generator).
"""

from pollux_opt.workloads.adaptdl import philly_workload, read_adaptdl_csv, tuned_config, write_adaptdl_csv
from pollux_opt.workloads.job import QUICK_TIME_SCALE, Workload, WorkloadJob
from pollux_opt.workloads.load import load_workload
from pollux_opt.workloads.sets import WORKLOAD_SETS

__all__ = [
    "QUICK_TIME_SCALE", "WORKLOAD_SETS", "Workload", "WorkloadJob", "load_workload", "philly_workload",
    "read_adaptdl_csv", "tuned_config", "write_adaptdl_csv",
]
