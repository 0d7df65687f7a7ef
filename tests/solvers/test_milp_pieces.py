"""Pieces of the MILP's build that take shortcuts: each equals the plain computation it replaces."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solvers import job_values, violations
from solvers.milp.compiled import merge_row, merged_rows
from solvers.milp.options import option_table
from solvers.milp.states import holding_states, kept_pieces
from solvers.placement import violations_and_values
from solvers.testing import edge_problems, random_placement, random_problem, random_typed_problem


def _problems():
    for seed in range(6):
        yield random_problem(seed, num_nodes=8, cpus_per_node=4, num_jobs=12, running_fraction=0.8)
        yield random_problem(seed, num_nodes=6, cpus_per_node=8, num_jobs=10, interference_avoidance=False)
        yield random_typed_problem(seed, num_jobs=12)
    for _, problem in edge_problems():
        yield problem


@pytest.mark.parametrize("slots", [True, False])
def test_holding_states_are_the_subsets_each_node_may_keep(slots):
    """Every holding node's states are the subsets of its kept pieces (at most one multi-node with slots)."""
    for problem in _problems():
        table = option_table(problem)
        holding, state_node, state_res, state_slot = holding_states(problem, table, slots, 10**6)
        assert holding.tolist() == np.flatnonzero((problem.current[table.keep] > 0).any(axis=0)).tolist()
        for i, n in enumerate(holding.tolist()):
            cap = int(problem.capacity[n])
            pieces = [(int(problem.current[j, n]), nodes > 1) for j, nodes in zip(table.keep, table.keep_nodes)]
            pieces = [piece for piece, j in zip(pieces, table.keep) if problem.current[j, n] > 0]
            expected = set()
            for mask in itertools.product((0, 1), repeat=len(pieces)):
                kept = [piece for piece, on in zip(pieces, mask) if on]
                multi = sum(m for _, m in kept)
                used = sum(c for c, _ in kept)
                if used <= cap and (not slots or multi <= 1):
                    expected.add((cap - used, bool(slots and multi)))
            got = [(r, s) for t, r, s in zip(state_node, state_res, state_slot) if t == i]
            assert sorted(got, key=lambda rs: (cap - rs[0], rs[1])) == got  # by kept CPUs, then slot
            assert set(got) == expected and len(got) == len(expected)


def test_kept_pieces_list_each_holding_node_s_kept_jobs_in_keep_order():
    for problem in _problems():
        table = option_table(problem)
        holding, kept, shapes = kept_pieces(problem, table)
        for n, pieces, shape in zip(holding.tolist(), kept, shapes):
            q = [i for i, j in enumerate(table.keep.tolist()) if problem.current[j, n] > 0]
            assert pieces == [(i, int(problem.current[table.keep[i], n]), bool(table.keep_nodes[i] > 1)) for i in q]
            assert shape == tuple((c, m) for _, c, m in pieces)


def test_violations_and_values_is_violations_with_job_values_of_a_feasible_placement():
    rng = np.random.default_rng(0)
    feasible = infeasible = 0
    for problem in _problems():
        candidates = [problem.current, random_placement(rng, problem)]
        if problem.num_jobs and problem.num_nodes:
            broken = random_placement(rng, problem).copy()
            broken[0, 0] += 3  # over capacity or an unlisted shape, as it happens
            candidates += [broken, broken.astype(np.float64)]
        for placement in candidates:
            messages, values = violations_and_values(problem, placement)
            assert messages == violations(problem, placement)
            if messages:
                assert values is None
                infeasible += 1
                continue
            np.testing.assert_array_equal(values, job_values(problem, placement))
            feasible += 1
    assert feasible and infeasible  # both branches were exercised


def test_merged_rows_equal_merging_each_row_on_its_own():
    rng = np.random.default_rng(1)
    for _ in range(200):
        rows = []
        for _ in range(int(rng.integers(0, 6))):
            size = int(rng.integers(0, 5))
            tokens = rng.integers(0, 6, size).tolist()
            coefs = rng.choice([0, 1, -1, 2, 0.5, -0.5], size).tolist()
            rows.append((coefs, tokens))
        tokens = [t for _, ts in rows for t in ts]
        coefs = [c for cs, _ in rows for c in cs]
        starts = np.cumsum([0] + [len(ts) for _, ts in rows])[:-1].astype(np.int64)
        bounds = ([0] * len(rows), [0] * len(rows))
        indptr, cols, vals, lo, up = merged_rows(tokens, coefs, np.asarray(tokens, dtype=np.int64), starts, bounds, 6)
        expected = [merge_row(cs, ts) for cs, ts in rows]
        expected = [(list(c), list(v)) for c, v in expected if c]
        got = [(cols[a:b].tolist(), vals[a:b].tolist()) for a, b in zip(indptr[:-1], indptr[1:])]
        assert got == [(c, [float(x) for x in v]) for c, v in expected]
        assert lo.size == up.size == len(expected)
