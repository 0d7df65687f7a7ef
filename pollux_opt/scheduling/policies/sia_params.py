"""Sia's objective constants (Jayaram Subramanya et al., SOSP 2023).

Sia's configuration set, the (nodes, replicas) shapes its integer program
chooses from, is :func:`pollux_opt.model.configs.typed_configurations`.

The objective constants, as the artifact sets them (``sia-simulator/simulator_config.py``,
"Sia params", the values of the paper's integer program: the fairness power
p, the no-allocation penalty and the allocation-change penalty):

- :data:`SIA_P`: the power of the normalised goodputs (fairness), -0.5;
- :data:`SIA_LAMBDA_NO_ALLOC`: the value of a job left without resources,
  1.1; it must exceed 1 in magnitude (the least gain of an allocation is 1
  after normalisation) and carry the sign opposite to p;
- :data:`SIA_LAMBDA_CHANGE`: penalty on changing a job's allocation, 0.01;
- the restart factor: Pollux's (``sia_use_pollux_realloc_factor = True``),
  :func:`pollux_opt.model.job.restart_factor`, with the policy's per-model
  restart estimates :data:`SIA_RESTART_PENALTY`.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "SIA_GOODPUT_CLIP",
    "SIA_ROUND_DECIMALS",
    "SIA_ZERO_ALLOC_GAIN",
    "SIA_LAMBDA_CHANGE",
    "SIA_LAMBDA_NO_ALLOC",
    "SIA_P",
    "SIA_RESTART_PENALTY",
    "SIA_DEFAULT_RESTART_PENALTY",
    "sia_restart_penalty",
]

#: Fairness power p of Sia's objective (artifact ``sia_default_p_val``).
SIA_P = -0.5
#: Penalty of a job left without an allocation (artifact ``sia_default_lambda_n``).
SIA_LAMBDA_NO_ALLOC = 1.1
#: Penalty of a change of a job's allocation (artifact ``sia_default_lambda_a``).
SIA_LAMBDA_CHANGE = 0.01
#: Normalised goodputs above this are clipped (artifact ``sia_goodput_clip_val``).
SIA_GOODPUT_CLIP = 3000.0
#: Floor of a normalised goodput, so that powers with p < 0 stay finite
#: (artifact ``sia-simulator/sia.py``, ``ZERO_ALLOC_GAIN``).
SIA_ZERO_ALLOC_GAIN = 1e-4
#: Decimals the powered goodputs are rounded to before the integer program
#: (artifact ``sia.py``, ``__power_up_speedup_matrix``: ``np.round(..., 2)``).
SIA_ROUND_DECIMALS = 2
#: The policy's restart-time estimates per model, seconds (artifact
#: ``sia-simulator/sia.py``, ``get_restart_penalty``; matched by substring of the job name).
SIA_RESTART_PENALTY: Mapping[str, float] = {
    "deepspeech": 25.0, "imagenet": 250.0, "cifar": 30.0, "bert": 120.0, "yolov3": 45.0,
}
#: Restart estimate of any other model, seconds (same source).
SIA_DEFAULT_RESTART_PENALTY = 30.0


def sia_restart_penalty(job_id: str) -> float:
    """Sia's policy's restart estimate for a job, seconds: by the model named in
    its id (:data:`SIA_RESTART_PENALTY`, matched by substring), else
    :data:`SIA_DEFAULT_RESTART_PENALTY`."""
    for name, seconds in SIA_RESTART_PENALTY.items():
        if name in job_id:
            return seconds
    return SIA_DEFAULT_RESTART_PENALTY
