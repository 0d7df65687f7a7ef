"""The flow-time weights of a linear objective over concave speedups: heSRPT's
weights for a power speedup, the defining identity on any concave curves,
and what a job's priority and its speedup's unit do to them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux_opt.scheduling.policies.flow_weights import flow_weights


def _power(p: float, slots: int) -> np.ndarray:
    k = np.arange(slots + 1, dtype=float)
    return np.diff(k ** p)


def _best(mu: np.ndarray, increments, slots: int) -> float:
    """V: the best sum of mu_j c_j(k_j) over sum k_j <= slots, by brute force over
    the jobs' slot counts (few jobs, few slots)."""
    cum = [np.concatenate([[0.0], np.cumsum(inc)]) for inc in increments]
    best = 0.0

    def walk(j: int, left: int, value: float) -> None:
        nonlocal best
        if j == len(cum):
            best = max(best, value)
            return
        for k in range(min(left, len(cum[j]) - 1) + 1):
            walk(j + 1, left - k, value + mu[j] * cum[j][k])

    walk(0, slots, 0.0)
    return best


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75])
def test_power_speedups_get_hesrpt_weights(p):
    # heSRPT (SPAA 2019): the job of rank r (1: the longest) of n gets the share
    # theta_r = (r/n)^c - ((r-1)/n)^c, c = 1/(1-p), and its weight is proportional to theta_r^(1-p)
    n, slots = 5, 20000
    mu = flow_weights([_power(p, slots)] * n, np.ones(n), slots)
    c = 1.0 / (1.0 - p)
    r = np.arange(1, n + 1)
    theta = (r / n) ** c - ((r - 1) / n) ** c
    expected = theta ** (1 - p)
    np.testing.assert_allclose(mu / mu[0], expected / expected[0], rtol=2e-3)


def _concave_curves(draw_lists):
    return [np.sort(np.asarray(x, dtype=float))[::-1] for x in draw_lists]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(0.05, 5.0), min_size=1, max_size=5), min_size=1, max_size=4),
       st.lists(st.floats(0.5, 3.0), min_size=4, max_size=4), st.integers(1, 8))
def test_each_suffix_of_jobs_is_worth_its_summed_priority(lists, prio, slots):
    # V(S_i) = pi_i + ... + pi_n for every suffix: completing a job lowers the
    # best weighted speed of the jobs left by its priority
    inc = _concave_curves(lists)
    pi = np.array(prio[:len(inc)])
    mu = flow_weights(inc, pi, slots)
    assert (mu > 0).all()
    for i in range(len(inc)):
        assert _best(mu[:i + 1], inc[:i + 1], slots) == pytest.approx(pi[:i + 1].sum(), rel=1e-9)


def test_a_speedup_in_other_units_scales_its_weight_inversely():
    inc = [_power(0.5, 16), np.diff(np.minimum(np.arange(17.0), 6)), _power(0.8, 16)]
    mu = flow_weights(inc, np.ones(3), 16)
    scaled = flow_weights([inc[0], 4.0 * inc[1], inc[2]], np.ones(3), 16)
    np.testing.assert_allclose(scaled, mu * np.array([1.0, 0.25, 1.0]))


def test_of_two_alike_jobs_the_heavier_one_finishing_first_weighs_more():
    inc = [_power(0.7, 8)] * 2
    light_last = flow_weights(inc, np.array([1.0, 2.0]), 8)  # the heavier completes first
    assert light_last[1] > 2.0 * light_last[0] > 0


def test_a_job_with_no_speedup_gets_no_weight():
    mu = flow_weights([_power(0.5, 4), np.zeros(0), _power(0.5, 4)], np.ones(3), 4)
    assert mu[1] == 0 and mu[0] > 0 and mu[2] > 0
