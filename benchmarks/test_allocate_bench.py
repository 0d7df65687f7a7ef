"""Build + solve time of the "milp" solver, with pytest-benchmark.

Run with ``pytest benchmarks/ --benchmark``; ``benchmarks/results.md`` holds
the figures measured on the project's 2-core machine.  Each benchmark times
``solvers.solve(problem, "milp")`` end to end (model build and HiGHS) and
records in ``extra_info`` the status, gap, objective and the medians of the
solver's own build and solve seconds.

* random clusters of 16 nodes x 4 CPUs with 10, 20 and 40 jobs, three seeds
  each (``solvers.testing.random_problem``: concave speedups, half the jobs
  running);
* the same 16 x 4 clusters with 40 jobs, solved again with other job
  weights: other objective coefficients over the same model structure, so
  the compiled structure comes from :attr:`solvers.milp.solve.MilpSolver.structures` of the registry's solver
  (``extra_info["structure_hits"]``), as in a scheduler's consecutive rounds;
* 512 nodes x 4 CPUs with 1000 jobs (``formulation="auto"`` picks "large";
  target <= 0.25 s at a gap <= 1 % on a quiet machine);
* the 18 measured Pollux rounds in ``../shared/anchors/pollux-ga-rounds``
  (skipped where absent): objective over the reference genetic algorithm's and
  time over its ``ga_seconds``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from solvers import Problem, Result, evaluate, solve, violations
from solvers.testing import random_problem

#: The measured Pollux rounds (read in place, never copied into the repository).
ANCHORS = Path(__file__).resolve().parents[1].parent / "shared" / "anchors" / "pollux-ga-rounds"
#: (nodes, CPUs per node, jobs) of the random clusters.
SMALL_SIZES = [(16, 4, 10), (16, 4, 20), (16, 4, 40)]
LARGE_SIZE = (512, 4, 1000)
#: Seeds of the random clusters.
SEEDS = [0, 1, 2]
#: Rounds per benchmark: small instances take milliseconds, the large one about a second.
SMALL_ROUNDS, LARGE_ROUNDS, ANCHOR_ROUNDS = 30, 5, 10


def _timed(benchmark, problem: Problem, rounds: int, **options) -> Result:
    """Benchmark ``solve(problem, "milp")``; record status, gap and median build/solve seconds."""
    results: list[Result] = []

    def run() -> Result:
        result = solve(problem, "milp", **options)
        results.append(result)
        return result

    result = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=1)
    assert result.status.has_solution, result.message
    assert not violations(problem, result.placement)
    assert result.objective == pytest.approx(evaluate(problem, result.placement), rel=1e-12)
    timed = results[1:]  # the first call is the warm-up round
    benchmark.extra_info.update(
        status=result.status.value,
        formulation=result.stats["formulation"],
        objective=result.objective,
        bound=result.bound,
        gap=result.gap,
        build_seconds_median=statistics.median(r.build_seconds for r in timed),
        solve_seconds_median=statistics.median(r.solve_seconds for r in timed),
        rounds=result.stats["rounds"],
        columns=result.stats["columns"],
    )
    return result


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("nodes", "cpus", "jobs"), SMALL_SIZES, ids=lambda v: str(v))
def test_milp_16x4(benchmark, nodes, cpus, jobs, seed):
    problem = random_problem(seed, num_nodes=nodes, cpus_per_node=cpus, num_jobs=jobs)
    result = _timed(benchmark, problem, SMALL_ROUNDS)
    assert result.gap <= 1e-4


@pytest.mark.parametrize("seed", SEEDS)
def test_milp_16x4_40_jobs_same_structure(benchmark, seed):
    from solvers import SOLVERS

    structures = SOLVERS["milp"].solver.structures

    problem = random_problem(seed, num_nodes=16, cpus_per_node=4, num_jobs=40)
    fields = {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)}
    rng = np.random.default_rng(seed)
    variants = iter([Problem(**{**fields, "weight": rng.uniform(0.5, 2.0, problem.num_jobs)}) for _ in range(64)])
    solve(problem, "milp")
    hits = structures.hits
    results: list[Result] = []

    def run() -> Result:
        results.append(solve(next(variants), "milp"))
        return results[-1]

    result = benchmark.pedantic(run, rounds=SMALL_ROUNDS, iterations=1, warmup_rounds=1)
    assert result.status.has_solution and result.gap <= 1e-4
    benchmark.extra_info.update(
        structure_hits=structures.hits - hits,
        solves=len(results),
        build_seconds_median=statistics.median(r.build_seconds for r in results),
        solve_seconds_median=statistics.median(r.solve_seconds for r in results),
    )


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_milp_512x4_1000_jobs(benchmark, seed):
    nodes, cpus, jobs = LARGE_SIZE
    problem = random_problem(seed, num_nodes=nodes, cpus_per_node=cpus, num_jobs=jobs)
    result = _timed(benchmark, problem, LARGE_ROUNDS)
    assert result.stats["formulation"] == "large"
    assert result.gap <= 0.01


def _anchor_files() -> list[Path]:
    return sorted(ANCHORS.glob("*.json")) if ANCHORS.is_dir() else []


@pytest.mark.skipif(not ANCHORS.is_dir(), reason=f"measured Pollux rounds not found at {ANCHORS}")
@pytest.mark.parametrize("path", _anchor_files(), ids=lambda p: p.stem)
def test_milp_anchor_round(benchmark, path):
    from pollux_opt.model import parse_instance, to_problem

    data = json.loads(path.read_text())
    inst = parse_instance(data["instance"])
    problem = to_problem(inst.cluster, inst.jobs, inst.options)
    reference = data["reference"]
    result = _timed(benchmark, problem, ANCHOR_ROUNDS)
    assert result.objective >= reference["ga_objective_pinned"] * (1 - 1e-12)
    median = float(np.median(benchmark.stats.stats.data))
    benchmark.extra_info.update(
        jobs=problem.num_jobs,
        ga_objective=reference["ga_objective_pinned"],
        objective_over_ga=result.objective / reference["ga_objective_pinned"],
        ga_seconds=reference["ga_seconds"],
        seconds_over_ga=median / reference["ga_seconds"],
    )
