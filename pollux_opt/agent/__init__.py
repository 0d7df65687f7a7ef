"""The job agent: what a training job measures, the goodput model it fits, and
the batch it picks for its allocation (the "PolluxAgent" of Pollux, OSDI 2021,
section 4.1).

Pure numpy, no torch and no processes: the real runtime
(:mod:`pollux_opt.runtime`) and the simulator (:mod:`pollux_opt.backends.sim`)
run the same agent.

* :mod:`~pollux_opt.agent.measurements`: measured step times per configuration;
* :mod:`~pollux_opt.agent.stats`: gradient statistics and the AdaScale gain;
* :mod:`~pollux_opt.agent.agent`: :class:`JobAgent`, the measurements, the
  refit rule and the goodput model;
* :mod:`~pollux_opt.agent.batch`: :func:`choose_batch`, the batch a job runs
  on an allocation.
"""

from __future__ import annotations

from pollux_opt.agent.agent import JobAgent
from pollux_opt.agent.batch import choose_batch

__all__ = ["JobAgent", "choose_batch"]
