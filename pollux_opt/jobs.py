"""Real elastic training jobs on CPU cores (the ``jobs`` extra: torch, scikit-learn).

Public face of :mod:`pollux_opt._runtime`; see its docstring for the control
surface a scheduler uses.  Importing this module does not import torch.

Example::

    from pollux_opt.jobs import ElasticJob, WorkerPool

    with WorkerPool(spares=1) as pool:
        job = ElasticJob("digits-cnn", "runs/digits", pool=pool)
        job.start(1)
        job.rescale(2)
        report = job.wait()        # until completed, stopped or failed
        report.final_metric, report.restart_delay
        job.close()
"""

from __future__ import annotations

from ._runtime import (
    LR_SCALING_RULES,
    TORCH_MISSING,
    BuildContext,
    ElasticJob,
    Event,
    JobParts,
    JobReport,
    JobSpec,
    JobState,
    Measurements,
    RuntimeOptions,
    WorkerPool,
    get_job,
    job_names,
    register_job,
    training_job,
)
from ._runtime._profile import heldout_error, profile_throughput

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
    "get_job",
    "heldout_error",
    "job_names",
    "profile_throughput",
    "register_job",
    "training_job",
]
