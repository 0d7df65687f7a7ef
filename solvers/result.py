"""The one result type every solver returns.

"Why it stopped" (:class:`Status`) is kept apart from "how good" (objective,
bound, gap) so that a time-limited answer is never mistaken for an optimal one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

__all__ = ["Status", "Result"]


class Status(str, enum.Enum):
    """Termination status of a solver run (why it stopped, not how good)."""

    #: Proven optimal within the requested relative MIP gap.
    OPTIMAL = "optimal"
    #: A heuristic finished normally; feasible, but no optimality proof.
    FEASIBLE = "feasible"
    #: Time limit hit with a feasible incumbent: the best one found is returned.
    TIME_LIMIT = "time_limit"
    #: Time limit hit before any feasible solution: the current placement is returned.
    TIME_LIMIT_NO_SOLUTION = "time_limit_no_solution"
    #: The constraints admit no placement.
    INFEASIBLE = "infeasible"
    #: The solver failed for another reason (see ``Result.message``).
    ERROR = "error"

    @property
    def has_solution(self) -> bool:
        """True when ``Result.placement`` is a solver-found feasible placement."""
        return self in (Status.OPTIMAL, Status.FEASIBLE, Status.TIME_LIMIT)


@dataclass(frozen=True)
class Result:
    """Outcome of one solver run on a :class:`solvers.Problem`.

    Attributes:
        placement: int64[J, N] replicas of job j on node n.
        status: why the solver stopped.
        objective: pinned power-mean objective of ``placement``, recomputed
            independently of the solver's internal model (higher is better).
        bound: best proven upper bound on the objective (``nan`` if the
            solver proves none, as for heuristics).
        gap: relative gap ``(bound - objective) / |bound|`` (``nan`` if no bound).
        build_seconds: wall seconds spent building the model (or compiling).
        solve_seconds: wall seconds spent in the solver proper.
        solver: registry name of the solver.
        message: human-readable detail from the backend.
        stats: solver-specific extras (for example ``compile_seconds``).
    """

    placement: np.ndarray
    status: Status
    objective: float
    bound: float
    gap: float
    build_seconds: float
    solve_seconds: float
    solver: str
    message: str = ""
    stats: Mapping[str, Any] = field(default_factory=dict)
