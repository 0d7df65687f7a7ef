"""The "evolutionary" solver: the genetic search over allocation genomes, compiled and run.

Compiled programs are cached per static shape (jobs, nodes and table sizes
are padded up to buckets by :func:`~solvers.evolutionary.encoding.pad_problem`,
so similar instances share them), population size and number of generations
per call: a second call with the same shapes does not recompile.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any

import numpy as np

from ..checks import check_problem, check_time_limit
from ..errors import InvalidProblem
from ..placement import evaluate, violations
from ..problem import Problem
from ..result import Result, Status
from .encoding import JOB_BUCKET, NODE_BUCKET, TABLE_BUCKET, PaddedProblem, pad_problem, round_up
from .repair import FLOAT32_EXACT
from .search import SearchConfig, evolve, import_jax, init
from .variation import AllocationGenome

__all__ = ["DEFAULT_GENERATIONS", "DEFAULT_POPULATION_SIZE", "solve_evolutionary"]

logger = logging.getLogger(__name__)

#: Population per generation: Pollux's genetic algorithm uses 100 (OSDI 2021 artifact).
DEFAULT_POPULATION_SIZE = 100
#: Generations per solve: Pollux's genetic algorithm runs 100 per scheduling round.
DEFAULT_GENERATIONS = 100
#: Best individuals of the final population re-scored exactly in float64.
FINAL_CANDIDATES = 4
#: With a time limit, the generations run in this many chunks, checking the clock between.
TIME_CHECKS = 10
#: Integer options (the seed in particular) must fit a signed 64-bit integer.
INT_OPTION_LIMIT = 2**63
#: Compiled programs kept (one per shape, population, chunk length).
COMPILE_CACHE_SIZE = 32

#: The allocation genome with its default rates (the solver exposes none of them).
GENOME = AllocationGenome()

#: Placements are int32 (node loads, job totals, and the repair's
#: ``value * nodes + node`` keys must stay below this).
INT32_LIMIT = 2**31
#: Largest padded speedup table (jobs x node counts x replica counts; float32,
#: three channels: 800 MiB at this size).
MAX_TABLE_CELLS = 2**26
#: Largest padded population (individuals x nodes x jobs, int32; the
#: generation step holds several arrays of this size: 256 MiB each).
MAX_POPULATION_CELLS = 2**26


def solve_evolutionary(
    problem: Problem,
    *,
    population_size: int = DEFAULT_POPULATION_SIZE,
    generations: int = DEFAULT_GENERATIONS,
    seed: int = 0,
    incumbent: np.ndarray | None = None,
    time_limit: float | None = None,
) -> Result:
    """Genetic algorithm over placement matrices (:mod:`solvers.evolutionary`), in JAX.

    Args:
        problem: the allocation problem.
        population_size: individuals per generation (>= 2; default 100, as Pollux).
        generations: generations to run (>= 0; default 100, as Pollux).
        seed: seed of the PRNG key; the same seed gives the same answer.
        incumbent: optional placement int[J, N] (for example the MILP's) that
            seeds half of the initial population, and is returned if it is
            feasible and nothing better is found.  An infeasible one scores
            -inf and only lives on through its repaired offspring.
        time_limit: wall seconds for the whole call, compilation included.  The
            generations then run in ``TIME_CHECKS`` chunks, the clock is checked
            before each, and the search stops at the first check past the limit
            (status ``TIME_LIMIT``).  When no seed is feasible the first chunk
            runs regardless, so that the answer is a searched one.  Without a
            limit all generations run as one compiled call.

    Returns:
        A :class:`Result` with status ``FEASIBLE`` (or ``TIME_LIMIT``), the best
        placement found (never worse than the current placement or the
        incumbent when those are feasible), its objective recomputed by
        :func:`solvers.evaluate`, ``bound = gap = nan``; ``build_seconds``
        covers encoding and compiling, ``solve_seconds`` the search and
        decoding; ``stats`` holds ``compile_seconds`` (0 when the compiled
        program was cached), ``cache_hit``, ``generations``,
        ``population_size``, ``seed`` and ``padded_shape``.

    Raises:
        InvalidProblem: for a bad problem, option or incumbent, or a problem
            too large for this solver's int32 placements or memory
            (``INT32_LIMIT``, ``MAX_TABLE_CELLS``, ``MAX_POPULATION_CELLS``),
            or a problem with node types (``problem.typed``: use milp or greedy).
        ImportError: if jax is not installed.
    """
    start = time.perf_counter()
    population_size, generations, seed, inc = _check_options(
        problem, population_size, generations, seed, incumbent, time_limit
    )
    genome = _genome_for(problem, population_size)
    jax = import_jax()

    params, seeds = pad_problem(problem, inc)
    encoded = time.perf_counter()
    config = SearchConfig(population_size=population_size)
    length = generations if time_limit is None else max(1, -(-generations // TIME_CHECKS))
    init_fn, evolve_fn, compile_seconds, cache_hit = _compile(config, genome, length, params, seeds)
    built = time.perf_counter()

    state = init_fn(seeds, params)
    state, done, timed_out = _run_generations(
        evolve_fn, jax.random.key(seed), state, params, generations, length, start, time_limit
    )
    placement, objective, broken = _best_placement(problem, state, inc)
    solved = time.perf_counter()
    status = Status.TIME_LIMIT if timed_out else Status.FEASIBLE
    message = f"{done} generations x population {population_size}"
    if broken:  # a repair bug: never return an infeasible placement as a solution
        status, placement = Status.ERROR, problem.current.copy()
        message = "internal error: infeasible placement: " + "; ".join(broken)
    return Result(
        placement=placement,
        status=status,
        objective=float(objective),
        bound=float("nan"),
        gap=float("nan"),
        build_seconds=built - start,
        solve_seconds=solved - built,
        solver="evolutionary",
        message=message,
        stats={
            "compile_seconds": compile_seconds,
            "encode_seconds": encoded - start,
            "cache_hit": cache_hit,
            "generations": done,
            "population_size": population_size,
            "seed": seed,
            "padded_shape": (int(seeds.shape[2]), int(seeds.shape[1])),  # (J, N)
        },
    )


def _check_options(problem, population_size, generations, seed, incumbent, time_limit) -> tuple:
    """(population_size, generations, seed, incumbent int64[J, N] or None), checked; else InvalidProblem."""
    check_problem(problem)
    if problem.typed:
        raise InvalidProblem(
            f"the evolutionary solver does not support node types (problem has {problem.num_types} types); "
            "use milp or greedy"
        )
    population_size = _check_int("population_size", population_size, 2)
    generations = _check_int("generations", generations, 0)
    seed = _check_int("seed", seed, 0)
    check_time_limit(time_limit)
    return population_size, generations, seed, _check_incumbent(problem, incumbent)


def _genome_for(problem: Problem, population_size: int) -> AllocationGenome:
    """The genome for ``problem`` (the default one unless its float32 sums could be inexact).

    Raises:
        InvalidProblem: when the padded arrays would overflow int32 or exceed
            the memory limits, naming the sizes.
    """
    jobs, nodes = round_up(problem.num_jobs, JOB_BUCKET), round_up(problem.num_nodes, NODE_BUCKET)
    a, r = problem.table_shape
    cap = int(problem.capacity.max(initial=0))
    if (jobs + 1) * cap >= INT32_LIMIT or nodes * (cap + 1) >= INT32_LIMIT or r + TABLE_BUCKET >= INT32_LIMIT:
        raise InvalidProblem(
            f"problem too large for the evolutionary solver: int32 placements overflow with {jobs} (padded) jobs, "
            f"{nodes} nodes, largest capacity {cap} and {r} replicas"
        )
    cells = jobs * round_up(a + 1, TABLE_BUCKET) * round_up(r + 1, TABLE_BUCKET)
    if cells > MAX_TABLE_CELLS:
        raise InvalidProblem(
            f"problem too large for the evolutionary solver: speedup table of {cells} cells > {MAX_TABLE_CELLS}"
        )
    if population_size * nodes * jobs > MAX_POPULATION_CELLS:
        raise InvalidProblem(
            f"problem too large for the evolutionary solver: population of {population_size} x {nodes} nodes "
            f"x {jobs} jobs > {MAX_POPULATION_CELLS} cells"
        )
    return GENOME if jobs * cap < FLOAT32_EXACT else dataclasses.replace(GENOME, matmul_priority=False)


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InvalidProblem(f"{name} must be an integer >= {low}, got {value!r}")
    if value >= INT_OPTION_LIMIT:
        raise InvalidProblem(f"{name} must be < 2**63, got {value!r}")
    return int(value)


def _check_incumbent(problem: Problem, incumbent: Any) -> np.ndarray | None:
    if incumbent is None:
        return None
    arr = np.asarray(incumbent)
    shape = (problem.num_jobs, problem.num_nodes)
    if arr.shape != shape:
        raise InvalidProblem(f"incumbent must have shape {shape}, got {arr.shape}")
    if arr.size and (
        not np.issubdtype(arr.dtype, np.number)
        or not np.all(np.isfinite(arr))
        or np.any(arr < 0)
        or np.any(arr != np.round(arr))
    ):
        raise InvalidProblem("incumbent must hold non-negative integer replica counts")
    return arr.astype(np.int64)


def _signature(tree: Any) -> tuple:
    """The (shape, dtype) of each array of ``tree``: the static part of a compiled program's input."""
    return tuple((tuple(np.shape(a)), np.asarray(a).dtype.str) for a in tree)


def _compile(
    config: SearchConfig, genome: AllocationGenome, length: int, params: PaddedProblem, seeds: np.ndarray
) -> tuple:
    """(init, evolve, compile seconds, cache hit) for the shapes of ``params`` and ``seeds``.

    The compile seconds are 0 when the programs came from the cache.
    """
    hits_before = _compiled.cache_info().hits
    init_fn, evolve_fn, compile_seconds = _compiled(config, genome, length, _signature(params), _signature([seeds]))
    cache_hit = _compiled.cache_info().hits > hits_before
    return init_fn, evolve_fn, 0.0 if cache_hit else compile_seconds, cache_hit


@functools.lru_cache(maxsize=COMPILE_CACHE_SIZE)
def _compiled(config: SearchConfig, genome: AllocationGenome, length: int, params_sig: tuple, seeds_sig: tuple):
    """Ahead-of-time compiled (init, evolve, seconds) for these static shapes; cached."""
    jax = import_jax()

    def struct(sig: tuple) -> list:
        return [jax.ShapeDtypeStruct(shape, np.dtype(dt)) for shape, dt in sig]

    key = jax.eval_shape(lambda: jax.random.key(0))
    params = PaddedProblem(*struct(params_sig))
    (seeds,) = struct(seeds_sig)
    start = time.perf_counter()
    init_fn = jax.jit(init, static_argnums=(2, 3)).lower(seeds, params, config, genome).compile()
    state = jax.eval_shape(functools.partial(init, config=config, genome=genome), seeds, params)
    until = jax.ShapeDtypeStruct((), np.int32)
    evolve_fn = (
        jax.jit(evolve, static_argnums=(4, 5, 6))
        .lower(key, state, params, until, config, genome, length)
        .compile()
    )
    return init_fn, evolve_fn, time.perf_counter() - start


def _run_generations(evolve_fn, key, state, params, generations: int, length: int, start: float, time_limit):
    """(final state, generations done, timed out): ``generations`` in chunks of ``length``.

    Without a feasible seed, one chunk runs even past the limit, so that the
    answer is a searched one rather than the empty placement.
    """
    jax = import_jax()

    until = np.int32(generations)
    timed_out = False
    done = 0
    must_run = not np.isfinite(float(np.max(state.fitness)))
    while done < generations:
        late = time_limit is not None and time.perf_counter() - start >= time_limit
        if late and not (must_run and done == 0):
            timed_out = True
            break
        state = evolve_fn(key, state, params, until)
        done = min(done + length, generations)
        if time_limit is not None:
            jax.block_until_ready(state)
    return state, done, timed_out


def _best_placement(problem: Problem, state, incumbent: np.ndarray | None) -> tuple[np.ndarray, float, list]:
    """(placement int64[J, N], its objective, its violations) of the best candidate, by :func:`solvers.evaluate`.

    Candidates are the ``FINAL_CANDIDATES`` fittest individuals and the
    feasible seeds; holding nothing stands in when there is none.  A
    non-empty violation list is a repair bug (logged); the objective is then nan.
    """
    fitness = np.asarray(state.fitness)
    ranked = np.argsort(-fitness, kind="stable")[:FINAL_CANDIDATES]
    ranked = ranked[fitness[ranked] > -np.inf]
    # Indexed on the host: an eager device gather would compile once per count of candidates.
    best_found = np.asarray(state.population)[ranked]

    j, n = problem.num_jobs, problem.num_nodes
    candidates = [x[:n, :j].T.astype(np.int64) for x in best_found]
    candidates += [x for x in (problem.current, incumbent) if x is not None and not violations(problem, x)]
    if not candidates:  # no generation ran and no seed is feasible; holding nothing is
        candidates.append(np.zeros_like(problem.current))  # always feasible
    objectives = [evaluate(problem, x) for x in candidates]
    best = int(np.argmax(objectives))
    placement = np.array(candidates[best], dtype=np.int64)
    broken = violations(problem, placement)
    if broken:
        logger.error("evolutionary solver produced an infeasible placement: %s", broken)
        return placement, float("nan"), broken
    return placement, objectives[best], broken
