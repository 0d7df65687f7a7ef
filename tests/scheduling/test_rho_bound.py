"""The finish-time fairness bound on an encoded problem: which configurations a job
keeps, the exact-penalty encoding, and what the solver then gives."""

from __future__ import annotations

import numpy as np
import pytest

import solvers
from solvers import InvalidProblem, Problem

from pollux_opt.scheduling.policies.rho_bound import RhoOutlook, bound_rho

LOOK = 60.0


def _problem(weights=(1.0, 1e-3), current=None, restart_factor=(1.0, 1.0), p=1.0) -> Problem:
    """Two jobs on one node of 4 CPUs: job 0 scales linearly (speedup k), job 1 as k / 2."""
    ks = np.arange(1, 5)
    return Problem(
        capacity=[4], cfg_job=np.repeat([0, 1], 4), cfg_nodes=np.ones(8, dtype=int), cfg_replicas=np.tile(ks, 2),
        cfg_speedup=np.concatenate([ks * 1.0, ks / 2.0]), current=current if current is not None else np.zeros((2, 1)),
        restart_factor=list(restart_factor), weight=list(weights), min_replicas=[0, 0], max_replicas=[4, 4], p=p,
    )


def _outlook(rho1: float, *, rho0: float = np.nan, iso: float = 100.0, delay: float = 30.0,
             priority=(1.0, 1.0)) -> RhoOutlook:
    return RhoOutlook(rho=[rho0, rho1], isolated_s=[iso, iso], delay_s=[delay, delay], priority=list(priority),
                      lookahead_s=LOOK)


def _replicas(problem: Problem, job: int) -> list[int]:
    return problem.cfg_replicas[problem.cfg_job == job].tolist()


def test_a_job_that_may_wait_within_the_bound_is_left_alone():
    problem = _problem()
    # waiting a round adds L / I = 0.6: 1.3 + 0.6 <= 2
    assert bound_rho(problem, _outlook(1.3), 2.0) is problem
    # unknown rho (nan) is never constrained
    assert bound_rho(problem, _outlook(np.nan), 2.0) is problem


def test_a_job_near_the_bound_keeps_only_the_configurations_that_hold_it_and_gets_them():
    problem = _problem()
    assert solvers.solve(problem, "milp").placement[1].sum() == 0  # the heavy job takes the node
    bounded = bound_rho(problem, _outlook(1.9), 2.0)
    # 1.9 + (60 - 60 s) / 100 <= 2  <=>  s >= 5/6: two or more replicas (s = k / 2)
    assert _replicas(bounded, 1) == [2, 3, 4] and _replicas(bounded, 0) == [1, 2, 3, 4]
    placement = solvers.solve(bounded, "milp").placement
    assert placement[1].sum() == 2 and placement[0].sum() == 2  # the least it needs, the rest stays with job 0


def test_a_job_past_the_bound_holds_its_fair_share_speed_or_takes_its_fastest():
    problem = _problem()
    # rho 3: no configuration brings it back within 2 in one round
    assert _replicas(bound_rho(problem, _outlook(3.0), 2.0), 1) == [2, 3, 4]  # s >= 1
    assert _replicas(bound_rho(problem, _outlook(3.0), 2.0, past="fastest"), 1) == [4]


def test_a_move_costs_the_job_its_restart_delay_in_the_prediction():
    current = np.array([[0], [2]])  # job 1 holds 2 replicas (s = 1)
    problem = _problem(current=current, restart_factor=(1.0, 0.5))
    # rho 1.9 + 0.6 idle: staying at 2 (s = 1, trains 60 s) gives exactly 1.9; a move trains
    # 60 - 45 = 15 s: 4 replicas (s = 2) give 1.9 + (60 - 30) / 100 = 2.2 > 2
    bounded = bound_rho(problem, _outlook(1.9, delay=45.0), 2.0)
    assert _replicas(bounded, 1) == [2]


def test_the_bonus_prices_a_stay_and_a_move_as_pollux_plus_the_same_bonus():
    current = np.array([[0], [2]])
    problem = _problem(current=current, restart_factor=(1.0, 0.5))
    bounded = bound_rho(problem, _outlook(1.9, delay=0.0), 2.0)
    w, f = problem.weight[1], problem.restart_factor[1]
    s = dict(zip(_replicas(bounded, 1), bounded.cfg_speedup[bounded.cfg_job == 1]))
    w_new = bounded.weight[1]
    bonus = w_new - w
    assert bonus > 0 and bounded.restart_factor[1] == f
    assert w_new * s[2] == pytest.approx(w * 1.0 + bonus)  # the stay: w s + b
    assert w_new * f * s[4] == pytest.approx(w * f * 2.0 + bonus)  # a move: w f s + b


def test_a_constrained_job_gets_room_even_where_making_it_moves_a_running_job():
    current = np.array([[4], [0]])  # job 0 holds the node; a move costs it 4/5 of its utility
    problem = _problem(weights=(1.0, 1e-3), current=current, restart_factor=(0.2, 1.0))
    placement = solvers.solve(problem, "milp").placement
    assert placement[0].sum() == 4 and placement[1].sum() == 0
    bounded = bound_rho(problem, _outlook(1.9), 2.0)  # job 1 needs 2 replicas this round
    placement = solvers.solve(bounded, "milp").placement
    assert placement[1].sum() == 2 and placement[0].sum() == 2


def test_where_capacity_holds_one_constrained_job_the_heavier_and_further_past_goes_first():
    problem = _problem(weights=(1e-3, 1e-3))
    out = RhoOutlook(rho=[2.5, 2.5], isolated_s=[100.0, 100.0], delay_s=[0.0, 0.0], priority=[1.0, 3.0],
                     lookahead_s=LOOK)
    # both past the bound, each allowed only its fastest configuration (4 replicas): one fits,
    # and the heavier (priority 3) gets it
    placement = solvers.solve(bound_rho(problem, out, 2.0, past="fastest"), "milp").placement
    assert placement[1].sum() == 4 and placement[0].sum() == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"p": -1.0}, r"p = 1; got p=-1"),
])
def test_bound_rho_rejects_a_nonlinear_objective(kwargs, match):
    with pytest.raises(InvalidProblem, match=match):
        bound_rho(_problem(**kwargs), _outlook(1.9), 2.0)


def test_bound_rho_rejects_bad_outlooks_and_rules():
    with pytest.raises(InvalidProblem, match=r"outlook has \(1,\) rows for 2 jobs"):
        bound_rho(_problem(), RhoOutlook(rho=[1.0], isolated_s=[1.0], delay_s=[0.0], priority=[1.0],
                                         lookahead_s=LOOK), 2.0)
    with pytest.raises(InvalidProblem, match=r"past must be one of \('hold', 'fastest'\), got 'never'"):
        bound_rho(_problem(), _outlook(1.9), 2.0, past="never")
    with pytest.raises(InvalidProblem, match=r"bound must be a finite number > 1, got 1.0"):
        bound_rho(_problem(), _outlook(1.9), 1.0)
    with pytest.raises(InvalidProblem, match=r"lookahead_s must be finite and > 0, got 0"):
        RhoOutlook(rho=[1.0], isolated_s=[1.0], delay_s=[0.0], priority=[1.0], lookahead_s=0)
