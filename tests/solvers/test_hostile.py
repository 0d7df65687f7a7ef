"""Hostile inputs: the problem's domain, extreme values, time limits on every path, huge instances."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

import solvers
from solvers import (
    GEOMETRIC_P,
    MAX_CPUS,
    MAX_REPLICAS,
    MAX_SPEEDUP,
    P_RANGE,
    SOLVERS,
    WEIGHT_RANGE,
    InvalidProblem,
    OutOfTime,
    Problem,
    Status,
    evaluate,
    power_mean,
    solve,
    violations,
)
from solvers.conformance import check_result
from solvers.milp import packing
from solvers.milp import compiled as milp_compiled
from solvers.milp import solve as milp_solve
from solvers.milp.budget import MAX_ARCS
from solvers.milp.highs_model import HighsRun
from solvers.milp.options import option_table
from solvers.milp.packing import CAP_LEVELS_ABOVE, packing_graph
from solvers.milp.strategy import ExactFormulation
from solvers.stress import large_problem
from solvers.testing import random_problem

#: How far past its time limit a solve may end (the clock is read between
#: steps of milliseconds; 2-core machine under load), HiGHS's own overrun aside.
OVERRUN = 0.5
#: Evolutionary options of these tests (small: one compile per padded shape).
EVO_OPTIONS = {"population_size": 8, "generations": 4}


def _fields(problem: Problem) -> dict:
    return {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)}


def _base() -> Problem:
    return random_problem(3, num_nodes=4, cpus_per_node=4, num_jobs=6)


def _with(**changes) -> Problem:
    return Problem(**{**_fields(_base()), **changes})


@pytest.fixture(scope="module", autouse=True)
def warm_up():
    """Import the MILP's and the greedy's dependencies once, so that no test's clock includes it."""
    problem = random_problem(0, num_nodes=2, cpus_per_node=2, num_jobs=3)
    for solver in ("milp", "greedy"):
        solve(problem, solver)


# ------------------------------------------------------------------ the domain
def test_domain_bounds_are_exported():
    assert solvers.MAX_CPUS == solvers.problem.MAX_CPUS == 2**31 - 1
    assert solvers.MAX_REPLICAS == 2**31 - 1
    assert solvers.MAX_SPEEDUP == 2.0**31
    assert solvers.P_RANGE == (-5.0, 5.0)
    assert solvers.WEIGHT_RANGE == (1e-6, 1e6)


def test_values_at_the_bounds_are_accepted():
    base = _base()
    problem = _with(
        capacity=np.full(base.num_nodes, MAX_CPUS),
        cfg_speedup=np.full(base.num_configs, MAX_SPEEDUP),
        weight=np.where(np.arange(base.num_jobs) % 2, WEIGHT_RANGE[0], WEIGHT_RANGE[1]),
        max_replicas=np.full(base.num_jobs, MAX_REPLICAS),
        max_nodes_per_job=MAX_REPLICAS,
        p=P_RANGE[0],
    )
    assert problem.p == P_RANGE[0]
    assert _with(p=P_RANGE[1]).p == P_RANGE[1]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"p": -5.01}, r"p must be in P_RANGE = \[-5\.0, 5\.0\], got -5\.01"),
        ({"p": 1e6}, r"p must be in P_RANGE = \[-5\.0, 5\.0\], got 1000000\.0"),
        ({"p": -300.0}, r"p must be in P_RANGE = \[-5\.0, 5\.0\], got -300\.0"),
        ({"p": float("inf")}, r"p must be finite, got inf"),
        ({"p": 10**400}, r"p must be a float, got 1000000"),
        ({"p": "x"}, r"p must be a float, got 'x'"),
        ({"weight": [1e308, 1e308, 1, 1, 1, 1]}, r"weight\[0\] must be in WEIGHT_RANGE = \[1e-06, 1e\+06\], got 1e\+308"),
        ({"weight": [1, 1e-300, 1, 1, 1, 1]}, r"weight\[1\] must be in WEIGHT_RANGE = \[1e-06, 1e\+06\], got 1e-300"),
        ({"weight": [1, 1, 0, 1, 1, 1]}, r"weight\[2\] must be finite and > 0, got 0\.0"),
        ({"capacity": [4, 4, 2**31, 4]}, r"capacity\[2\] must be <= MAX_CPUS = 2147483647, got 2147483648"),
        ({"capacity": [4, 0, 4, 4]}, r"capacity\[1\] must be > 0, got 0"),
        ({"capacity": [4, 10**30, 4, 4]}, r"capacity must convert to int64: "),
        ({"max_replicas": [2**31, 16, 16, 16, 16, 16]}, r"max_replicas\[0\] must be <= MAX_REPLICAS = 2147483647, got 2147483648"),
        ({"max_nodes_per_job": 2**31}, r"max_nodes_per_job must be in \[1, 2147483647\], got 2147483648"),
        ({"max_nodes_per_job": 0}, r"max_nodes_per_job must be in \[1, 2147483647\], got 0"),
        ({"max_nodes_per_job": 10**30}, r"max_nodes_per_job must be in \[1, 2147483647\], got 10{30}"),
    ],
)
def test_out_of_domain_values_are_rejected(changes, message):
    with pytest.raises(InvalidProblem, match=message):
        _with(**changes)


def test_speedup_above_the_maximum_is_rejected():
    base = _base()
    speedup = base.cfg_speedup.copy()
    speedup[0] = MAX_SPEEDUP * 2
    message = r"speedup of job 0 at \(nodes=1, replicas=\d+\) must be <= MAX_SPEEDUP = 2147483648\.0, got 4294967296\.0"
    with pytest.raises(InvalidProblem, match=message):
        _with(cfg_speedup=speedup)


def test_lookup_finds_every_configuration_and_nothing_else():
    problem = _base()
    jobs, nodes, reps = problem.cfg_job, problem.cfg_nodes, problem.cfg_replicas
    assert np.array_equal(problem.lookup_speedup(jobs, nodes, reps), problem.cfg_speedup)
    table = problem.speedup_table
    j, a, r = np.meshgrid(*(np.arange(n) for n in table.shape), indexing="ij")
    expected = np.where((a == 0) & (r == 0), np.nan, table)
    assert np.array_equal(problem.lookup_speedup(j, a, r), expected, equal_nan=True)


# ------------------------------------------------------------------ the power mean
@pytest.mark.parametrize("p", [1e-7, 1e-8, -1e-8, 1e-12, GEOMETRIC_P / 2, 1e-300, -1e-300])
def test_power_mean_tends_to_the_geometric_mean(p):
    x, w = np.array([0.0, 0.5, 3.0, 1e6]), np.array([1.0, 2.0, 1.0, 1e-3])
    geometric = power_mean(x, w, 0.0)
    assert math.isclose(power_mean(x, w, p), geometric, rel_tol=max(abs(p), 1e-15) * 1e3)


def test_power_mean_keeps_the_direct_formula_on_ordinary_values():
    x, w = np.array([0.0, 0.5, 3.0]), np.array([1.0, 2.0, 1.0])
    for p in (-4.0, -1.0, 1.0, 0.5):
        direct = float((np.sum(w * np.power(x + 1e-3, p)) / np.sum(w)) ** (1.0 / p))
        assert power_mean(x, w, p) == direct


@pytest.mark.parametrize("p", [P_RANGE[0], -1.0, 2.0, P_RANGE[1]])
def test_power_mean_is_finite_at_the_ends_of_the_domain(p):
    x = np.array([0.0, MAX_SPEEDUP, 1e-9])
    w = np.array([WEIGHT_RANGE[0], WEIGHT_RANGE[1], 1.0])
    value = power_mean(x, w, p)
    assert 1e-3 <= value <= MAX_SPEEDUP + 1e-3


# ------------------------------------------------------------------ tiny p
@pytest.mark.parametrize("p", [1e-8, 1e-7, -1e-7, 1e-12, 1e-300])
def test_tiny_p_finds_the_geometric_optimum(p):
    problem = random_problem(11, num_nodes=4, cpus_per_node=4, num_jobs=6)
    geometric = solve(dataclasses.replace(problem, p=0.0), "milp")
    result = solve(dataclasses.replace(problem, p=p), "milp")
    greedy = solve(dataclasses.replace(problem, p=p), "greedy")
    assert result.status is Status.OPTIMAL
    assert math.isclose(result.objective, geometric.objective, rel_tol=1e-5)
    assert result.objective >= greedy.objective * (1 - 1e-6)
    assert result.gap <= solvers.DEFAULT_MIP_GAP


# ------------------------------------------------------------------ deadlines on every path
def test_round_loop_ends_when_the_relaxation_is_not_finite(monkeypatch):
    real = milp_solve.relax

    def broken(problem, table, deadline=None):
        rel = real(problem, table, deadline)
        return dataclasses.replace(rel, bound=math.nan, reduced_cost=np.full_like(rel.reduced_cost, np.nan))

    monkeypatch.setattr(milp_solve, "relax", broken)
    problem = random_problem(5, num_nodes=4, cpus_per_node=4, num_jobs=8)
    start = time.perf_counter()
    result = solve(problem, "milp", time_limit=2.0)
    assert time.perf_counter() - start < 2.0 + OVERRUN + result.stats.get("highs_overrun_seconds", 0.0)
    check_result(problem, result, "milp")
    assert result.status is not Status.ERROR


def test_round_loop_ends_when_widening_adds_nothing(monkeypatch):
    monkeypatch.setattr(ExactFormulation, "widen", lambda self, rel, offered, best: offered.copy())
    problem = random_problem(104, num_nodes=16, cpus_per_node=4, num_jobs=20)
    result = solve(problem, "milp", formulation="exact")
    check_result(problem, result, "milp")
    assert result.stats["rounds"] <= milp_solve.MAX_ROUNDS


def test_time_limit_covers_the_model_build(monkeypatch):
    slow_seconds, limit = 0.6, 0.4
    real = milp_compiled.assemble

    def slow(*args):
        time.sleep(slow_seconds)
        return real(*args)

    monkeypatch.setattr(milp_compiled, "assemble", slow)
    monkeypatch.setattr(SOLVERS["milp"].solver, "structures", milp_compiled.StructureCache(0))  # build every model
    problem = random_problem(7, num_nodes=16, cpus_per_node=4, num_jobs=40)
    start = time.perf_counter()
    result = solve(problem, "milp", time_limit=limit)
    assert time.perf_counter() - start < slow_seconds + OVERRUN
    assert result.status is Status.TIME_LIMIT
    assert result.message.startswith("time limit reached before round 1 was solved")
    check_result(problem, result, "milp")
    assert result.objective >= evaluate(problem, problem.current)


def test_highs_time_limit_without_a_solution_falls_back_to_a_feasible_placement(monkeypatch):
    import highspy

    def timed_out(form, start, **options):
        return HighsRun(None, highspy.HighsModelStatus.kTimeLimit, math.nan, "Time limit reached", 0, 1, 1)

    monkeypatch.setattr(milp_solve, "run_highs", timed_out)
    problem = random_problem(7, num_nodes=16, cpus_per_node=4, num_jobs=40)
    result = solve(problem, "milp", time_limit=1.0)
    assert result.status is Status.TIME_LIMIT
    assert result.stats["fallback"] in ("greedy", "warm start")
    check_result(problem, result, "milp")
    assert result.objective >= evaluate(problem, problem.current)


def test_out_of_time_in_a_stage_is_caught(monkeypatch):
    def out_of_time(*args, **kwargs):
        raise OutOfTime

    monkeypatch.setattr(milp_solve, "packing_graph", out_of_time)
    problem = random_problem(7, num_nodes=16, cpus_per_node=4, num_jobs=40)
    result = solve(problem, "milp", time_limit=5.0)
    assert result.status is Status.TIME_LIMIT
    check_result(problem, result, "milp")


# ------------------------------------------------------------------ node size
def _one_job(cpus: int, replicas=(1, 2), speedups=(1.0, 1.8)) -> Problem:
    return Problem(
        capacity=[cpus],
        cfg_job=[0] * len(replicas),
        cfg_nodes=[1] * len(replicas),
        cfg_replicas=list(replicas),
        cfg_speedup=list(speedups),
        current=[[0]],
        restart_factor=[1.0],
        weight=[1.0],
        min_replicas=[0],
        max_replicas=[max(replicas)],
    )


@pytest.mark.parametrize("cpus", [10**3, 10**5, 10**9, MAX_CPUS])
def test_cost_does_not_grow_with_node_capacity(cpus):
    problem = _one_job(cpus)
    table = option_table(problem)
    graph = packing_graph(problem, table, np.ones(table.job.size, dtype=bool))
    assert graph.levels == CAP_LEVELS_ABOVE
    start = time.perf_counter()
    result = solve(problem, "milp", time_limit=5.0)
    assert time.perf_counter() - start < 1.0
    assert result.status is Status.OPTIMAL
    assert result.placement.tolist() == [[2]]


@pytest.mark.parametrize("interference", [True, False])
def test_capping_the_levels_keeps_the_optimum(monkeypatch, interference):
    """Levels capped at the most a node can host give the optimum of the uncapped graph."""
    problem = random_problem(21, num_nodes=4, cpus_per_node=4, num_jobs=10, interference_avoidance=interference)
    problem = dataclasses.replace(problem, capacity=np.full(4, 300))  # each job uses at most 16 CPUs
    capped = solve(problem, "milp", formulation="exact", mip_gap=0.0)
    monkeypatch.setattr(packing, "CAP_LEVELS_ABOVE", 10**9)
    uncapped = solve(problem, "milp", formulation="exact", mip_gap=0.0)
    assert capped.status is uncapped.status is Status.OPTIMAL
    assert math.isclose(capped.objective, uncapped.objective, rel_tol=1e-12)


def test_a_packing_graph_too_large_falls_back_to_the_greedy():
    sizes = np.arange(1, 2001)  # equal speedups up to 1e-9: every size is offered, and stacks on the node
    problem = _one_job(10**6, replicas=sizes, speedups=1.0 + 1e-12 * sizes)
    start = time.perf_counter()
    result = solve(problem, "milp", formulation="exact", time_limit=5.0)
    assert time.perf_counter() - start < 2.0
    assert result.stats["fallback"] == "greedy"
    assert f"packing graph over MAX_ARCS = {MAX_ARCS} arcs" in result.message
    assert result.status is Status.OPTIMAL  # the relaxation's bound proves the greedy's answer within the gap
    check_result(problem, result, "milp")


# ------------------------------------------------------------------ extreme weights and speedups
@pytest.mark.parametrize("solver", ["milp", "greedy", pytest.param("evolutionary", marks=pytest.mark.slow)])
def test_extreme_weights_and_speedups_are_scored(solver):
    base = _base()
    problem = _with(
        weight=np.where(np.arange(base.num_jobs) % 2, WEIGHT_RANGE[0], WEIGHT_RANGE[1]),
        cfg_speedup=np.minimum(base.cfg_speedup * 1e9, MAX_SPEEDUP),
        p=P_RANGE[1],
    )
    result = solve(problem, solver, **(EVO_OPTIONS if solver == "evolutionary" else {}))
    check_result(problem, result, solver)
    assert result.status is not Status.ERROR
    assert 1e9 <= result.objective <= MAX_SPEEDUP


def test_the_evolutionary_solver_rejects_what_it_cannot_hold():
    problem = large_problem(0, num_nodes=64, cpus_per_node=4, num_jobs=12_000)
    with pytest.raises(InvalidProblem, match=r"problem too large for the evolutionary solver: population of 100 x 64"):
        solve(problem, "evolutionary")
    wide = _one_job(2**30)
    with pytest.raises(InvalidProblem, match=r"problem too large for the evolutionary solver: int32 placements overflow"):
        solve(wide, "evolutionary")


# ------------------------------------------------------------------ huge but legal
def test_huge_replica_limits_and_capacities_solve_quickly():
    base = random_problem(8, num_nodes=4, cpus_per_node=4, num_jobs=12)
    problem = dataclasses.replace(base, capacity=np.full(4, 10**6), max_replicas=np.full(12, 10**9))
    for solver in ("milp", "greedy"):
        start = time.perf_counter()
        result = solve(problem, solver, time_limit=5.0)
        assert time.perf_counter() - start < 2.0
        check_result(problem, result, solver)
        assert result.status in (Status.OPTIMAL, Status.FEASIBLE)


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["milp", "greedy"])
def test_two_hundred_thousand_jobs_finish_within_the_time_limit(solver):
    problem = large_problem(0, num_nodes=64, cpus_per_node=4, num_jobs=200_000)
    limit = 10.0
    start = time.perf_counter()
    result = solve(problem, solver, time_limit=limit)
    assert time.perf_counter() - start < limit + 2.0
    assert result.status in (Status.TIME_LIMIT, Status.FEASIBLE, Status.OPTIMAL)
    assert not violations(problem, result.placement)
    assert result.objective >= evaluate(problem, problem.current)
