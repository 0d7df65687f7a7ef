"""pollux-opt: goodput-optimized scheduling of deep-learning training jobs.

Pollux (Qiao et al., OSDI 2021) co-adapts each job's batch configuration and
the cluster's allocation to maximise goodput = throughput x statistical
efficiency.  This package holds the domain layer (cluster, jobs, goodput
models, instance files, the ``pollux-opt`` CLI); solvers over plain arrays
live in the sibling package :mod:`solvers`.

    >>> from pollux_opt import Cluster, Job, allocate
    >>> alloc = allocate(Cluster.uniform(2, 4), [Job("a", {(1, 1): 1.0, (1, 2): 1.8}, max_replicas=2)])
    >>> sum(alloc.placement["a"].values())
    2
"""

from solvers import InvalidProblem, Status

from pollux_opt.model import (
    Allocation,
    BatchChoice,
    BatchConfig,
    BatchLimits,
    Cluster,
    GoodputModel,
    GradientStats,
    Instance,
    Job,
    Node,
    Options,
    ThroughputParams,
    allocate,
    efficiency,
    fit_throughput,
    instance_to_json,
    load_instance,
    parse_instance,
    restart_factor,
    step_time,
    to_problem,
)
from pollux_opt.records.events import EventLog, read_events
from pollux_opt.records.metrics import summarize
from pollux_opt.scheduling.policies import POLICIES
from pollux_opt.backends.local import run_real
from pollux_opt.scheduling.loop import Backend, Decision, JobView, Policy
from pollux_opt.scheduling.loop import run as run_scheduler
from pollux_opt.workloads import WORKLOAD_SETS, Workload, WorkloadJob, load_workload

__all__ = [
    "Allocation",
    "BatchChoice",
    "BatchConfig",
    "BatchLimits",
    "Cluster",
    "GoodputModel",
    "GradientStats",
    "Instance",
    "InvalidProblem",
    "Job",
    "Node",
    "Options",
    "Status",
    "ThroughputParams",
    "allocate",
    "efficiency",
    "fit_throughput",
    "instance_to_json",
    "load_instance",
    "parse_instance",
    "restart_factor",
    "step_time",
    "to_problem",
    # scheduler, policies, event log, metrics, real runs
    "Backend",
    "Decision",
    "EventLog",
    "JobView",
    "POLICIES",
    "Policy",
    "WORKLOAD_SETS",
    "Workload",
    "WorkloadJob",
    "load_workload",
    "read_events",
    "run_real",
    "run_scheduler",
    "summarize",
]
