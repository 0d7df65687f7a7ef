"""Node types (GPU models): a job uses nodes of one type, its configurations are (type, nodes, replicas)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solvers import InvalidProblem, Problem, evaluate, job_values, solve, violations
from solvers.milp import write_model
from solvers.testing import brute_force, random_problem, random_typed_problem

#: The MILP stops at a relative gap of 1e-4 by default.
MILP_REL_GAP = 1e-4


def _tiny(seed: int, **kwargs) -> Problem:
    """Three jobs on 2 + 1 nodes of two types: small enough for the brute force."""
    return random_typed_problem(seed, (2, 1), (2, 3), 3, max_replicas_limit=4, **kwargs)


def _fields(problem: Problem) -> dict:
    return {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)}


def _relabelled(problem: Problem, kind: int) -> Problem:
    """``problem`` with every node and configuration of type ``kind``."""
    return dataclasses.replace(
        problem,
        node_type=np.full(problem.num_nodes, kind, np.int64),
        cfg_type=np.full(problem.num_configs, kind, np.int64),
    )


def _check_types_respected(problem: Problem, placement: np.ndarray) -> None:
    kind, mixed = problem.placement_types(placement)
    assert not mixed.any()
    reps, nodes = placement.sum(axis=1), (placement > 0).sum(axis=1)
    placed = reps > 0
    s = problem.lookup_speedup(np.arange(problem.num_jobs), nodes, reps, kind)
    assert not np.isnan(s[placed]).any()


# ---------------------------------------------------------------- the Problem
def test_types_default_to_zero_and_count():
    untyped = random_problem(0)
    assert untyped.num_types == 1 and not untyped.typed
    assert np.array_equal(untyped.node_type, np.zeros(untyped.num_nodes))
    assert np.array_equal(untyped.cfg_type, np.zeros(untyped.num_configs))
    typed = random_typed_problem(0)
    assert typed.num_types == 3 and typed.typed
    assert np.bincount(typed.node_type).tolist() == [6, 3, 2]
    assert typed.capacity.sum() == 64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"node_type": [0, 1]}, r"node_type must have shape \(3,\), got \(2,\)"),
        ({"node_type": [0, -1, 1]}, r"node_type\[1\] must be a type index in \[0, 3\), got -1"),
        ({"node_type": [0, 0, 3]}, r"node_type\[2\] must be a type index in \[0, 3\), got 3"),
        ({"node_type": [[0, 0, 1]]}, r"node_type must have shape \(3,\), got \(1, 3\)"),
        ({"node_type": ["a", 0, 1]}, r"node_type must convert to int64"),
        ({"cfg_type": [0]}, r"cfg_type must have shape \(\d+,\), got \(1,\)"),
        ({"cfg_type": "neg"}, r"cfg_type\[0\] must be a type index in \[0, 3\), got -1"),
        ({"cfg_type": "two"}, r"cfg_type\[0\] = 2 \(job 0\) names a type no node has"),
        ({"cfg_type": "zeros"}, r"job 0 at \(type=0, nodes=1, replicas=\d+\) lists the same \(type, nodes, replicas\) twice"),
    ],
)
def test_bad_types_are_rejected_naming_the_field_and_value(change, message):
    problem = _tiny(1)
    size = problem.num_configs
    named = {"neg": np.full(size, -1), "two": np.full(size, 2), "zeros": np.zeros(size)}
    change = {k: named.get(v, v) if isinstance(v, str) else v for k, v in change.items()}
    with pytest.raises(InvalidProblem, match=message):
        Problem(**{**_fields(problem), **change})


def test_lookup_speedup_takes_the_type_and_keeps_the_untyped_call():
    problem = _tiny(2)
    jobs, nodes, reps, kinds = problem.cfg_job, problem.cfg_nodes, problem.cfg_replicas, problem.cfg_type
    assert np.array_equal(problem.lookup_speedup(jobs, nodes, reps, kinds), problem.cfg_speedup)
    other = problem.lookup_speedup(jobs, nodes, reps, 1 - kinds)
    for c in range(problem.num_configs):  # the same shape on the other type is its own configuration
        twin = (jobs == jobs[c]) & (nodes == nodes[c]) & (reps == reps[c]) & (kinds == 1 - kinds[c])
        assert (np.isnan(other[c]) and not twin.any()) or other[c] == problem.cfg_speedup[twin][0]
    untyped = random_problem(3)
    args = (untyped.cfg_job, untyped.cfg_nodes, untyped.cfg_replicas)
    assert np.array_equal(untyped.lookup_speedup(*args), untyped.cfg_speedup)
    assert np.array_equal(untyped.lookup_speedup(*args, np.zeros_like(untyped.cfg_job)), untyped.cfg_speedup)
    assert np.isnan(untyped.lookup_speedup(*args, np.ones_like(untyped.cfg_job))).all()


def test_a_job_on_two_types_is_a_violation_with_a_clear_message():
    problem = _tiny(1)
    x = np.zeros((problem.num_jobs, problem.num_nodes), dtype=np.int64)
    x[0] = [1, 0, 1]  # nodes 0 (type 0) and 2 (type 1)
    assert "job 0: spans nodes of several types [0, 1]" in violations(problem, x)
    with pytest.raises(InvalidProblem, match=r"job 0 is placed on nodes of several types \[0, 1\]"):
        job_values(problem, x)


def test_a_shape_listed_on_one_type_only_is_not_allowed_on_the_other():
    problem = Problem(
        capacity=[2, 2],
        cfg_job=[0],
        cfg_nodes=[1],
        cfg_replicas=[2],
        cfg_speedup=[1.5],
        current=[[0, 0]],
        restart_factor=[1.0],
        weight=[1.0],
        min_replicas=[0],
        max_replicas=[2],
        node_type=[0, 1],
        cfg_type=[1],
    )
    assert evaluate(problem, [[0, 2]]) == pytest.approx(1.501, rel=1e-12)
    assert violations(problem, [[2, 0]]) == [
        "job 0 is placed on (type=0, nodes=1, replicas=2), which is not one of its allowed configurations"
    ]
    for solver in ("milp", "greedy"):
        assert solve(problem, solver).placement.tolist() == [[0, 2]]


# ------------------------------------------------------------ exact answers
@pytest.mark.parametrize("seed", range(10))
def test_milp_equals_brute_force_on_tiny_typed_problems(seed):
    problem = _tiny(seed, interference_avoidance=seed % 2 == 0, weighted=seed % 3 == 0)
    best, _ = brute_force(problem)
    result = solve(problem, "milp", mip_gap=0.0)
    assert not violations(problem, result.placement)
    _check_types_respected(problem, result.placement)
    assert result.objective == pytest.approx(best, rel=1e-9)
    greedy = solve(problem, "greedy")
    assert not violations(problem, greedy.placement) and greedy.objective <= best * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_large_formulation_is_feasible_and_bounded_on_typed_problems(seed):
    problem = random_typed_problem(seed, (4, 2, 2), (4, 8, 8), 20, interference_avoidance=seed % 2 == 0)
    exact = solve(problem, "milp", formulation="exact")
    large = solve(problem, "milp", formulation="large")
    for result in (exact, large):
        assert not violations(problem, result.placement)
        _check_types_respected(problem, result.placement)
        assert result.bound >= exact.objective * (1 - MILP_REL_GAP)
    assert large.objective <= exact.bound * (1 + 1e-9)


def test_running_jobs_may_keep_their_typed_placement():
    problem = random_typed_problem(5, num_jobs=30, running_fraction=1.0)
    result = solve(problem, "milp")
    kept = np.all(result.placement == problem.current, axis=1) & problem.has_current
    assert kept.any() and not violations(problem, result.placement)
    keep = evaluate(problem, problem.current)
    assert result.objective >= keep * (1 - 1e-12)


# ------------------------------------------------- one type: today's answers
def _untyped_cases():
    for seed in range(6):
        yield random_problem(seed, num_nodes=4 + seed, cpus_per_node=2 + seed % 3, num_jobs=6 + 2 * seed,
                             interference_avoidance=seed % 3 != 1, weighted=seed % 2 == 1)


@pytest.mark.parametrize("problem", list(_untyped_cases()), ids=lambda p: f"{p.num_nodes}x{p.num_jobs}")
def test_all_zero_types_give_exactly_the_untyped_answer(problem):
    zeros = _relabelled(problem, 0)
    assert not zeros.typed
    for solver, options in (("milp", {}), ("milp", {"formulation": "large"}), ("greedy", {})):
        a, b = solve(problem, solver, **options), solve(zeros, solver, **options)
        assert np.array_equal(a.placement, b.placement)
        assert np.array_equal([a.objective, a.bound, a.gap], [b.objective, b.bound, b.gap], equal_nan=True)
        assert (a.status, a.stats) == (b.status, b.stats)


@pytest.mark.parametrize("problem", list(_untyped_cases()), ids=lambda p: f"{p.num_nodes}x{p.num_jobs}")
def test_one_type_through_the_typed_path_gives_the_untyped_optimum(problem):
    """Every node and configuration of type 1 (so type 0 has no node): the typed code, the same optimum."""
    one = _relabelled(problem, 1)
    assert one.typed
    a, b = solve(problem, "milp", mip_gap=0.0), solve(one, "milp", mip_gap=0.0)
    assert not violations(one, b.placement)
    assert b.objective == pytest.approx(a.objective, rel=1e-9)
    assert evaluate(problem, b.placement) == b.objective
    g_untyped, g_typed = solve(problem, "greedy"), solve(one, "greedy")
    assert np.array_equal(g_untyped.placement, g_typed.placement) and g_untyped.objective == g_typed.objective


# --------------------------------------------------------------- properties
@st.composite
def typed_problems(draw):
    types = draw(st.integers(1, 3))
    counts = tuple(draw(st.integers(1, 3)) for _ in range(types))
    caps = tuple(draw(st.sampled_from([1, 2, 4, 8])) for _ in range(types))
    return random_typed_problem(
        draw(st.integers(0, 2**31)),
        counts,
        caps,
        draw(st.integers(1, 8)),
        p=draw(st.sampled_from([-1.0, 0.0, 1.0])),
        max_replicas_limit=draw(st.integers(1, 8)),
        interference_avoidance=draw(st.booleans()),
        weighted=draw(st.booleans()),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_problems())
def test_typed_answers_are_feasible_typed_and_ordered(problem):
    milp, greedy = solve(problem, "milp"), solve(problem, "greedy")
    for result in (milp, greedy):
        assert not violations(problem, result.placement)
        _check_types_respected(problem, result.placement)
        assert result.objective == evaluate(problem, result.placement)
    assert milp.objective >= greedy.objective * (1 - MILP_REL_GAP) - 1e-12
    assert milp.bound >= milp.objective * (1 - 1e-12)


# ----------------------------------------------------------- other solvers
def test_the_evolutionary_solver_rejects_node_types():
    with pytest.raises(
        InvalidProblem, match=r"the evolutionary solver does not support node types \(problem has 2 types\); use milp or greedy"
    ):
        solve(_tiny(0), "evolutionary")


def test_the_exported_model_is_typed(tmp_path):
    problem = _tiny(4, interference_avoidance=True)
    text = write_model(problem, tmp_path / "model.lp").read_text()
    kinds = {int(k) for k in re.findall(r"single_items\((\d+)_\d+\)", text)}
    assert kinds == {0, 1}  # rows per (type, size)


@pytest.mark.parametrize("seed", range(6))
def test_typed_placements_encode_at_their_utility_and_decode_back(seed):
    """Exactness on typed models: the MILP's answer and random placements are model solutions of equal value."""
    from solvers.milp import option_table
    from solvers.milp.compiled import compile_model
    from solvers.milp.model import pyomo_model
    from solvers.milp.packing import packing_graph
    from solvers.milp.solve import utility_sum
    from solvers.milp.warmstart import decode_placement, warm_start_values
    from solvers.testing import random_placement

    problem = random_typed_problem(seed, (3, 2), (2, 4), 6, max_replicas_limit=6, interference_avoidance=seed % 2 == 0)
    table = option_table(problem)
    graph = packing_graph(problem, table, np.ones(table.job.size, dtype=bool))
    form = compile_model(pyomo_model(problem, table, graph))
    placements = [solve(problem, "milp").placement] + [random_placement(seed + k, problem) for k in range(8)]
    encoded = 0
    for i, placement in enumerate(placements):
        values = warm_start_values(problem, table, graph, placement)
        if values is None:
            assert i > 0, "the MILP's own answer must encode"
            continue  # a random placement may use a dominated configuration
        encoded += 1
        x = form.column_vector(values)
        activity = form.A @ x
        assert np.all(activity >= form.row_lo - 1e-9) and np.all(activity <= form.row_up + 1e-9)
        assert float(form.c @ x + form.offset) == pytest.approx(utility_sum(problem, placement), rel=1e-9, abs=1e-9)
        decoded = decode_placement(problem, table, graph, values)
        assert not violations(problem, decoded)
        assert evaluate(problem, decoded) >= evaluate(problem, placement) * (1 - 1e-9)
    assert encoded >= 2
