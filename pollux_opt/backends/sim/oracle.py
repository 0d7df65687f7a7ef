"""The step oracle of the simulator: true remaining work and step times (Optimus+Oracle only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pollux_opt.agent.batch import split_batch
from pollux_opt.backends.sim.state import SimJob, batch_limits

__all__ = ["Oracle"]


class Oracle:
    """True remaining work and step times, for Optimus+Oracle only.

    The oracle answers from the hidden profiles; no other policy gets one.

    Args:
        jobs: the simulator's jobs by id (read live: each job's current epoch).
    """

    def __init__(self, jobs: Mapping[str, SimJob]) -> None:
        self._jobs = jobs

    def remaining_steps(self, job_id: str, batch_size: int) -> float:
        """Optimizer steps at a fixed ``batch_size`` from the current epoch to completion."""
        job = self._jobs[job_id]
        p = job.profile
        b = min(max(batch_size, p.init_batch_size), p.max_batch_size)
        return max(p.iterations(b, p.max_epochs) - p.iterations(b, job.epoch), 1.0)

    def step_time(self, job_id: str, placement: Sequence[int], batch_size: int) -> float:
        """True seconds per optimizer step of ``batch_size`` on ``placement`` (replicas per node)."""
        p = self._jobs[job_id].profile
        local, accum = split_batch(batch_size, sum(placement), batch_limits(p))
        step, sync = p.step_sync(tuple(placement), local)
        return step + accum * (step - sync)

    def max_local_bsz(self, job_id: str) -> int:
        return self._jobs[job_id].profile.max_local_bsz

    def min_local_bsz(self, job_id: str) -> int:
        return self._jobs[job_id].profile.min_local_bsz
