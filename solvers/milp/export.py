"""The MILP written to a file for other MILP solvers: LP or MPS, through Pyomo's writers.

The file holds the Pyomo model of :func:`solvers.milp.model.build_model`
with every option offered, which is exact on its own: its optimum is the
problem's optimum on the utility-sum scale (``solvers.milp.solve.utility_sum``;
objective sense maximise, constant term included), its variables carry the
model's names (``y[3]``, ``h[0]``, ...) and its rows the rule names of
docs/formulation.md (``one_choice[2]``, ``flow[5]``, ...).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InvalidProblem
from ..problem import Problem
from .model import build_model

__all__ = ["MODEL_FORMATS", "write_model"]

#: File suffixes Pyomo writes (it picks the writer by the suffix).
MODEL_FORMATS = (".lp", ".mps")


def write_model(problem: Problem, path: str | os.PathLike) -> Path:
    """Write the exact MILP of ``problem`` to ``path``, in the format its suffix names (``.lp`` or ``.mps``).

    Returns:
        The path written.

    Raises:
        InvalidProblem: ``problem`` is not a :class:`Problem`, or the suffix
            of ``path`` is not one of :data:`MODEL_FORMATS`.
    """
    if not isinstance(problem, Problem):
        raise InvalidProblem(f"problem must be a solvers.Problem, got {type(problem).__name__}")
    path = Path(path)
    if path.suffix not in MODEL_FORMATS:
        raise InvalidProblem(f"model file {str(path)!r}: suffix must be one of {MODEL_FORMATS}, got {path.suffix!r}")
    model, _, _ = build_model(problem)
    model.write(str(path), io_options={"symbolic_solver_labels": True})
    return path
