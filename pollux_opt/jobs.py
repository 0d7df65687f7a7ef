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

# The public names are exactly the runtime package's (one list, kept there).
from ._runtime import *  # noqa: F403
from ._runtime import __all__  # noqa: F401
