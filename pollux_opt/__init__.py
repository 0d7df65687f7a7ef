"""pollux-opt: goodput-optimized scheduling of deep-learning training jobs.

Pollux (Qiao et al., OSDI 2021) co-adapts each job's batch configuration and
the cluster's allocation to maximise goodput = throughput x statistical
efficiency.  The top level holds what a user needs: build a cluster and jobs
and :func:`allocate` them, fit a job's goodput model, load instance and
workload files, run a workload of real jobs on this machine
(:func:`run_workload`) or simulate one (:func:`simulate`).  The layers have
their own public subpackages: :mod:`pollux_opt.model`,
:mod:`pollux_opt.scheduling`, :mod:`pollux_opt.records`,
:mod:`pollux_opt.runtime`, :mod:`pollux_opt.backends`,
:mod:`pollux_opt.workloads`; solvers over plain arrays live in the sibling
package :mod:`solvers`.

    >>> from pollux_opt import Cluster, Job, allocate
    >>> alloc = allocate(Cluster.uniform(2, 4), [Job("a", {(1, 1): 1.0, (1, 2): 1.8}, max_replicas=2)])
    >>> sum(alloc.placement["a"].values())
    2
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import Any

from solvers import InvalidProblem, Status

from pollux_opt.model import (
    Allocation,
    Cluster,
    GoodputModel,
    Job,
    Node,
    Options,
    allocate,
    fit_throughput,
    load_instance,
)
from pollux_opt.workloads import load_workload

__all__ = [
    "Allocation",
    "Cluster",
    "GoodputModel",
    "InvalidProblem",
    "Job",
    "Node",
    "Options",
    "Status",
    "allocate",
    "fit_throughput",
    "load_instance",
    "load_workload",
    "run_workload",
    "simulate",
]

try:
    __version__ = _metadata.version("pollux-opt")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

#: Entry points imported on first use, so that ``import pollux_opt`` loads
#: neither the real-job backend nor the simulator (PEP 562).
_LAZY = {
    "run_workload": ("pollux_opt.backends.local", "run_workload"),
    "simulate": ("pollux_opt.backends.sim", "simulate"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pollux_opt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
