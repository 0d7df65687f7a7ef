"""The MILP's compiled structures: a cached structure compiles to what Pyomo's compiler writes, to the bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from solvers import Problem, solve
from solvers.milp import option_table, relax
from solvers.milp.compiled import CompiledModel, StructureCache, compile_model, compiled_model
from solvers.milp.model import objective_coefficients, pyomo_model
from solvers.milp.structure import ModelStructure
from solvers.milp.packing import packing_graph
from solvers.milp.strategy import choose_formulation
from solvers.testing import edge_problems, random_problem, random_typed_problem

#: (seed, nodes, CPUs per node, jobs, interference avoidance) of the random problems.
CASES = [
    (0, 2, 2, 3, True),
    (1, 4, 4, 6, False),
    (2, 16, 4, 20, True),
    (3, 16, 4, 40, True),
    (4, 8, 4, 12, False),
]


def _problems() -> list[tuple[str, Problem]]:
    out = [
        (f"random{seed}", random_problem(seed, num_nodes=n, cpus_per_node=c, num_jobs=j, interference_avoidance=ia))
        for seed, n, c, j, ia in CASES
    ]
    typed = [
        ("typed_slots", random_typed_problem(5, (3, 2, 2), (4, 8, 8), 12)),
        ("typed_layers", random_typed_problem(6, (2, 2), (4, 8), 8, interference_avoidance=False)),
    ]
    return out + typed + list(edge_problems())


def _reweighted(problem: Problem, seed: int) -> Problem:
    """``problem`` with other job weights: other objective coefficients, the same structure."""
    fields = {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)}
    rng = np.random.default_rng(seed)
    fields["weight"] = problem.weight * rng.uniform(0.5, 2.0, problem.num_jobs)
    return Problem(**fields)


def _offers(problem: Problem) -> list[np.ndarray]:
    """Options offered by the first round of each formulation, and all of them."""
    table = option_table(problem)
    rel = relax(problem, table)
    offers = [np.ones(table.job.size, dtype=bool)]
    return offers + [choose_formulation(problem, name).offered(problem, table, rel) for name in ("exact", "large")]


def _graphs(problem: Problem, offers: list[np.ndarray]):
    table = option_table(problem)
    for offered in offers:
        yield table, packing_graph(problem, table, offered)


def _same(a: CompiledModel, b: CompiledModel) -> None:
    for field in ("c", "row_lo", "row_up", "col_lo", "col_up", "integrality", "objective_only"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and np.array_equal(x, y), field
    assert a.offset == b.offset
    for part in ("data", "indices", "indptr"):
        assert np.array_equal(getattr(a.A, part), getattr(b.A, part)), part
    assert a.A.shape == b.A.shape
    assert a.index.keys() == b.index.keys()
    assert all(np.array_equal(a.index[k], b.index[k]) for k in a.index)
    assert a.g_keys == b.g_keys


@pytest.mark.parametrize(("name", "problem"), _problems(), ids=lambda v: v if isinstance(v, str) else "")
def test_assembled_and_cached_models_are_the_compilers_arrays(name, problem):
    """From the rules and from a cached structure with other coefficients: Pyomo's compiler's arrays, to the bit."""
    other = _reweighted(problem, 7)
    offers = _offers(problem)
    for (table, graph), (table2, graph2) in zip(_graphs(problem, offers), _graphs(other, offers)):
        assert ModelStructure.of(problem, table, graph).key() == ModelStructure.of(other, table2, graph2).key()
        cache = StructureCache(4)
        first, hit = compiled_model(problem, table, graph, cache)
        assert not hit
        _same(first, compile_model(pyomo_model(problem, table, graph)))
        again, hit = compiled_model(other, table2, graph2, cache)
        assert hit == first.fits(objective_coefficients(other, table2, graph2))  # unless other columns drop
        _same(again, compile_model(pyomo_model(other, table2, graph2)))


def test_the_structure_key_covers_the_current_placement_and_capacity():
    problem = random_problem(3, num_nodes=16, cpus_per_node=4, num_jobs=20)
    fields = {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)}
    moved = fields["current"].copy()
    running = np.flatnonzero(moved.sum(axis=1) > 0)[0]
    moved[running] = 0  # the job stops
    capacity = fields["capacity"].copy()
    capacity[0] += 1
    variants = [problem, Problem(**{**fields, "current": moved}), Problem(**{**fields, "capacity": capacity})]
    keys = []
    for p in variants:
        table = option_table(p)
        graph = packing_graph(p, table, np.ones(table.job.size, dtype=bool))
        keys.append(ModelStructure.of(p, table, graph).key())
    assert len(set(keys)) == 3


def test_structure_cache_keeps_the_most_recently_used():
    problem = random_problem(0, num_nodes=2, cpus_per_node=2, num_jobs=3)
    table = option_table(problem)
    compiled = compile_model(pyomo_model(problem, table, packing_graph(problem, table, np.ones(table.job.size, bool))))
    cache = StructureCache(2)
    cache.put(b"a", compiled)
    cache.put(b"b", compiled)
    assert cache.get(b"a") is compiled  # "a" is now the most recent
    cache.put(b"c", compiled)
    assert len(cache) == 2 and cache.get(b"b") is None and cache.get(b"a") is compiled
    off = StructureCache(0)
    off.put(b"a", compiled)
    assert len(off) == 0


def test_solving_twice_gives_the_same_answer_from_the_cache():
    problem = random_problem(11, num_nodes=16, cpus_per_node=4, num_jobs=30)
    first = solve(problem, "milp")
    second = solve(problem, "milp")
    assert np.array_equal(first.placement, second.placement)
    assert (first.objective, first.bound, first.status) == (second.objective, second.bound, second.status)

