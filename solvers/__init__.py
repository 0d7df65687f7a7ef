"""Domain-free solvers for the allocation problem, over plain numpy arrays.

Every solver in :data:`SOLVERS` takes the same :class:`Problem` and returns the
same :class:`Result`; :func:`solve` looks a solver up by name and rejects
unknown names and options with :class:`InvalidProblem`.

Example::

    from solvers import Problem, solve
    result = solve(problem, "milp", time_limit=5.0)
    result.status, result.objective, result.placement
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from .errors import InvalidProblem, OutOfTime
from .milp.options import DEFAULT_MIP_GAP
from .objective import GEOMETRIC_P, UtilityScale
from .placement import evaluate, job_values, violations
from .problem import (
    EPS,
    MAX_CPUS,
    MAX_REPLICAS,
    MAX_SPEEDUP,
    P_RANGE,
    WEIGHT_RANGE,
    Problem,
    power_mean,
    utility,
)
from .result import Result, Status

__all__ = [
    "DEFAULT_MIP_GAP",
    "EPS",
    "GEOMETRIC_P",
    "InvalidProblem",
    "OutOfTime",
    "MAX_CPUS",
    "MAX_REPLICAS",
    "MAX_SPEEDUP",
    "P_RANGE",
    "Problem",
    "Result",
    "SOLVERS",
    "Status",
    "UtilityScale",
    "WEIGHT_RANGE",
    "evaluate",
    "job_values",
    "power_mean",
    "solve",
    "solver_options",
    "utility",
    "violations",
]

SolverFn = Callable[..., Result]


class RegisteredSolver:
    """A solver of the registry: ``attr`` of ``module``, imported on first use
    (so that ``import solvers`` stays light).

    ``attr`` names a solver function, or a solver class whose one instance
    the registry keeps (created on first use) with what it keeps between
    solves: the MILP's compiled model structures
    (:class:`solvers.milp.solve.MilpSolver`).  Either takes the problem
    positionally and its options as keywords (see its docstring).
    """

    def __init__(self, module: str, attr: str) -> None:
        self.module, self.attr = module, attr
        self._solver: SolverFn | None = None

    @property
    def solver(self) -> SolverFn:
        """The solver function, or the registry's instance of the solver class."""
        if self._solver is None:
            import importlib

            target = getattr(importlib.import_module(self.module, __name__), self.attr)
            self._solver = target() if isinstance(target, type) else target
        return self._solver

    def __call__(self, problem: Problem, **options: Any) -> Result:
        return self.solver(problem, **options)

    def options(self) -> tuple[str, ...]:
        """Names of the keyword options the solver accepts."""
        params = inspect.signature(self.solver).parameters.values()
        return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


#: Registry: solver name -> the solver that runs it.
SOLVERS: dict[str, RegisteredSolver] = {
    "milp": RegisteredSolver(".milp.solve", "MilpSolver"),
    "evolutionary": RegisteredSolver(".evolutionary", "solve_evolutionary"),
    "greedy": RegisteredSolver(".greedy", "solve_greedy"),
}


def solver_options(name: str) -> tuple[str, ...]:
    """Names of the keyword options the solver ``name`` accepts."""
    return SOLVERS[name].options()


def solve(problem: Problem, solver: str = "milp", **options: Any) -> Result:
    """Solve ``problem`` with the registered solver ``solver``.

    Raises:
        InvalidProblem: if ``solver`` is not registered or an option is unknown to it.
    """
    if solver not in SOLVERS:
        raise InvalidProblem(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)}")
    known = solver_options(solver)
    for key in options:
        if key not in known:
            raise InvalidProblem(
                f"unknown option {key!r} for solver {solver!r}; it accepts {list(known)}"
            )
    return SOLVERS[solver](problem, **options)
