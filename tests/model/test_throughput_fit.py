"""The throughput fit's residuals and least-squares run: batched evaluation gives the formulas' values,
and the batched Jacobian and iteration scipy's least_squares answer, to the bit."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import least_squares
from scipy.optimize._numdiff import approx_derivative

from pollux_opt.model import fit_throughput, throughput_fit, throughput_lsq
from pollux_opt.model.throughput import (
    GAMMA_MAX,
    GAMMA_MIN,
    I_AA,
    I_AN,
    I_AR,
    I_BN,
    I_BR,
    I_GAMMA,
    I_KAPPA,
    unchecked_step_time,
    unchecked_sync_time,
)
from pollux_opt.model.throughput_fit import PARAM_FLOOR_S, Residuals
from pollux_opt.model.throughput_lsq import BatchProblem, least_squares_trf
from pollux_opt.model.throughput_priors import (
    COLOCATION_PRIOR_WEIGHT,
    RETROGRESSION_PRIOR_WEIGHT,
    FitRows,
    fit_layout,
)

TRUE_THETA = np.array([0.02, 0.004, 0.01, 0.002, 0.05, 0.01, 2.0, 0.015, 0.2])  # see PARAM_NAMES


def _rows(kind: str):
    """(nodes, replicas, local_bsz, accum_steps) of measurement rows of one kind."""
    if kind == "one replica":
        return [1, 1, 1], [1, 1, 1], [32, 64, 128], [0, 0, 1]
    if kind == "one node":
        return [1, 1, 1, 1], [1, 2, 3, 4], [64, 64, 32, 32], [0, 0, 0, 0]
    if kind == "spread":
        return [1, 2, 2, 4], [2, 2, 4, 8], [32, 32, 64, 64], [0, 0, 0, 0]
    # co-located and one-per-node rows, two (m, s), accumulation with and without
    return [1, 1, 2, 2, 2, 4, 1], [1, 2, 2, 4, 4, 4, 3], [32, 32, 64, 64, 32, 128, 16], [0, 1, 0, 0, 2, 0, 1]


KINDS = ["one replica", "one node", "spread", "mixed"]


def _measured(kind: str, seed: int = 0):
    nodes, replicas, m, s = (np.array(v, dtype=np.float64) for v in _rows(kind))
    rng = np.random.default_rng(seed)
    step = unchecked_step_time(TRUE_THETA, nodes, replicas, m, s) * rng.lognormal(0, 0.05, nodes.size)
    sync = np.where(replicas > 1, unchecked_sync_time(TRUE_THETA, nodes, replicas), np.nan)
    return nodes, replicas, m, step, sync, s


def _formula_residuals(rows, layout, x):
    """The residuals written with the throughput module's formulas, one point."""
    theta = layout.expander()(x)
    ok = rows.sync_ok
    r_step = np.log(unchecked_step_time(theta, rows.nodes, rows.replicas, rows.m, rows.s)) - np.log(rows.step)
    r_sync = np.log(unchecked_sync_time(theta, rows.nodes[ok], rows.replicas[ok])) - np.log(rows.sync[ok])
    prior = [RETROGRESSION_PRIOR_WEIGHT * theta[ib] / (theta[ia] + theta[ib])
             for ia, ib in ((I_AN, I_BN), (I_AR, I_BR)) if ib in layout.free]
    if layout.colocated:
        prior.append(COLOCATION_PRIOR_WEIGHT * theta[I_KAPPA])
    return np.concatenate([r_step, r_sync, prior])


@pytest.mark.parametrize("kind", KINDS)
def test_residuals_match_the_formulas_bit_for_bit(kind):
    nodes, replicas, m, step, sync, s = _measured(kind)
    rows = FitRows.checked(nodes, replicas, m, step, sync, s)
    layout = fit_layout(rows)
    residuals = Residuals(rows, layout)
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = rng.uniform(0.001, 3.0, len(layout.free))
        assert residuals(x).tobytes() == _formula_residuals(rows, layout, x).tobytes()
    if layout.accumulated:
        assert I_AA in layout.free


@pytest.mark.parametrize("kind", KINDS)
def test_batched_residuals_equal_one_point_calls(kind):
    nodes, replicas, m, step, sync, s = _measured(kind)
    rows = FitRows.checked(nodes, replicas, m, step, sync, s)
    residuals = Residuals(rows, fit_layout(rows))
    x = np.random.default_rng(2).uniform(0.001, 3.0, (7, len(fit_layout(rows).free)))
    x[3] = x[0]  # repeated points (and gammas)
    batch = residuals.batch(x)
    for b in range(x.shape[0]):
        assert batch[b].tobytes() == residuals(x[b]).tobytes()


def _problem(kind: str, seed: int = 0):
    """(residuals, layout, lower, upper) of the fit of one kind of rows."""
    nodes, replicas, m, step, sync, s = _measured(kind, seed)
    rows = FitRows.checked(nodes, replicas, m, step, sync, s)
    layout = fit_layout(rows)
    free = layout.free
    lower = np.array([GAMMA_MIN if i == I_GAMMA else PARAM_FLOOR_S for i in free])
    upper = np.array([GAMMA_MAX if i == I_GAMMA else np.inf for i in free])
    return Residuals(rows, layout), layout, lower, upper


@pytest.mark.parametrize("kind", KINDS)
def test_batched_jacobian_equals_scipy_forward_differences(kind):
    residuals, layout, lower, upper = _problem(kind)
    problem = BatchProblem(residuals.batch, lower, upper)
    rng = np.random.default_rng(3)
    for trial in range(20):
        x = rng.uniform(0.0, 3.0, len(layout.free))
        x = np.clip(x, lower, upper)
        if trial % 2 and I_GAMMA in layout.free:  # on and next to gamma's upper bound: the step flipped
            x[layout.free.index(I_GAMMA)] = GAMMA_MAX if trial % 4 == 1 else GAMMA_MAX - 1e-12
        expected = approx_derivative(residuals, x, method="2-point", bounds=(lower, upper))
        got = problem.jac(x)
        assert got.shape == expected.shape and got.tobytes() == expected.tobytes()
        assert got.flags.f_contiguous == expected.flags.f_contiguous


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_least_squares_equals_scipy_least_squares(kind, seed):
    residuals, layout, lower, upper = _problem(kind, seed)
    x0 = np.clip(np.random.default_rng(seed).uniform(0.001, 2.0, len(layout.free)), lower, upper)
    expected = least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac", method="trf")
    got = least_squares_trf(BatchProblem(residuals.batch, lower, upper), x0, lower, upper)
    assert got.x.tobytes() == expected.x.tobytes()
    assert (got.cost, got.status, got.success, got.message) == (
        expected.cost, expected.status, expected.success, expected.message)


def test_least_squares_rejects_a_start_outside_the_bounds():
    residuals, layout, lower, upper = _problem("spread")
    with pytest.raises(ValueError, match="outside"):
        least_squares_trf(BatchProblem(residuals.batch, lower, upper), lower - 1.0, lower, upper)


def _plain_least_squares(problem, x0, lower, upper):
    return least_squares(lambda x: problem.fun(x), x0, bounds=(lower, upper), x_scale="jac", method="trf")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("direct", [True, False])
def test_fit_equals_the_fit_with_scipy_least_squares(kind, seed, direct, monkeypatch):
    data = _measured(kind, seed)
    monkeypatch.setattr(throughput_lsq, "_DIRECT", direct and throughput_lsq._DIRECT)
    batched = fit_throughput(*data[:5], accum_steps=data[5])
    monkeypatch.setattr(throughput_fit, "least_squares_trf", _plain_least_squares)
    plain = fit_throughput(*data[:5], accum_steps=data[5])
    assert batched == plain
