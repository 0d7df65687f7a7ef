"""The "milp" solver: exactness, properties, options, the large formulation, anchors."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from solvers import (
    DEFAULT_MIP_GAP,
    MAX_SPEEDUP,
    P_RANGE,
    WEIGHT_RANGE,
    InvalidProblem,
    Problem,
    Status,
    evaluate,
    solve,
    violations,
)
from solvers.milp import (
    AUTO_LARGE_OPTIONS,
    choose_formulation,
    highs_status,
    option_table,
    prune_dominated,
    relax,
    solve_milp,
)
from solvers.milp.compiled import compile_model
from solvers.milp.model import pyomo_model
from solvers.milp.packing import packing_graph
from solvers.milp.solve import utility_sum
from solvers.milp.warmstart import decode_placement, warm_start_values
from solvers.testing import brute_force, edge_problems, random_placement, random_problem

#: Where the measured Pollux rounds live (read from there, never copied here).
ANCHORS = Path(__file__).resolve().parents[2].parent / "shared" / "anchors" / "pollux-ga-rounds"
#: Relative slack when comparing objectives computed two ways.
RTOL = 1e-9
#: Relative MIP gap the solver stops at by default; a better placement may beat it by this much.
MILP_GAP = DEFAULT_MIP_GAP
#: Largest enumeration the brute-force reference is allowed.
MAX_PLACEMENTS = 50_000
#: Hypothesis settings shared by the property tests (solves are ~10 ms; brute force dominates).
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tiny_problems(draw, flat: bool = False) -> Problem:
    """Random problems small enough to enumerate (1-3 nodes of 1-3 CPUs, 1-4 jobs).

    With ``flat``, a job's speedup depends on the node count only through "one
    node or several" (like the anchors), so the solver merges configurations.
    """
    seed = draw(st.integers(0, 2**32 - 1))
    problem = random_problem(
        seed,
        num_nodes=draw(st.integers(1, 3)),
        cpus_per_node=draw(st.integers(1, 3)),
        num_jobs=draw(st.integers(1, 4)),
        p=draw(st.sampled_from([-1.0, 0.0, 1.0, -4.0])),
        running_fraction=draw(st.sampled_from([0.0, 0.5, 1.0])),
        max_nodes_per_job=draw(st.integers(1, 3)),
        drop_fraction=draw(st.sampled_from([0.0, 0.3])),
        interference_avoidance=draw(st.booleans()),
        weighted=draw(st.booleans()),
    )
    if flat:
        problem = _flatten(problem)
    return problem


def _flatten(problem: Problem) -> Problem:
    """The same problem with every multi-node speedup replaced by the job's 2-node one at that K."""
    table = problem.speedup_table
    two = np.minimum(problem.cfg_nodes, 2)
    spd = table[problem.cfg_job, two, problem.cfg_replicas]
    spd = np.where(np.isnan(spd), problem.cfg_speedup, spd)
    return dataclasses.replace(problem, cfg_speedup=spd)


def _optimum(problem: Problem) -> float:
    try:
        return brute_force(problem, max_placements=MAX_PLACEMENTS)[0]
    except ValueError:
        assume(False)
        raise


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-12)


# ------------------------------------------------------------------ exactness
@PROPERTY
@given(tiny_problems())
def test_objective_equals_brute_force(problem):
    best = _optimum(problem)
    result = solve(problem, "milp", formulation="exact", mip_gap=0.0)
    assert result.status is Status.OPTIMAL
    assert _close(result.objective, best)
    assert result.bound >= best * (1 - RTOL)


@PROPERTY
@given(tiny_problems(flat=True))
def test_objective_equals_brute_force_with_merged_node_ranges(problem):
    best = _optimum(problem)
    result = solve(problem, "milp", formulation="exact", mip_gap=0.0)
    assert _close(result.objective, best)


@pytest.mark.parametrize(("name", "problem"), list(edge_problems()), ids=[n for n, _ in edge_problems()])
def test_edge_problems_match_brute_force(name, problem):
    best = brute_force(problem)[0]
    result = solve(problem, "milp")
    assert result.status is Status.OPTIMAL
    assert not violations(problem, result.placement)
    assert _close(result.objective, best)


@PROPERTY
@given(tiny_problems())
def test_bounds_hold(problem):
    """The Lagrangian bound and the reported bound are upper bounds on the optimum."""
    best = _optimum(problem)
    table = option_table(problem)
    rel = relax(problem, table)
    _, placement = brute_force(problem, max_placements=MAX_PLACEMENTS)
    best_utility = utility_sum(problem, placement)
    assert rel.bound >= best_utility - RTOL * max(1.0, abs(best_utility))
    assert np.all(rel.reduced_cost >= -RTOL * max(1.0, abs(rel.bound)))
    for formulation in ("exact", "large"):
        result = solve(problem, "milp", formulation=formulation)
        assert result.bound >= best * (1 - RTOL)
        assert result.objective <= best * (1 + RTOL)


# ------------------------------------------------------------------ properties
#: Exponents of the "never below greedy" property: tiny ones (|p| <= 1e-7 once
#: made the MILP call a placement 74 times worse than greedy's optimal), the
#: ends of P_RANGE and ordinary ones.
EXTREME_P = [1e-8, 1e-7, -1e-7, 1e-12, 1e-300, 0.5, -0.5, P_RANGE[0], P_RANGE[1], -1.0, 2.0]
#: Factors on the speedups (the plain utility's differences vanish far from 1).
SPEEDUP_SCALES = [1e-3, 1.0, 1e3, 1e6]
#: Relative slack of "MILP >= greedy".  The MILP runs with mip_gap 0, but HiGHS
#: still stops at an absolute gap of 1e-6 on the utility sum (mip_abs_gap),
#: which is at most about 6e-5 of a sum the utility scale keeps above 2^-6.
GREEDY_RTOL = 1e-4


@st.composite
def extreme_problems(draw) -> Problem:
    """:func:`tiny_problems` with p, speedup scale and weights from the ends of the domain."""
    problem = draw(tiny_problems())
    scale = draw(st.sampled_from(SPEEDUP_SCALES))
    weights = draw(st.lists(st.sampled_from([WEIGHT_RANGE[0], 1.0, WEIGHT_RANGE[1]]), min_size=problem.num_jobs, max_size=problem.num_jobs))
    return dataclasses.replace(
        problem,
        p=draw(st.sampled_from(EXTREME_P)),
        cfg_speedup=np.minimum(problem.cfg_speedup * scale, MAX_SPEEDUP),
        weight=draw(st.sampled_from([problem.weight, np.array(weights)])),
    )


#: Two jobs of weight 1e-6 whose log-utility choices differ by 3e-8, below
#: HiGHS's absolute gap unless the geometric mean's weights are rescaled.
TINY_WEIGHT_GEOMETRIC = Problem(
    capacity=[2], cfg_job=[0, 0, 1], cfg_nodes=[1, 1, 1], cfg_replicas=[1, 2, 2],
    cfg_speedup=[0.001, 0.00141807, 0.00137163], current=np.zeros((2, 1)), restart_factor=[0.0, 0.9903743],
    weight=[1e-6, 1e-6], min_replicas=[0, 2], max_replicas=[2, 2], p=1e-300, max_nodes_per_job=1,
    interference_avoidance=False,
)


@PROPERTY
@given(extreme_problems())
@example(TINY_WEIGHT_GEOMETRIC)
def test_never_below_greedy(problem):
    """An optimal MILP answer is at least as good as the greedy's, whatever p, speedups and weights."""
    greedy = solve(problem, "greedy")
    result = solve(problem, "milp", mip_gap=0.0)
    assert result.status is Status.OPTIMAL
    assert result.objective >= greedy.objective * (1 - GREEDY_RTOL)
    assert result.bound >= greedy.objective * (1 - GREEDY_RTOL)


@PROPERTY
@given(extreme_problems())
def test_restricted_formulation_claims_optimal_only_within_its_bound(problem):
    """The restricted formulation says OPTIMAL only when its bound proves it, so never below the greedy."""
    greedy = solve(problem, "greedy")
    result = solve(problem, "milp", mip_gap=0.0, formulation="large")
    assert result.status in (Status.OPTIMAL, Status.FEASIBLE)
    assert result.bound >= greedy.objective * (1 - GREEDY_RTOL)
    if result.status is Status.OPTIMAL:
        assert result.objective >= greedy.objective * (1 - GREEDY_RTOL)


def test_lp_dive_answer_is_not_called_optimal():
    """Two jobs that cannot share the nodes (interference avoidance): the dive keeps the worse one, and says so."""
    problem = Problem(
        capacity=[2, 8, 100_000],
        cfg_job=[0, 0, 1], cfg_nodes=[2, 3, 3], cfg_replicas=[5, 8, 3], cfg_speedup=[4.607, 4.3, 1.725],
        current=np.zeros((2, 3)), restart_factor=[1.0, 1.0], weight=[1.0, 2.0],
        min_replicas=[3, 1], max_replicas=[10, 12], p=0.5, max_nodes_per_job=5000,
    )
    exact = solve(problem, "milp", formulation="exact")
    large = solve(problem, "milp", formulation="large")
    assert exact.status is Status.OPTIMAL and exact.objective == pytest.approx(exact.bound)
    assert exact.objective >= solve(problem, "greedy").objective * (1 - GREEDY_RTOL)
    assert large.objective < exact.objective * (1 - 1e-3)
    assert large.status is Status.FEASIBLE and large.bound >= exact.objective


@PROPERTY
@given(tiny_problems(), st.integers(0, 2**32 - 1))
def test_beats_random_feasible_placements(problem, seed):
    result = solve(problem, "milp")
    for k in range(5):
        placement = random_placement(seed + k, problem, fill_fraction=0.8)
        assert not violations(problem, placement)
        assert result.objective >= evaluate(problem, placement) * (1 - MILP_GAP)


@PROPERTY
@given(tiny_problems())
def test_placement_respects_every_constraint(problem):
    result = solve(problem, "milp")
    x = result.placement
    assert not violations(problem, x)
    assert np.all(x.sum(axis=0) <= problem.capacity)
    reps, nodes = x.sum(axis=1), (x > 0).sum(axis=1)
    placed = reps > 0
    assert np.all(reps[placed] >= problem.min_replicas[placed])
    assert np.all(reps[placed] <= problem.max_replicas[placed])
    assert np.all(nodes <= problem.max_nodes_per_job)
    if problem.interference_avoidance:
        assert np.all(((x > 0) & (nodes > 1)[:, None]).sum(axis=0) <= 1)
    assert _close(result.objective, evaluate(problem, x))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_objective_is_recomputed_on_16_nodes(seed, interference):
    problem = random_problem(
        seed, num_nodes=16, cpus_per_node=4, num_jobs=20, interference_avoidance=interference
    )
    result = solve(problem, "milp")
    assert result.status is Status.OPTIMAL
    assert not violations(problem, result.placement)
    assert _close(result.objective, evaluate(problem, result.placement))
    assert result.gap <= MILP_GAP


@PROPERTY
@given(tiny_problems(), st.randoms(use_true_random=False))
def test_invariant_under_job_permutation_and_node_relabelling(problem, rnd):
    jobs = list(range(problem.num_jobs))
    nodes = list(range(problem.num_nodes))
    rnd.shuffle(jobs)
    rnd.shuffle(nodes)
    jobs, nodes = np.array(jobs), np.array(nodes)
    new_index = np.argsort(jobs)  # old job -> new position
    order = np.argsort(new_index[problem.cfg_job], kind="stable")
    permuted = dataclasses.replace(
        problem,
        capacity=problem.capacity[nodes],
        cfg_job=new_index[problem.cfg_job][order],
        cfg_nodes=problem.cfg_nodes[order],
        cfg_replicas=problem.cfg_replicas[order],
        cfg_speedup=problem.cfg_speedup[order],
        current=problem.current[jobs][:, nodes],
        restart_factor=problem.restart_factor[jobs],
        weight=problem.weight[jobs],
        min_replicas=problem.min_replicas[jobs],
        max_replicas=problem.max_replicas[jobs],
    )
    a = solve(problem, "milp", mip_gap=0.0)
    b = solve(permuted, "milp", mip_gap=0.0)
    assert _close(a.objective, b.objective)


@PROPERTY
@given(tiny_problems(), st.integers(1, 3))
def test_adding_a_node_never_lowers_the_optimum(problem, cpus):
    bigger = dataclasses.replace(
        problem,
        capacity=np.append(problem.capacity, cpus),
        current=np.hstack([problem.current, np.zeros((problem.num_jobs, 1), dtype=np.int64)]),
    )
    before = solve(problem, "milp", mip_gap=0.0)
    after = solve(bigger, "milp", mip_gap=0.0)
    assert after.objective >= before.objective * (1 - RTOL)


def test_unchanged_placement_pays_no_restart_factor():
    # One running job already at its best shape; moving it would cost f = 0.25.
    problem = Problem(
        capacity=[4, 4],
        cfg_job=[0, 0, 0],
        cfg_nodes=[1, 1, 2],
        cfg_replicas=[1, 2, 2],
        cfg_speedup=[1.0, 1.9, 1.5],
        current=[[2, 0]],
        restart_factor=[0.25],
        weight=[1.0],
        min_replicas=[0],
        max_replicas=[2],
    )
    result = solve(problem, "milp")
    assert result.placement.tolist() == [[2, 0]]
    assert _close(result.objective, 1.9 + 1e-3)
    # The same shape on the other node is a move and pays the factor.
    assert _close(evaluate(problem, np.array([[0, 2]])), 1.9 * 0.25 + 1e-3)


# ------------------------------------------------------- formulation internals
@PROPERTY
@given(tiny_problems(), st.integers(0, 2**32 - 1))
def test_every_feasible_placement_encodes_at_its_utility(problem, seed):
    """The converse half of exactness: a feasible placement is a model solution of equal value."""
    placement = random_placement(seed, problem, fill_fraction=0.9)
    keep_rows = np.all(placement == problem.current, axis=1) & problem.has_current
    placement[keep_rows] = problem.current[keep_rows]
    table = option_table(problem)
    graph = packing_graph(problem, table, np.ones(table.job.size, dtype=bool))
    model = pyomo_model(problem, table, graph)
    values = warm_start_values(problem, table, graph, placement)
    # A placement that uses a dominated configuration needs the dominating one instead.
    assume(values is not None)
    form = compile_model(model)
    x = form.column_vector(values)
    activity = form.A @ x
    assert np.all(activity >= form.row_lo - 1e-9) and np.all(activity <= form.row_up + 1e-9)
    assert np.all(x >= form.col_lo) and np.all(x <= form.col_up)
    assert _close(float(form.c @ x + form.offset), utility_sum(problem, placement))
    decoded = decode_placement(problem, table, graph, values)
    assert not violations(problem, decoded)
    assert evaluate(problem, decoded) >= evaluate(problem, placement) * (1 - RTOL)


def _naive_prune(problem: Problem) -> np.ndarray:
    keep = np.ones(problem.num_configs, dtype=bool)
    for c in range(problem.num_configs):
        j, n, k, s = problem.cfg_job[c], problem.cfg_nodes[c], problem.cfg_replicas[c], problem.cfg_speedup[c]
        for o in range(problem.num_configs):
            n2, k2 = problem.cfg_nodes[o], problem.cfg_replicas[o]
            if problem.cfg_job[o] != j or problem.cfg_speedup[o] < s or (n2, k2) == (n, k):
                continue
            if n2 <= n and k2 <= -(-k * n2 // n) and (n2 < n or k2 < k):
                keep[c] = False
    return keep


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.3]))
def test_vectorised_pruning_matches_the_pairwise_rule(seed, drop):
    problem = random_problem(seed, num_nodes=4, cpus_per_node=3, num_jobs=3, drop_fraction=drop)
    problem = _flatten(problem) if seed % 2 else problem
    assert np.array_equal(prune_dominated(problem), _naive_prune(problem))


def test_auto_switches_formulation_by_model_size():
    small = random_problem(0, num_nodes=4, cpus_per_node=4, num_jobs=4)
    # A large cluster does not make a small model: few jobs on 2048 CPUs stay exact.
    wide = dataclasses.replace(small, capacity=np.full(4, 512), current=np.zeros_like(small.current))
    many = random_problem(0, num_nodes=128, cpus_per_node=4, num_jobs=256)
    assert option_table(wide).job.size < AUTO_LARGE_OPTIONS <= option_table(many).job.size
    assert choose_formulation(small).name == "exact"
    assert choose_formulation(wide).name == "exact"
    assert choose_formulation(many).name == "large"
    assert choose_formulation(many, "exact").name == "exact"
    assert solve(small, "milp").stats["formulation"] == "exact"


def test_highs_status_table_maps_the_statuses_we_rely_on():
    import highspy

    ms = highspy.HighsModelStatus
    assert highs_status()[ms.kOptimal] == (Status.OPTIMAL, Status.ERROR)
    assert highs_status()[ms.kTimeLimit] == (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION)
    assert highs_status()[ms.kInfeasible][0] is Status.INFEASIBLE


# ------------------------------------------------------------------ time limit
def test_time_limit_returns_the_best_feasible_placement():
    problem = random_problem(0, num_nodes=128, cpus_per_node=4, num_jobs=250)
    result = solve(problem, "milp", formulation="exact", time_limit=1e-3)
    assert result.status in (Status.TIME_LIMIT, Status.TIME_LIMIT_NO_SOLUTION)
    if result.status is Status.TIME_LIMIT:
        assert not violations(problem, result.placement)
        assert _close(result.objective, evaluate(problem, result.placement))
        # The warm start is the current placement, so the answer is at least as good.
        assert result.objective >= evaluate(problem, problem.current) * (1 - RTOL)
        assert result.bound >= result.objective
    else:
        assert np.array_equal(result.placement, problem.current)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"time_limit": 0}, r"time_limit must be a positive number of seconds, got 0"),
        ({"time_limit": -2.5}, r"time_limit must be a positive number of seconds, got -2\.5"),
        ({"time_limit": True}, r"time_limit must be a positive number of seconds, got True"),
        ({"mip_gap": 1.0}, r"mip_gap must be in \[0, 1\), got 1\.0"),
        ({"mip_gap": -0.1}, r"mip_gap must be in \[0, 1\), got -0\.1"),
        ({"mip_gap": "0.01"}, r"mip_gap must be in \[0, 1\), got '0\.01'"),
        ({"formulation": "sia"}, r"formulation must be one of \['auto', 'exact', 'large'\], got 'sia'"),
        ({"formulation": None}, r"formulation must be one of \['auto', 'exact', 'large'\], got None"),
        ({"no_such": 1}, r"unknown option 'no_such' for solver 'milp'"),
    ],
)
def test_bad_options_are_rejected(options, message):
    problem = random_problem(0, 2, 2, 2)
    with pytest.raises(InvalidProblem, match=message):
        solve(problem, "milp", **options)


def test_non_problem_is_rejected():
    with pytest.raises(InvalidProblem, match=r"problem must be a solvers\.Problem, got list"):
        solve_milp([[4]])


# ------------------------------------------------------------ large formulation
@pytest.mark.parametrize("interference", [True, False])
def test_large_formulation_is_feasible_with_an_honest_bound(interference):
    problem = random_problem(
        7, num_nodes=64, cpus_per_node=4, num_jobs=125, interference_avoidance=interference
    )
    large = solve(problem, "milp", formulation="large")
    exact = solve(problem, "milp", formulation="exact")
    assert large.stats["formulation"] == "large"
    assert large.status in (Status.OPTIMAL, Status.FEASIBLE)
    assert not violations(problem, large.placement)
    assert _close(large.objective, evaluate(problem, large.placement))
    assert large.bound >= large.objective
    assert large.bound >= exact.objective * (1 - RTOL)  # the bound holds for the unrestricted problem
    assert large.objective <= exact.objective * (1 + RTOL)
    assert large.gap <= 0.01


# ------------------------------------------------------------------ anchors
def _anchor_files() -> list[Path]:
    return sorted(ANCHORS.glob("*.json")) if ANCHORS.is_dir() else []


def _load_anchor(path: Path):
    from pollux_opt.model import parse_instance, to_problem

    data = json.loads(path.read_text())
    inst = parse_instance(data["instance"])
    problem = to_problem(inst.cluster, inst.jobs, inst.options)
    nodes = {nid: i for i, nid in enumerate(inst.cluster.node_ids)}
    ga = np.zeros_like(problem.current)
    for j, job in enumerate(inst.jobs):
        for nid, k in data["reference"]["ga_placement"].get(job.id, {}).items():
            ga[j, nodes[nid]] = k
    return problem, ga, data["reference"]


@pytest.mark.skipif(not ANCHORS.is_dir(), reason=f"measured Pollux rounds not found at {ANCHORS}")
@pytest.mark.parametrize("path", _anchor_files(), ids=lambda p: p.stem)
def test_anchor_rounds_match_or_beat_ga(path):
    problem, ga, reference = _load_anchor(path)
    assert math.isclose(evaluate(problem, ga), reference["ga_objective_pinned"], rel_tol=1e-9)
    result = solve(problem, "milp")
    assert result.status is Status.OPTIMAL
    assert not violations(problem, result.placement)
    assert result.objective >= reference["ga_objective_pinned"] * (1 - 1e-12)


def test_threads_option_works_after_a_default_run():
    problem = random_problem(1, 4, 4, 6)
    default = solve(problem, "milp", formulation="exact", mip_gap=0.0)
    single = solve(problem, "milp", formulation="exact", mip_gap=0.0, threads=1)
    again = solve(problem, "milp", formulation="exact", mip_gap=0.0)
    assert single.status is Status.OPTIMAL and again.status is Status.OPTIMAL
    assert _close(single.objective, default.objective) and _close(again.objective, default.objective)
