"""The Optimus-style greedy baseline: marginal gains, restarts, time limit, bad input."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers import InvalidProblem, Problem, Status, evaluate, solve, violations
from solvers.testing import brute_force, random_problem


def _two_jobs_one_node(p: float) -> Problem:
    """One node of 3 CPUs; job 0 scales better (1 -> 1.9) than job 1 (1 -> 1.5)."""
    return Problem(
        capacity=[3],
        cfg_job=[0, 0, 1, 1],
        cfg_nodes=[1, 1, 1, 1],
        cfg_replicas=[1, 2, 1, 2],
        cfg_speedup=[1.0, 1.9, 1.0, 1.5],
        current=[[0], [0]],
        restart_factor=[1.0, 1.0],
        weight=[1.0, 1.0],
        min_replicas=[0, 0],
        max_replicas=[2, 2],
        p=p,
    )


def test_gives_each_cpu_to_the_largest_marginal_gain() -> None:
    # Both jobs start first (0 -> 1 gains most); the third CPU goes to job 0 (+0.9 > +0.5).
    result = solve(_two_jobs_one_node(1.0), "greedy")
    assert result.placement.tolist() == [[2], [1]]
    assert result.status is Status.FEASIBLE
    assert math.isnan(result.bound) and math.isnan(result.gap)


def test_skips_disallowed_replica_counts() -> None:
    # Job 0 may only take 1 or 4 replicas; with 4 free CPUs it jumps straight to 4.
    problem = Problem(
        capacity=[4],
        cfg_job=[0, 0],
        cfg_nodes=[1, 1],
        cfg_replicas=[1, 4],
        cfg_speedup=[1.0, 3.5],
        current=[[0]],
        restart_factor=[1.0],
        weight=[1.0],
        min_replicas=[0],
        max_replicas=[4],
    )
    assert solve(problem, "greedy").placement.tolist() == [[4]]


def test_respects_min_replicas_when_starting_a_job() -> None:
    problem = Problem(
        capacity=[1, 1],
        cfg_job=[0],
        cfg_nodes=[2],
        cfg_replicas=[2],
        cfg_speedup=[1.5],
        current=[[0, 0]],
        restart_factor=[1.0],
        weight=[1.0],
        min_replicas=[2],
        max_replicas=[2],
    )
    assert solve(problem, "greedy").placement.tolist() == [[1, 1]]


@pytest.mark.parametrize("seed", range(5))
def test_never_moves_a_job_whose_move_costs_everything(seed: int) -> None:
    # Restart factor 0: a moved job is worth as much as an idle one, and the
    # greedy only takes steps that gain, so a running job keeps its placement or
    # holds nothing (when its CPUs serve others better).
    base = random_problem(seed, 4, 4, 10, running_fraction=0.8)
    problem = dataclasses.replace(base, restart_factor=np.zeros(base.num_jobs))
    result = solve(problem, "greedy")
    running = np.flatnonzero(problem.has_current)
    assert running.size > 0
    for j in running:
        row = result.placement[j]
        assert np.array_equal(row, problem.current[j]) or not row.any()
    kept = [j for j in running if result.placement[j].any()]
    assert kept  # and some do stay


def test_tiny_time_limit_returns_a_feasible_answer_with_that_status() -> None:
    problem = random_problem(4, 16, 4, 40)
    result = solve(problem, "greedy", time_limit=1e-9)
    assert result.status is Status.TIME_LIMIT
    assert violations(problem, result.placement) == []
    assert result.objective >= evaluate(problem, problem.current)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_nodes=st.integers(1, 5),
    cpus=st.integers(1, 4),
    num_jobs=st.integers(0, 10),
    p=st.sampled_from([-2.0, -1.0, 0.0, 0.5, 1.0]),
    interference=st.booleans(),
    drop=st.sampled_from([0.0, 0.3, 0.7]),
    max_nodes=st.integers(1, 4),
)
def test_feasible_scored_and_no_worse_than_keeping(
    seed: int, num_nodes: int, cpus: int, num_jobs: int, p: float, interference: bool,
    drop: float, max_nodes: int,
) -> None:
    problem = random_problem(
        seed, num_nodes, cpus, num_jobs, p=p, interference_avoidance=interference,
        drop_fraction=drop, max_nodes_per_job=max_nodes,
    )
    result = solve(problem, "greedy")
    assert violations(problem, result.placement) == []
    assert result.objective == evaluate(problem, result.placement)
    assert result.objective >= evaluate(problem, problem.current)


@pytest.mark.parametrize("seed", range(6))
def test_close_to_optimal_on_tiny_problems(seed: int) -> None:
    # A sanity floor, not a target: the greedy reaches 90 % of brute force here.
    problem = random_problem(seed, 2, 2, 3)
    best, _ = brute_force(problem)
    assert solve(problem, "greedy").objective >= 0.9 * best


def test_is_deterministic() -> None:
    problem = random_problem(9, 8, 4, 20)
    a, b = solve(problem, "greedy"), solve(problem, "greedy")
    assert np.array_equal(a.placement, b.placement)


@pytest.mark.parametrize(
    ("value", "shown"), [(0, "0"), (-2, "-2"), (math.nan, "nan"), (math.inf, "inf"), ("5", "'5'")]
)
def test_bad_time_limit_is_rejected(value, shown: str) -> None:
    message = f"time_limit must be a positive number of seconds, got {shown}"
    with pytest.raises(InvalidProblem, match=message):
        solve(random_problem(0, 2, 2, 3), "greedy", time_limit=value)


def test_problem_must_be_a_problem() -> None:
    from solvers.greedy import solve_greedy

    with pytest.raises(InvalidProblem, match="problem must be a solvers.Problem, got list"):
        solve_greedy([[1]])
