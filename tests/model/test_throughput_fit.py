"""The throughput fit's residuals: batched evaluation gives the formulas' values and the same fit, to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from pollux_opt.model import fit_throughput, throughput_fit
from pollux_opt.model.throughput import (
    _AA, _AN, _AR, _BN, _BR, _KAPPA,
    unchecked_step_time,
    unchecked_sync_time,
)
from pollux_opt.model.throughput_fit import _FitRows, _Residuals
from pollux_opt.model.throughput_priors import (
    COLOCATION_PRIOR_WEIGHT,
    RETROGRESSION_PRIOR_WEIGHT,
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
             for ia, ib in ((_AN, _BN), (_AR, _BR)) if ib in layout.free]
    if layout.colocated:
        prior.append(COLOCATION_PRIOR_WEIGHT * theta[_KAPPA])
    return np.concatenate([r_step, r_sync, prior])


@pytest.mark.parametrize("kind", KINDS)
def test_residuals_match_the_formulas_bit_for_bit(kind):
    nodes, replicas, m, step, sync, s = _measured(kind)
    rows = _FitRows.checked(nodes, replicas, m, step, sync, s)
    layout = fit_layout(rows)
    residuals = _Residuals(rows, layout)
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = rng.uniform(0.001, 3.0, len(layout.free))
        assert residuals(x).tobytes() == _formula_residuals(rows, layout, x).tobytes()
    if layout.accumulated:
        assert _AA in layout.free


@pytest.mark.parametrize("kind", KINDS)
def test_batched_residuals_equal_one_point_calls(kind):
    nodes, replicas, m, step, sync, s = _measured(kind)
    rows = _FitRows.checked(nodes, replicas, m, step, sync, s)
    residuals = _Residuals(rows, fit_layout(rows))
    x = np.random.default_rng(2).uniform(0.001, 3.0, (7, len(fit_layout(rows).free)))
    x[3] = x[0]  # repeated points (and gammas)
    batch = residuals.batch(x)
    for b in range(x.shape[0]):
        assert batch[b].tobytes() == residuals(x[b]).tobytes()
    mapped = residuals.map(None, iter(x))
    assert all(a.tobytes() == batch[b].tobytes() for b, a in enumerate(mapped))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_fit_with_batched_jacobian_equals_the_plain_fit(kind, seed, monkeypatch):
    data = _measured(kind, seed)
    batched = fit_throughput(*data[:5], accum_steps=data[5])
    monkeypatch.setattr(throughput_fit, "_LSQ_WORKERS", False)
    plain = fit_throughput(*data[:5], accum_steps=data[5])
    assert batched == plain
