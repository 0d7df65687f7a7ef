"""Elastic training-job runtime: real torch jobs on CPU cores that change their
number of workers and their batch size without losing progress (the job side of
Pollux's executor).  torch is imported lazily: this package imports without it.

One non-blocking :class:`ElasticJob` handle per job (``start``, ``rescale``,
``stop``, ``cancel``, ``report``, ``wait``), workers kept warm in a shared
:class:`WorkerPool`, jobs defined by a :class:`JobSpec` (a builder returning
:class:`JobParts`, or a user's own loop through :mod:`pollux_opt.elastic`).
``docs/runtime.md`` describes the control surface, the states, what a job does
and its work directory.
"""

from __future__ import annotations

from pollux_opt.lifecycle import JobState
from pollux_opt.runtime.job import ElasticJob
from pollux_opt.runtime.pool import WorkerPool
from pollux_opt.runtime.profiling import heldout_error, profile_throughput
from pollux_opt.runtime.entry import get_job, job_names, register_job, training_job
from pollux_opt.runtime.report import Event, JobReport, Measurements, RuntimeOptions
from pollux_opt.runtime.spec import LR_SCALING_RULES, BuildContext, JobParts, JobSpec
from pollux_opt.runtime.spec import declare_builder_modules
from pollux_opt.extras import TORCH_MISSING

__all__ = [
    "LR_SCALING_RULES",
    "TORCH_MISSING",
    "BuildContext",
    "ElasticJob",
    "Event",
    "JobParts",
    "JobReport",
    "JobSpec",
    "JobState",
    "Measurements",
    "RuntimeOptions",
    "WorkerPool",
    "declare_builder_modules",
    "get_job",
    "heldout_error",
    "job_names",
    "profile_throughput",
    "register_job",
    "training_job",
]
