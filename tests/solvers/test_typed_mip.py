"""The typed MIP's shortcuts: packing the LP's integral choices, and runs without a warm start."""

from __future__ import annotations

import pytest

from solvers import Status, solve, violations
from solvers.milp import highs
from solvers.testing import random_typed_problem

PACKED = "LP choices integral"


def _sia(seed: int, **kwargs):
    return random_typed_problem(seed, num_jobs=40, **kwargs)


def test_packing_the_lp_choices_reaches_the_full_mip_optimum(monkeypatch):
    problems = [_sia(seed, interference_avoidance=seed % 2 == 1) for seed in range(8)]
    packed = [solve(p, "milp", mip_gap=0.0) for p in problems]
    assert any(r.message.startswith(PACKED) for r in packed)  # the shortcut is exercised
    monkeypatch.setattr(highs, "_pack_lp_choices", lambda call, x, lp_bound: None)
    full = [solve(p, "milp", mip_gap=0.0) for p in problems]
    for problem, a, b in zip(problems, packed, full):
        assert not violations(problem, a.placement)
        assert a.status is Status.OPTIMAL and b.status is Status.OPTIMAL
        assert a.objective == pytest.approx(b.objective, rel=1e-9)
        assert a.bound >= b.objective * (1 - 1e-9)


def test_a_packing_that_falls_short_of_the_lp_bound_leaves_the_full_mip_to_run(monkeypatch):
    # With the bound raised past any packing's value the shortcut must decline.
    real = highs._pack_lp_choices
    declined = []

    def raised(call, x, lp_bound):
        out = real(call, x, lp_bound + 1.0)
        declined.append(out is None)
        return out

    monkeypatch.setattr(highs, "_pack_lp_choices", raised)
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
