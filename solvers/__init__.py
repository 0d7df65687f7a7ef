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


#: Registry: solver name -> the function that runs it.  Each function takes the
#: problem positionally and its options as keywords (see each solver's docstring).
SOLVERS: dict[str, SolverFn] = {}


def _register(name: str, module: str, func: str) -> None:
    def run(problem: Problem, **options: Any) -> Result:
        import importlib

        return getattr(importlib.import_module(module, __name__), func)(problem, **options)

    run.__name__ = f"solve_{name}"
    run.__qualname__ = run.__name__
    run._target = (module, func)  # type: ignore[attr-defined]
    SOLVERS[name] = run


_register("milp", ".milp", "solve_milp")
_register("evolutionary", ".evolutionary", "solve_evolutionary")
_register("greedy", ".greedy", "solve_greedy")


def solver_options(name: str) -> tuple[str, ...]:
    """Names of the keyword options the solver ``name`` accepts."""
    import importlib

    fn = SOLVERS[name]
    module, func = fn._target  # type: ignore[attr-defined]
    target = getattr(importlib.import_module(module, __name__), func)
    params = inspect.signature(target).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


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
