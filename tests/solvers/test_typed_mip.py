"""The typed MIP's shortcuts: packing the LP's integral choices (greedily, then as a MIP), the
LP dive, runs without a warm start, and the relaxation's and pruning's vectorised steps."""

from __future__ import annotations

import numpy as np
import pytest

from solvers import Status, solve, violations
from solvers.milp.highs_model import HighsModel
from solvers.testing import random_typed_problem

PACKED = "LP choices integral"


def _sia(seed: int, **kwargs):
    return random_typed_problem(seed, num_jobs=40, **kwargs)


def test_packing_the_lp_choices_reaches_the_full_mip_optimum(monkeypatch):
    problems = [_sia(seed, interference_avoidance=seed % 2 == 1) for seed in range(8)]
    packed = [solve(p, "milp", mip_gap=0.0) for p in problems]
    assert any(r.message.startswith(PACKED) for r in packed)  # the shortcut is exercised
    monkeypatch.setattr(HighsModel, "pack_lp_choices", lambda model, x, lp_bound, packer=None: None)
    full = [solve(p, "milp", mip_gap=0.0) for p in problems]
    for problem, a, b in zip(problems, packed, full):
        assert not violations(problem, a.placement)
        assert a.status is Status.OPTIMAL and b.status is Status.OPTIMAL
        assert a.objective == pytest.approx(b.objective, rel=1e-9)
        assert a.bound >= b.objective * (1 - 1e-9)


def test_a_packing_that_falls_short_of_the_lp_bound_leaves_the_full_mip_to_run(monkeypatch):
    # With the bound raised past any packing's value the shortcut must decline.
    real = HighsModel.pack_lp_choices
    declined = []

    def raised(model, x, lp_bound, packer=None):
        out = real(model, x, lp_bound + 1.0)
        declined.append(out is None)
        return out

    monkeypatch.setattr(HighsModel, "pack_lp_choices", raised)
    problem = _sia(1)
    result = solve(problem, "milp", mip_gap=0.0)
    assert declined and all(declined)
    assert not result.message.startswith(PACKED)
    monkeypatch.undo()
    assert result.objective == pytest.approx(solve(problem, "milp", mip_gap=0.0).objective, rel=1e-9)


def test_untyped_rounds_never_pack_the_lp_choices():
    from solvers.testing import random_problem

    for seed in range(6):
        result = solve(random_problem(seed, num_nodes=16, cpus_per_node=4, num_jobs=40), "milp")
        assert not result.message.startswith(PACKED)


def test_greedily_packed_lp_choices_match_the_packing_mip(monkeypatch):
    from solvers.milp import solve as milp_solve

    problems = [_sia(seed, interference_avoidance=seed % 3 != 0) for seed in range(10)]
    greedy = [solve(p, "milp", mip_gap=0.0) for p in problems]
    assert any("packed greedily" in r.message for r in greedy)  # the greedy is exercised
    monkeypatch.setattr(milp_solve, "pack_choices", lambda *args: None)
    mip = [solve(p, "milp", mip_gap=0.0) for p in problems]
    for problem, a, b in zip(problems, greedy, mip):
        assert "packed greedily" not in b.message
        assert not violations(problem, a.placement)
        assert a.status is Status.OPTIMAL and b.status is Status.OPTIMAL
        assert a.objective == pytest.approx(b.objective, rel=1e-9)


@pytest.mark.parametrize("seed", [28, 32, 37])
def test_a_dive_that_leaves_a_job_nothing_gives_way_to_the_full_mip(seed):
    # On these 128-GPU clusters the LP's whole choices leave an undecided job no room.
    problem = random_typed_problem(seed, (8, 6, 6), (4, 8, 8), 60)
    result = solve(problem, "milp", formulation="large")
    assert not violations(problem, result.placement)
    assert result.gap <= 1e-2
    assert not result.message.startswith("LP dive")


@pytest.mark.parametrize("seed", [23, 45, 55])
def test_a_dive_that_finds_no_room_is_repaired_by_a_greedy_packing(seed):
    # On these 256-GPU clusters the LP's whole choices cannot all be packed; the
    # greedy packing shows which can, and the dive fixing only those is kept.
    from solvers.milp.highs_model import TYPED_DIVE_GAP

    problem = random_typed_problem(seed, (16, 12, 12), (4, 8, 8), 120)
    result = solve(problem, "milp", formulation="large")
    assert not violations(problem, result.placement)
    assert "greedy packing" in result.message
    full = solve(problem, "milp", formulation="large", mip_gap=0.0)
    assert result.objective >= full.objective * (1 - 2 * TYPED_DIVE_GAP)
    assert result.bound >= full.objective * (1 - 1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_the_greedy_repair_places_feasibly_and_values_its_placement_truly(seed):
    from solvers.milp.greedy_pack import repair_choices
    from solvers.milp.options import option_table
    from solvers.milp.packing import packing_graph
    from solvers.milp.solve import utility_sum

    problem = _sia(seed)
    table = option_table(problem)
    graph = packing_graph(problem, table, np.ones(table.job.size, dtype=bool), np.inf, True)
    rng = np.random.default_rng(seed)
    job = table.job[graph.opt]
    pick = np.array([rng.choice(np.flatnonzero(job == j)) for j in np.unique(job)])  # one whole option per job
    values = {"y": np.zeros(graph.opt.size), "k": np.zeros(table.keep.size)}
    values["y"][pick] = 1.0
    placement, value, settled = repair_choices(problem, table, graph, values)
    assert not violations(problem, placement)
    assert value == pytest.approx(utility_sum(problem, placement, table), rel=1e-12)
    kept_as_chosen = pick[settled["y"][pick]]
    assert kept_as_chosen.size > 0
    reps = placement.sum(axis=1)
    assert np.array_equal(reps[table.job[graph.opt[kept_as_chosen]]], table.reps[graph.opt[kept_as_chosen]])


def _naive_typed_prune(problem) -> np.ndarray:
    keep = np.ones(problem.num_configs, dtype=bool)
    group = problem.cfg_job * problem.num_types + problem.cfg_type
    for c in range(problem.num_configs):
        n, k, s = problem.cfg_nodes[c], problem.cfg_replicas[c], problem.cfg_speedup[c]
        for o in np.flatnonzero(group == group[c]):
            n2, k2 = problem.cfg_nodes[o], problem.cfg_replicas[o]
            if problem.cfg_speedup[o] >= s and (n2, k2) != (n, k) and n2 <= n and k2 <= -(-k * n2 // n):
                keep[c] = False
                break
    return keep


@pytest.mark.parametrize("seed", range(4))
def test_typed_pruning_matches_the_pairwise_rule_both_ways(seed, monkeypatch):
    from solvers.milp import options

    problem = random_typed_problem(seed, (3, 2), (4, 8), 6)
    dense = options.prune_dominated(problem)
    assert np.array_equal(dense, _naive_typed_prune(problem))
    monkeypatch.setattr(options, "DENSE_PRUNE_CELLS", 0)  # the sparse search
    assert np.array_equal(options.prune_dominated(problem), dense)
