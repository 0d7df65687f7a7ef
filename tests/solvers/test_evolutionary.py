"""The JAX genetic algorithm: operators, reproducibility, compile cache."""

from __future__ import annotations

import dataclasses
import logging
import math
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")

from solvers import InvalidProblem, Status, evaluate, solve, violations  # noqa: E402
from solvers.evolutionary import encoding, search, solver  # noqa: E402
from solvers.evolutionary import repair as repair_ops  # noqa: E402
from solvers.evolutionary.variation import AllocationGenome, first_from  # noqa: E402
from solvers.testing import (  # noqa: E402
    brute_force,
    edge_problems,
    random_placement,
    random_problem,
)

#: One small setting shared by most tests, so that they share compiled programs.
SMALL = {"population_size": 16, "generations": 30}
BAD_INCUMBENT = r"incumbent must hold non-negative integer replica counts"
#: float32 fitness vs float64 objective: relative agreement of the logs.
FITNESS_ATOL = 1e-4
#: The solver's genome (default rates); its draws rows plus the crossover's.
GENOME = AllocationGenome()
GENE_ROWS = GENOME.gene_draws + 1


def _problem(seed: int, **kwargs):
    """4 nodes x 4 CPUs, 8 jobs, at most 7 replicas: every one pads to the same shapes."""
    return random_problem(seed, 4, 4, 8, max_replicas_limit=7, **kwargs)



def _problems():
    """Problems of a few shapes (mixed p, interference, holes), built once."""
    return [
        _problem(0),
        _problem(1, p=0.0, drop_fraction=0.3),
        _problem(2, p=1.0, interference_avoidance=False),
        random_problem(3, 3, 2, 6, drop_fraction=0.5, max_nodes_per_job=2),
    ] + [p for _, p in edge_problems()]


PROBLEMS = _problems()


# --------------------------------------------------------------------- solver API
def test_same_seed_gives_the_same_answer() -> None:
    problem = _problem(11)
    a = solve(problem, "evolutionary", seed=3, **SMALL)
    b = solve(problem, "evolutionary", seed=3, **SMALL)
    assert np.array_equal(a.placement, b.placement)
    assert a.objective == b.objective


def test_result_is_feasible_with_its_objective_and_search_settings() -> None:
    problem = _problem(12)
    result = solve(problem, "evolutionary", **SMALL)
    assert result.status is Status.FEASIBLE
    assert math.isnan(result.bound) and math.isnan(result.gap)
    assert result.objective == evaluate(problem, result.placement)
    assert violations(problem, result.placement) == []
    assert result.stats["generations"] == SMALL["generations"]
    assert result.stats["population_size"] == SMALL["population_size"]
    assert result.stats["padded_shape"] == (8, 4)
    assert result.stats["compile_seconds"] >= 0


def test_second_call_with_same_shapes_does_not_recompile(caplog) -> None:
    options = {"population_size": 6, "generations": 2}  # a setting no other test compiles
    problem = _problem(20)
    first = solve(problem, "evolutionary", **options)
    assert not first.stats["cache_hit"] and first.stats["compile_seconds"] > 0
    # Same shapes, other values.
    other = dataclasses.replace(problem, weight=problem.weight * 2, current=0 * problem.current)
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.DEBUG):
            second = solve(other, "evolutionary", seed=5, **options)
    finally:
        jax.config.update("jax_log_compiles", False)
    assert second.stats["cache_hit"] and second.stats["compile_seconds"] == 0.0
    assert second.build_seconds < first.build_seconds
    compiles = [r.getMessage() for r in caplog.records if "ompil" in r.getMessage()]
    assert compiles == []


def test_time_limited_run_that_finishes_matches_the_plain_run() -> None:
    # Keys depend only on the seed and the generation number, so chunking the
    # generations (which a time limit does) must not change the answer.
    problem = _problem(13)
    plain = solve(problem, "evolutionary", seed=2, **SMALL)
    chunked = solve(problem, "evolutionary", seed=2, time_limit=1e6, **SMALL)
    assert chunked.status is Status.FEASIBLE
    assert np.array_equal(plain.placement, chunked.placement)


def test_tiny_time_limit_returns_a_feasible_answer_with_that_status() -> None:
    problem = _problem(14)
    result = solve(problem, "evolutionary", time_limit=1e-6, **SMALL)
    assert result.status is Status.TIME_LIMIT
    assert result.stats["generations"] < SMALL["generations"]
    assert violations(problem, result.placement) == []
    assert result.objective == evaluate(problem, result.placement)


def test_incumbent_is_never_lost() -> None:
    problem = random_problem(4, 2, 2, 3)
    best, optimum = brute_force(problem)
    result = solve(problem, "evolutionary", incumbent=optimum, population_size=16, generations=0)
    assert result.objective == pytest.approx(best, rel=1e-12)


def test_infeasible_incumbent_is_repaired() -> None:
    problem = _problem(5)
    greedy_everything = np.tile(problem.capacity, (problem.num_jobs, 1))
    result = solve(problem, "evolutionary", incumbent=greedy_everything, **SMALL)
    assert violations(problem, result.placement) == []


def test_zero_generations_is_no_worse_than_the_current_placement() -> None:
    problem = _problem(6)
    result = solve(problem, "evolutionary", population_size=16, generations=0)
    assert result.objective >= evaluate(problem, problem.current)


@pytest.mark.parametrize("name", ["invalid_current", "shared_multi_node", "holes"])
def test_infeasible_current_placement_is_never_returned(name: str) -> None:
    problem = dict(edge_problems())[name]
    for generations in (0, 3):
        result = solve(problem, "evolutionary", population_size=16, generations=generations)
        assert result.status is Status.FEASIBLE
        assert violations(problem, result.placement) == []


@pytest.mark.parametrize("seed", range(4))
def test_finds_near_optimal_answers_on_tiny_problems(seed: int) -> None:
    # Not a target, a sanity floor: tiny problems where brute force is exact.
    problem = random_problem(seed, 2, 2, 3, drop_fraction=0.2)
    best, _ = brute_force(problem)
    result = solve(problem, "evolutionary", **SMALL)
    assert result.objective >= 0.95 * best


# --------------------------------------------------------------------- operators
def _padded(problem, params, x):
    """A placement int[J, N] as the solver's padded node-major int32[N', J']."""
    out = np.zeros(params.current.shape, np.int32)
    out[: problem.num_nodes, : problem.num_jobs] = np.asarray(x).T
    return out


def _unpadded(problem, out):
    out = np.asarray(out)
    assert np.all(out[problem.num_nodes :] == 0) and np.all(out[:, problem.num_jobs :] == 0)
    return out[: problem.num_nodes, : problem.num_jobs].T.astype(np.int64)


_repair_one = jax.jit(repair_ops.repair)


def _repair(problem, x, rng):
    params, _ = encoding.pad_problem(problem)
    n_jobs = params.current.shape[1]
    rank = rng.permutation(n_jobs).astype(np.int32)
    shift = np.int32(rng.integers(n_jobs))
    return _unpadded(problem, _repair_one(_padded(problem, params, x), rank, params, shift))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.integers(0, len(PROBLEMS) - 1),
    seed=st.integers(0, 2**32 - 1),
    scale=st.integers(1, 3),
)
def test_repair_makes_any_feasible_by_only_removing(which: int, seed: int, scale: int) -> None:
    problem = PROBLEMS[which]
    rng = np.random.default_rng(seed)
    x = rng.integers(0, scale * problem.capacity.max() + 1, size=problem.current.shape)
    x[rng.random(x.shape) < 0.5] = 0
    fixed = _repair(problem, x, rng)
    assert violations(problem, fixed) == []
    assert np.all(fixed <= x) and np.all(fixed >= 0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(PROBLEMS) - 1), seed=st.integers(0, 2**32 - 1))
def test_repair_keeps_feasible_placements(which: int, seed: int) -> None:
    problem = PROBLEMS[which]
    rng = np.random.default_rng(seed)
    x = random_placement(rng, problem)
    assert np.array_equal(_repair(problem, x, rng), x)


def _before_reference(x, rank, shift):
    """Replicas on each node of the jobs with higher priority, by brute force."""
    n_jobs = x.shape[1]
    priority = (rank - shift) % n_jobs
    higher = priority[:, None] < priority[None, :]  # [k, j]: k before j
    return x @ higher.astype(np.int64)


@pytest.mark.parametrize("path", ["matmul", "scan"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n_jobs=st.integers(1, 24), n_nodes=st.integers(1, 6))
def test_priority_sums_match_brute_force(path: str, seed: int, n_jobs: int, n_nodes: int) -> None:
    # One ranking shared by the population and a rotation per child must give
    # the sums of "the jobs before j in the rotated order", on both code paths.
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 5, size=(n_nodes, n_jobs)).astype(np.int32)
    rank = rng.permutation(n_jobs).astype(np.int32)
    shift = np.int32(rng.integers(n_jobs))
    limit = repair_ops.MATMUL_PRIORITY_MAX if path == "matmul" else 0
    saved, repair_ops.MATMUL_PRIORITY_MAX = repair_ops.MATMUL_PRIORITY_MAX, limit
    try:
        got = np.asarray(jax.jit(lambda *a: repair_ops._before(*a))(x, rank, shift))  # traced now
    finally:
        repair_ops.MATMUL_PRIORITY_MAX = saved
    np.testing.assert_array_equal(got, _before_reference(x.astype(np.int64), rank, shift))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_nodes=st.integers(1, 9))
def test_first_from_picks_the_first_true_node_from_the_offset(seed: int, n_nodes: int) -> None:
    rng = np.random.default_rng(seed)
    mask = rng.random((n_nodes, 5)) < 0.3
    offset = rng.integers(0, n_nodes, size=5).astype(np.int32)
    node, has = map(np.asarray, jax.jit(first_from)(mask, offset))
    for j in range(5):
        order = [(offset[j] + k) % n_nodes for k in range(n_nodes)]
        hits = [n for n in order if mask[n, j]]
        assert has[j] == bool(hits)
        if hits:
            assert node[j] == hits[0]


def test_draws_are_uniform_a_permutation_and_repeatable() -> None:
    draw = jax.jit(search.draws, static_argnums=(1, 2, 3))
    d = draw(jax.random.key(7), 400, 40, GENOME)
    again = draw(jax.random.key(7), 400, 40, GENOME)
    other = draw(jax.random.key(8), 400, 40, GENOME)
    u = np.asarray(d.gene)
    assert u.shape == (400, GENE_ROWS, 40) and d.individual.shape == (400, 6)
    assert u.min() >= 0 and u.max() < 1
    # 16 000 uniforms per stream: each mean is 0.5 within 4 standard errors
    # (0.289 / sqrt(16 000) = 0.0023), and the 8 streams (one hashed word
    # each half) are uncorrelated within 5 standard errors (1 / sqrt(16 000)).
    streams = u.transpose(1, 0, 2).reshape(GENE_ROWS, -1)
    np.testing.assert_allclose(streams.mean(axis=1), 0.5, atol=0.01)
    assert np.abs(np.corrcoef(streams) - np.eye(GENE_ROWS)).max() < 0.04
    assert sorted(np.asarray(d.rank).tolist()) == list(range(40))
    assert np.array_equal(u, np.asarray(again.gene))
    assert not np.array_equal(u, np.asarray(other.gene))


def test_step_fitness_equals_score_of_the_children() -> None:
    # step takes the children's fitness from their repair instead of score().
    problem = _problem(9)
    params, seeds = encoding.pad_problem(problem)
    config = search.SearchConfig(population_size=8)
    state = jax.jit(search.init, static_argnums=(2, 3))(seeds, params, config, GENOME)
    breed = jax.jit(search._breed, static_argnums=(3, 4))
    children, fitness = breed(jax.random.key(1), state, params, config, GENOME)
    scored = np.asarray(jax.jit(encoding.score)(children, params))
    assert np.all(np.isfinite(scored))
    np.testing.assert_allclose(np.asarray(fitness), scored, rtol=1e-6)


@pytest.mark.parametrize("p", [-5.0, -1.0, 0.0, 1.0, 2.0])
def test_fitness_is_the_log_of_the_pinned_objective(p: float) -> None:
    problem = _problem(7, p=p, weighted=True)
    params, _ = encoding.pad_problem(problem)
    placements = [random_placement(s, problem, fill_fraction=0.8) for s in range(8)]
    placements.append(problem.current)
    batch = np.stack([_padded(problem, params, x) for x in placements])
    fitness = np.asarray(jax.jit(encoding.score)(batch, params))
    expected = [math.log(evaluate(problem, x)) for x in placements]
    np.testing.assert_allclose(fitness, expected, atol=FITNESS_ATOL)


def test_fitness_of_a_disallowed_pair_is_minus_infinity() -> None:
    name, problem = [(n, p) for n, p in edge_problems() if n == "invalid_current"][0]
    params, _ = encoding.pad_problem(problem)
    batch = _padded(problem, params, problem.current)[None]
    assert np.asarray(jax.jit(encoding.score)(batch, params))[0] == -np.inf


def test_init_ask_tell_are_pure() -> None:
    problem = _problem(8)
    params, seeds = encoding.pad_problem(problem)
    config = search.SearchConfig(population_size=8)
    key = jax.random.key(0)
    init = jax.jit(search.init, static_argnums=(2, 3))
    ask = jax.jit(search.ask, static_argnums=(3, 4))
    state = init(seeds, params, config, GENOME)
    children = ask(key, state, params, config, GENOME)
    again = ask(key, state, params, config, GENOME)
    assert np.array_equal(children, again)  # same key, same children
    new = jax.jit(search.tell)(state, children, jax.jit(encoding.score)(children, params))
    assert int(new.generation) == 1 and int(state.generation) == 0
    # Elitism: the best fitness never drops.
    assert float(new.fitness.max()) >= float(state.fitness.max())
    # The initial population is copies of the seeds: current, incumbent (= current).
    assert np.all(np.asarray(state.population) == seeds[0])


def test_evolve_matches_one_step_at_a_time() -> None:
    # evolve draws the random words of all its generations before its loop:
    # they must be the numbers step draws, and the loop must stop at ``until``.
    problem = _problem(10)
    params, seeds = encoding.pad_problem(problem)
    config = search.SearchConfig(population_size=8)
    key = jax.random.key(4)
    state = jax.jit(search.init, static_argnums=(2, 3))(seeds, params, config, GENOME)
    step = jax.jit(search.step, static_argnums=(3, 4))
    stepped = state
    for _ in range(5):
        stepped = step(key, stepped, params, config, GENOME)
    evolve = jax.jit(search.evolve, static_argnums=(4, 5, 6))
    looped = evolve(key, state, params, np.int32(5), config, GENOME, 7)
    assert int(looped.generation) == 5
    assert np.array_equal(np.asarray(looped.population), np.asarray(stepped.population))
    assert np.array_equal(np.asarray(looped.fitness), np.asarray(stepped.fitness))


# --------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"population_size": 1}, r"population_size must be an integer >= 2, got 1"),
        ({"population_size": 2.5}, r"population_size must be an integer >= 2, got 2\.5"),
        ({"population_size": True}, r"population_size must be an integer >= 2, got True"),
        ({"generations": -1}, r"generations must be an integer >= 0, got -1"),
        ({"seed": -3}, r"seed must be an integer >= 0, got -3"),
        ({"seed": "a"}, r"seed must be an integer >= 0, got 'a'"),
        ({"seed": 2**64}, r"seed must be < 2\*\*63, got 18446744073709551616"),
        ({"incumbent": np.zeros((2, 2))}, r"incumbent must have shape \(8, 4\), got \(2, 2\)"),
        ({"incumbent": -np.ones((8, 4))}, BAD_INCUMBENT),
        ({"incumbent": np.full((8, 4), 0.5)}, BAD_INCUMBENT),
        ({"time_limit": 0}, r"time_limit must be a positive number of seconds, got 0"),
        ({"time_limit": math.inf}, r"time_limit must be a positive number of seconds, got inf"),
    ],
)
def test_bad_options_are_rejected(options: dict, message: str) -> None:
    with pytest.raises(InvalidProblem, match=message):
        solve(_problem(0), "evolutionary", **options)


def test_missing_jax_gives_the_install_hint(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "jax", None)  # makes `import jax` raise ImportError
    with pytest.raises(ImportError, match=r"pip install 'pollux-opt\[evo\]'"):
        solve(random_problem(0, 2, 2, 3), "evolutionary")


def test_padding_shares_programs_between_similar_sizes() -> None:
    small = random_problem(30, 3, 4, 7, max_replicas_limit=4)
    large = random_problem(31, 4, 4, 8, max_replicas_limit=4)
    sig = [solver._signature(encoding.pad_problem(p)[0]) for p in (small, large)]
    assert sig[0] == sig[1]


# --------------------------------------------------------------------- the comparison script
def test_solver_comparison_quick_writes_csv_and_plot(tmp_path, experiment) -> None:
    # About 10 s: two 16 x 4 sizes, every solver, 10 evolutionary seeds.
    import pandas as pd

    module = experiment("solver_comparison")
    assert module.main(["--quick", "--out", str(tmp_path), "--log-level", "WARNING"]) == 0
    df = pd.read_csv(tmp_path / "solver_comparison.csv")
    assert set(df["size"]) == {"16x4/10", "16x4/20"}
    assert set(df.solver) == {"milp", "greedy", "evolutionary"}
    assert (df.gap >= -1e-9).all() and (df[df.solver == "milp"].gap <= 1e-4).all()
    evo = df[df.solver == "evolutionary"]
    assert (evo.seeds == 10).all() and (evo.objective_min <= evo.objective_max).all()
    assert (evo.compile_s > 0).all() or (evo.build_s > evo.solve_s).all()
    assert (tmp_path / "solver_comparison.png").stat().st_size > 0
