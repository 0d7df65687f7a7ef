"""Input checks every solver shares, so that all raise the same messages.

The conformance suite (:mod:`solvers.conformance`) pins these messages for
every registered solver.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import InvalidProblem
from .problem import Problem

__all__ = ["check_problem", "check_time_limit"]

_NUMBER = (int, float, np.integer, np.floating)


def check_problem(problem: Any) -> None:
    """Raise :class:`InvalidProblem` unless ``problem`` is a :class:`Problem`."""
    if not isinstance(problem, Problem):
        raise InvalidProblem(f"problem must be a solvers.Problem, got {type(problem).__name__}")


def check_time_limit(time_limit: Any) -> None:
    """Raise :class:`InvalidProblem` unless ``time_limit`` is None or finite seconds > 0."""
    if time_limit is None:
        return
    if (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, _NUMBER)
        or not math.isfinite(time_limit)
        or time_limit <= 0
    ):
        raise InvalidProblem(f"time_limit must be a positive number of seconds, got {time_limit!r}")
