"""The shared conformance suite: contracts every solver in :data:`solvers.SOLVERS` keeps.

Each check is a plain function ``check(solver, **options)`` that raises
:class:`ConformanceError` (an ``AssertionError``) on the first broken contract,
so the suite runs under pytest or from a script alike.  ``options`` are passed
to every solve call (for example a smaller population to make a test faster);
by default each solver runs with its own defaults, as users call it.

Checks (see :data:`CHECKS`):

* ``random_instances``: on seeded random problems (:func:`solvers.testing.random_problem`,
  several sizes, ``p`` in {-1, 0, 1}, interference on and off, tables with holes)
  the solver finishes with a solution (``OPTIMAL`` or ``FEASIBLE``) that
  :func:`check_result` accepts and that is never worse than keeping the current
  placement when that is feasible;
* ``typed_instances``: the same on seeded problems with node types
  (:func:`solvers.testing.random_typed_problem`); a solver listed in
  :data:`NO_TYPE_SUPPORT` must instead reject them with
  :class:`~solvers.InvalidProblem` (:data:`TYPE_REJECTION`);
* ``edge_cases``: the same on :func:`solvers.testing.edge_problems` (no jobs, a
  job with no allowed pair, infeasible current placements, holes in tables);
* ``status_contract``: under a tiny time limit the result still keeps the
  contract of its status (a solution is feasible; ``TIME_LIMIT_NO_SOLUTION``
  returns the current placement);
* ``repeatable``: solving the same problem twice gives the same placement;
* ``bad_input``: an unknown option (through :func:`solvers.solve`), a bad
  ``time_limit`` and a problem that is not a :class:`~solvers.Problem` are
  rejected with :class:`~solvers.InvalidProblem` and the same messages for
  every solver (:data:`BAD_INPUT_MESSAGES`).

Usage from pytest (``tests/solvers/test_conformance.py``)::

    @pytest.mark.parametrize(("solver", "check"), list(conformance.cases()))
    def test_conformance(solver, check):
        conformance.run_check(solver, check)
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from . import SOLVERS, solve
from .errors import InvalidProblem
from .placement import evaluate, violations
from .problem import Problem
from .result import Result, Status
from .testing import edge_problems, random_problem, random_typed_problem

__all__ = [
    "BAD_INPUT_MESSAGES",
    "CHECKS",
    "ConformanceError",
    "cases",
    "check_result",
    "run_check",
]

#: Relative tolerance between a reported objective and its recomputation.
OBJECTIVE_RTOL = 1e-9
#: Absolute slack for comparisons of objectives (the power mean is >= EPS-scale).
OBJECTIVE_ATOL = 1e-12
#: A time limit short enough that no solver finishes a moderate instance in it.
TINY_TIME_LIMIT = 1e-3
#: Random instances: (seed, num_nodes, cpus_per_node, num_jobs, keyword options).
RANDOM_INSTANCES: tuple[tuple[int, int, int, int, dict], ...] = (
    (0, 2, 2, 3, {}),
    (1, 3, 2, 5, {"p": 0.0}),
    (2, 4, 4, 8, {}),
    (3, 4, 4, 8, {"p": 1.0, "weighted": True}),
    (4, 3, 4, 6, {"interference_avoidance": False, "drop_fraction": 0.3}),
    (5, 4, 2, 8, {"drop_fraction": 0.5, "max_nodes_per_job": 2}),
)
#: Typed instances: (seed, nodes per type, capacity per type, num_jobs, keyword options).
TYPED_INSTANCES: tuple[tuple[int, tuple, tuple, int, dict], ...] = (
    (0, (2, 1), (2, 4), 4, {}),
    (1, (6, 3, 2), (4, 8, 8), 20, {}),
    (2, (3, 2), (4, 8), 10, {"interference_avoidance": False, "p": 0.0}),
    (3, (2, 2, 2), (2, 4, 8), 12, {"weighted": True, "running_fraction": 1.0}),
)
#: Registered solvers that do not support node types; they must reject a typed problem.
NO_TYPE_SUPPORT = frozenset({"evolutionary"})
#: Pattern of their rejection message.
TYPE_REJECTION = r"does not support node types \(problem has \d+ types\)"
#: The instance of the time-limit check (large enough not to finish in TINY_TIME_LIMIT).
TIME_LIMIT_INSTANCE = (7, 16, 4, 40)
#: Patterns of the InvalidProblem messages every solver must give; ``{solver}``
#: is replaced by the solver's name.
BAD_INPUT_MESSAGES: dict[str, str] = {
    "unknown_option": r"unknown option 'no_such_option' for solver '{solver}'",
    "time_limit": r"time_limit must be a positive number of seconds, got {value}",
    "problem": r"problem must be a solvers\.Problem, got dict",
}
#: Bad time limits, with how each appears in the message.
BAD_TIME_LIMITS: tuple[tuple[Any, str], ...] = (
    (0, "0"),
    (-1.0, r"-1\.0"),
    (math.nan, "nan"),
    ("1", "'1'"),
)


class ConformanceError(AssertionError):
    """A solver broke one of the shared contracts."""


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=OBJECTIVE_RTOL, abs_tol=OBJECTIVE_ATOL)


def _fail(solver: str, what: str) -> None:
    raise ConformanceError(f"solver {solver!r}: {what}")


def check_result(problem: Problem, result: Result, solver: str) -> None:
    """Check the contract of one result (types, feasibility, objective, status, bound).

    Raises:
        ConformanceError: naming the solver and the broken contract.
    """
    if not isinstance(result, Result):
        _fail(solver, f"returned {type(result).__name__}, not a Result")
    if result.solver != solver:
        _fail(solver, f"result.solver is {result.solver!r}")
    if not isinstance(result.status, Status):
        _fail(solver, f"status {result.status!r} is not a Status")
    x = result.placement
    shape = (problem.num_jobs, problem.num_nodes)
    if not isinstance(x, np.ndarray) or x.dtype != np.int64 or x.shape != shape:
        got = f"{getattr(x, 'dtype', type(x).__name__)} of shape {getattr(x, 'shape', None)}"
        _fail(solver, f"placement must be int64 of shape {shape}, got {got}")
    for name in ("build_seconds", "solve_seconds"):
        value = getattr(result, name)
        if not (math.isfinite(value) and value >= 0):
            _fail(solver, f"{name} = {value} must be finite and >= 0")
    if result.status.has_solution:
        broken = violations(problem, x)
        if broken:
            _fail(solver, f"status {result.status.value} but the placement breaks: {broken}")
        expected = evaluate(problem, x)
        if not _close(result.objective, expected):
            _fail(solver, f"objective {result.objective!r} != evaluate(placement) {expected!r}")
    else:
        if not np.array_equal(x, problem.current):
            _fail(solver, f"status {result.status.value} must return the current placement")
        if not violations(problem, x) and not math.isnan(result.objective):
            expected = evaluate(problem, x)
            if not _close(result.objective, expected):
                _fail(solver, f"objective {result.objective!r} is neither nan nor {expected!r}")
    if math.isnan(result.bound):
        if not math.isnan(result.gap):
            _fail(solver, f"gap {result.gap} without a bound")
    elif result.status.has_solution:
        if result.bound < result.objective and not _close(result.bound, result.objective):
            _fail(solver, f"bound {result.bound} below the objective {result.objective}")
        if result.bound != 0 and not math.isnan(result.gap):
            gap = (result.bound - result.objective) / abs(result.bound)
            if not math.isclose(result.gap, max(gap, 0.0), rel_tol=1e-6, abs_tol=1e-12):
                _fail(solver, f"gap {result.gap} != (bound - objective) / |bound| = {gap}")


def _check_solved(problem: Problem, result: Result, solver: str, label: str) -> None:
    """A run without a time limit: a solution, the result contract, no worse than current."""
    if result.status not in (Status.OPTIMAL, Status.FEASIBLE):
        status = result.status.value
        _fail(solver, f"{label}: status {status} without a time limit ({result.message})")
    check_result(problem, result, solver)
    if not violations(problem, problem.current):
        keep = evaluate(problem, problem.current)
        if result.objective < keep and not _close(result.objective, keep):
            _fail(solver, f"{label}: objective {result.objective} < keeping current {keep}")


def _random_instances() -> Iterator[tuple[str, Problem]]:
    for seed, nodes, cpus, jobs, kwargs in RANDOM_INSTANCES:
        label = f"random_problem({seed}, {nodes}, {cpus}, {jobs}, **{kwargs})"
        yield label, random_problem(seed, nodes, cpus, jobs, **kwargs)


def check_random_instances(solver: str, **options: Any) -> None:
    """Feasible, correctly scored, no worse than current on seeded random problems."""
    for label, problem in _random_instances():
        _check_solved(problem, solve(problem, solver, **options), solver, label)


def check_typed_instances(solver: str, **options: Any) -> None:
    """Feasible (each job on one node type, in a configuration of it), correctly scored, no worse
    than current on seeded typed problems; or, for :data:`NO_TYPE_SUPPORT`, rejected."""
    for seed, counts, caps, jobs, kwargs in TYPED_INSTANCES:
        label = f"random_typed_problem({seed}, {counts}, {caps}, {jobs}, **{kwargs})"
        problem = random_typed_problem(seed, counts, caps, jobs, **kwargs)
        if solver in NO_TYPE_SUPPORT:
            _expect_invalid(solver, TYPE_REJECTION, lambda: solve(problem, solver, **options))
        else:
            _check_solved(problem, solve(problem, solver, **options), solver, label)


def check_edge_cases(solver: str, **options: Any) -> None:
    """The same contract on the hand-made corner cases of :func:`edge_problems`."""
    for label, problem in edge_problems():
        _check_solved(problem, solve(problem, solver, **options), solver, label)


def check_status_contract(solver: str, **options: Any) -> None:
    """Under a tiny time limit the result keeps the contract of whatever status it has."""
    problem = random_problem(*TIME_LIMIT_INSTANCE)
    result = solve(problem, solver, **{**options, "time_limit": TINY_TIME_LIMIT})
    check_result(problem, result, solver)
    if result.status in (Status.INFEASIBLE, Status.ERROR):
        _fail(solver, f"status {result.status.value} on a feasible problem ({result.message})")


def check_repeatable(solver: str, **options: Any) -> None:
    """The same problem solved twice gives the same placement."""
    problem = random_problem(*RANDOM_INSTANCES[2][:4])
    first, second = (solve(problem, solver, **options) for _ in range(2))
    if not np.array_equal(first.placement, second.placement):
        _fail(solver, "two solves of the same problem gave different placements")


def _expect_invalid(solver: str, pattern: str, call: Callable[[], Any]) -> None:
    try:
        call()
    except InvalidProblem as exc:
        if not re.search(pattern, str(exc)):
            _fail(solver, f"InvalidProblem message {str(exc)!r} does not match {pattern!r}")
    except Exception as exc:  # noqa: BLE001 - any other exception breaks the contract
        _fail(solver, f"raised {type(exc).__name__}: {exc} instead of InvalidProblem ({pattern!r})")
    else:
        _fail(solver, f"accepted bad input (expected InvalidProblem matching {pattern!r})")


def check_bad_input(solver: str, **options: Any) -> None:
    """Bad input is rejected with InvalidProblem and the shared messages."""
    problem = random_problem(*RANDOM_INSTANCES[0][:4])
    pattern = BAD_INPUT_MESSAGES["unknown_option"].format(solver=re.escape(solver))
    _expect_invalid(solver, pattern, lambda: solve(problem, solver, no_such_option=1))
    for value, shown in BAD_TIME_LIMITS:
        pattern = BAD_INPUT_MESSAGES["time_limit"].format(value=shown)
        _expect_invalid(
            solver, pattern, lambda v=value: solve(problem, solver, **{**options, "time_limit": v})
        )
    _expect_invalid(
        solver, BAD_INPUT_MESSAGES["problem"], lambda: SOLVERS[solver]({"capacity": [4]}, **options)
    )


#: Check name -> check function ``check(solver, **options)``.
CHECKS: dict[str, Callable[..., None]] = {
    "random_instances": check_random_instances,
    "typed_instances": check_typed_instances,
    "edge_cases": check_edge_cases,
    "status_contract": check_status_contract,
    "repeatable": check_repeatable,
    "bad_input": check_bad_input,
}


def cases(solvers: Iterable[str] | None = None) -> Iterator[tuple[str, str]]:
    """Every (solver, check) pair for ``pytest.mark.parametrize`` (default: all registered)."""
    for solver in sorted(SOLVERS) if solvers is None else solvers:
        for check in CHECKS:
            yield solver, check


def run_check(solver: str, check: str, **options: Any) -> None:
    """Run one named check on one registered solver.

    Raises:
        ConformanceError: if the solver breaks the contract.
        KeyError: for an unknown solver or check name.
    """
    if solver not in SOLVERS:
        raise KeyError(f"unknown solver {solver!r}; registered: {sorted(SOLVERS)}")
    CHECKS[check](solver, **options)
