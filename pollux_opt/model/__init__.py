"""The domain model: cluster, jobs, options, goodput models and the allocation.

One concept per module: :mod:`~pollux_opt.model.cluster`,
:mod:`~pollux_opt.model.job`, :mod:`~pollux_opt.model.options`,
:mod:`~pollux_opt.model.allocation`, :mod:`~pollux_opt.model.throughput`
(and its fit, :mod:`~pollux_opt.model.throughput_fit`),
:mod:`~pollux_opt.model.efficiency`, :mod:`~pollux_opt.model.batch`,
:mod:`~pollux_opt.model.goodput`, :mod:`~pollux_opt.model.configs` (the
configurations a job may take); :mod:`~pollux_opt.model.allocate` turns them
into a :class:`solvers.Problem` and back, :mod:`~pollux_opt.model.instance`
reads and writes instance files.
"""

from pollux_opt.model.allocate import allocate, to_problem
from pollux_opt.model.allocation import Allocation
from pollux_opt.model.batch import BatchChoice, BatchConfig, BatchLimits
from pollux_opt.model.cluster import Cluster, Node
from pollux_opt.model.efficiency import GradientStats, efficiency
from pollux_opt.model.goodput import GoodputModel
from pollux_opt.model.instance import Instance, instance_to_json, load_instance, parse_instance
from pollux_opt.model.job import Job, restart_factor
from pollux_opt.model.options import Options
from pollux_opt.model.throughput import ThroughputParams, step_time, sync_time
from pollux_opt.model.throughput_fit import fit_throughput

__all__ = [
    "Allocation",
    "BatchChoice",
    "BatchConfig",
    "BatchLimits",
    "Cluster",
    "GoodputModel",
    "GradientStats",
    "Instance",
    "Job",
    "Node",
    "Options",
    "ThroughputParams",
    "allocate",
    "efficiency",
    "fit_throughput",
    "instance_to_json",
    "load_instance",
    "parse_instance",
    "restart_factor",
    "step_time",
    "sync_time",
    "to_problem",
]
