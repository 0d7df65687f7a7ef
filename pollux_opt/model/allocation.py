"""The answer of :func:`pollux_opt.allocate`: placement, batch configurations and solver figures."""

from __future__ import annotations

import math
from dataclasses import dataclass

from solvers import Status

from pollux_opt.model.batch import BatchConfig

__all__ = ["Allocation"]


@dataclass(frozen=True)
class Allocation:
    """The answer of :func:`pollux_opt.allocate`.

    Attributes:
        placement: job id -> {node id: replicas} (jobs given nothing map to {}).
        batch: job id -> :class:`BatchConfig` for jobs with a goodput model and replicas.
        objective: pinned power-mean objective of ``placement``.
        bound: best proven upper bound (nan if the solver proves none).
        gap: relative gap to the bound (nan if no bound).
        status: why the solver stopped (kept apart from how good the answer is).
        build_seconds, solve_seconds: wall time of model build and solve.
        solver: name of the solver used.
    """

    placement: dict[str, dict[str, int]]
    batch: dict[str, BatchConfig]
    objective: float
    bound: float
    gap: float
    status: Status
    build_seconds: float
    solve_seconds: float
    solver: str

    def to_json(self) -> dict:
        """The CLI's JSON object (nan written as null)."""

        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "placement": self.placement,
            "objective": num(self.objective),
            "bound": num(self.bound),
            "gap": num(self.gap),
            "status": self.status.value,
            "build_seconds": self.build_seconds,
            "solve_seconds": self.solve_seconds,
            "solver": self.solver,
            "batch": {
                j: {"local_bsz": b.local_bsz, "accum_steps": b.accum_steps, "batch_size": b.batch_size}
                for j, b in self.batch.items()
            },
        }
