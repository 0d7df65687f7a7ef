"""The shared conformance suite over every registered solver, and solver-vs-solver properties.

Until a registered solver's module exists, its cases fail to import; select the
others with ``-k "not milp"``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solvers import SOLVERS, InvalidProblem, Result, Status, evaluate, solve, violations
from solvers import conformance
from solvers.testing import (
    brute_force,
    edge_problems,
    random_placement,
    random_problem,
    speedup_model,
)

#: Small genetic-algorithm settings for the property test: one compiled program
#: shared by every example (the instances all pad to the same shapes).
EVO_SMALL = {"population_size": 16, "generations": 30}
#: The MILP stops at a relative gap of 1e-4 by default, so a heuristic may beat
#: its incumbent by at most that much.
MILP_REL_GAP = 1e-4


@pytest.mark.parametrize(
    ("solver", "check"), list(conformance.cases()), ids=[f"{s}-{c}" for s, c in conformance.cases()]
)
def test_conformance(solver: str, check: str) -> None:
    conformance.run_check(solver, check)


def test_registry_has_evolutionary_and_greedy() -> None:
    assert {"evolutionary", "greedy"} <= set(SOLVERS)


def test_unknown_solver_is_rejected() -> None:
    problem = random_problem(0, 2, 2, 3)
    with pytest.raises(InvalidProblem, match=r"unknown solver 'nope'; choose one of \["):
        solve(problem, "nope")


def test_run_check_rejects_unknown_names() -> None:
    with pytest.raises(KeyError, match="unknown solver 'nope'"):
        conformance.run_check("nope", "bad_input")


# ------------------------------------------------------------- check_result can fail
def _result(problem, placement, status=Status.FEASIBLE, objective=None, **kw) -> Result:
    if objective is None:
        objective = evaluate(problem, placement)
    fields = dict(
        placement=np.asarray(placement, dtype=np.int64),
        status=status,
        objective=objective,
        bound=math.nan,
        gap=math.nan,
        build_seconds=0.0,
        solve_seconds=0.0,
        solver="fake",
    )
    fields.update(kw)
    return Result(**fields)


def test_check_result_accepts_a_correct_result() -> None:
    problem = random_problem(0, 2, 2, 3)
    conformance.check_result(problem, _result(problem, problem.current), "fake")


def test_check_result_rejects_an_infeasible_solution() -> None:
    problem = random_problem(0, 2, 2, 3)
    bad = np.full((3, 2), 5)
    with pytest.raises(conformance.ConformanceError, match="the placement breaks"):
        conformance.check_result(problem, _result(problem, bad, objective=1.0), "fake")


def test_check_result_rejects_a_wrong_objective() -> None:
    problem = random_problem(0, 2, 2, 3)
    result = _result(problem, problem.current, objective=evaluate(problem, problem.current) * 1.01)
    with pytest.raises(conformance.ConformanceError, match=r"!= evaluate\(placement\)"):
        conformance.check_result(problem, result, "fake")


def test_check_result_rejects_no_solution_that_is_not_the_current_placement() -> None:
    problem = random_problem(0, 2, 2, 3)
    result = _result(
        problem, problem.current + 1, status=Status.TIME_LIMIT_NO_SOLUTION, objective=math.nan
    )
    with pytest.raises(conformance.ConformanceError, match="must return the current placement"):
        conformance.check_result(problem, result, "fake")


def test_check_result_rejects_a_bound_below_the_objective() -> None:
    problem = random_problem(0, 2, 2, 3)
    obj = evaluate(problem, problem.current)
    result = _result(problem, problem.current, bound=obj / 2, gap=0.0)
    with pytest.raises(conformance.ConformanceError, match="below the objective"):
        conformance.check_result(problem, result, "fake")


# ------------------------------------------------------------------ instance tools
def test_random_problem_is_seeded_with_a_feasible_current_placement() -> None:
    a = random_problem(5, 8, 4, 20)
    b = random_problem(np.random.default_rng(5), 8, 4, 20)
    for field in dataclasses.fields(a):
        assert np.array_equal(getattr(a, field.name), getattr(b, field.name))
    assert violations(a, a.current) == []
    assert a.has_current.sum() > 0


def test_random_problem_tables_are_concave_in_replicas() -> None:
    problem = random_problem(3, 4, 4, 10)
    table = problem.speedup_table
    for j in range(problem.num_jobs):
        for a in range(1, table.shape[1]):
            row = table[j, a][~np.isnan(table[j, a])]
            if row.size >= 3:
                assert np.all(np.diff(row, 2) <= 1e-12)
                assert np.all(np.diff(row) > 0)


def test_speedup_model_is_one_at_one_replica() -> None:
    assert speedup_model(1, 1, 0.3, 0.2) == pytest.approx(1.0)


def test_random_placement_is_feasible() -> None:
    problem = random_problem(2, 4, 4, 10, drop_fraction=0.3)
    for seed in range(5):
        assert violations(problem, random_placement(seed, problem)) == []


def test_brute_force_beats_every_random_placement() -> None:
    problem = random_problem(4, 2, 2, 3)
    best, placement = brute_force(problem)
    assert evaluate(problem, placement) == pytest.approx(best)
    for seed in range(20):
        assert evaluate(problem, random_placement(seed, problem)) <= best + 1e-12


def test_brute_force_refuses_large_problems() -> None:
    with pytest.raises(ValueError, match="placements > max_placements=10"):
        brute_force(random_problem(0, 3, 3, 4), max_placements=10)


def test_edge_problems_include_infeasible_current_placements() -> None:
    infeasible = [name for name, p in edge_problems() if violations(p, p.current)]
    assert {"invalid_current", "shared_multi_node", "holes"} <= set(infeasible)


# ---------------------------------------------------------- MILP >= the heuristics
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_nodes=st.integers(1, 4),
    cpus=st.integers(1, 3),
    num_jobs=st.integers(1, 6),
    p=st.sampled_from([-1.0, 0.0, 1.0]),
    interference=st.booleans(),
)
def test_milp_objective_is_at_least_the_heuristics(
    seed: int, num_nodes: int, cpus: int, num_jobs: int, p: float, interference: bool
) -> None:
    problem = random_problem(
        seed, num_nodes, cpus, num_jobs, p=p, interference_avoidance=interference, drop_fraction=0.2
    )
    milp = solve(problem, "milp")
    assert milp.status is Status.OPTIMAL
    floor = milp.objective + MILP_REL_GAP * abs(milp.objective) + 1e-12
    for name, options in (("evolutionary", EVO_SMALL), ("greedy", {})):
        other = solve(problem, name, **options)
        assert other.objective <= floor, (name, other.objective, milp.objective)
        assert other.objective <= milp.bound + 1e-9 or math.isnan(milp.bound)
