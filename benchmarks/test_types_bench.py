"""Round time of the "milp" solver on clusters with node types, with pytest-benchmark.

Run with ``pytest benchmarks/test_types_bench.py --benchmark``.  Each
benchmark times ``solvers.solve(problem, "milp")`` end to end (model build
and HiGHS) on ``solvers.testing.random_typed_problem`` instances and records
in ``extra_info`` the status, gap, formulation and the median and 95th
percentile of the round time:

* Sia's 64-GPU cluster (SOSP 2023: 6 nodes x 4 GPUs of type 0, 3 x 8 of
  type 1, 2 x 8 of type 2) with 40 jobs, each with configurations on every
  type (concave speedups scaled per type), three seeds;
* 2048 GPUs of three types (128 x 4, 96 x 8, 96 x 8) with 1000 jobs
  (``formulation="auto"``; gap <= 1 % asserted, target <= 0.5 s recorded).

``experiments/solver_types.py`` measures the same cases into
``experiments/results/solver_types.csv``.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from solvers import Problem, Result, evaluate, solve, violations
from solvers.testing import random_typed_problem

#: The 2048-GPU cluster: nodes and GPUs per node of each type, and its jobs.
LARGE_NODES, LARGE_GPUS, LARGE_JOBS = (128, 96, 96), (4, 8, 8), 1000
#: Rounds per benchmark.
SMALL_ROUNDS, LARGE_ROUNDS = 20, 3


def _timed(benchmark, problem: Problem, rounds: int) -> Result:
    """Benchmark ``solve(problem, "milp")`` from an empty structure cache; record status, gap and times."""
    from solvers import SOLVERS

    results: list[Result] = []

    def run() -> Result:
        SOLVERS["milp"].solver.structures.clear()
        results.append(solve(problem, "milp"))
        return results[-1]

    result = benchmark.pedantic(run, rounds=rounds, iterations=1, warmup_rounds=1)
    assert result.status.has_solution, result.message
    assert not violations(problem, result.placement)
    assert result.objective == pytest.approx(evaluate(problem, result.placement), rel=1e-12)
    walls = benchmark.stats.stats.data
    benchmark.extra_info.update(
        status=result.status.value,
        formulation=result.stats["formulation"],
        gap=result.gap,
        wall_median_s=statistics.median(walls),
        wall_p95_s=float(np.percentile(walls, 95)),
        build_seconds_median=statistics.median(r.build_seconds for r in results[1:]),
        columns=result.stats["columns"],
    )
    return result


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_milp_sia_64_gpus_40_jobs(benchmark, seed):
    result = _timed(benchmark, random_typed_problem(seed, num_jobs=40), SMALL_ROUNDS)
    assert result.gap <= 1e-4


@pytest.mark.parametrize("seed", [0, 1])
def test_milp_2048_gpus_3_types_1000_jobs(benchmark, seed):
    problem = random_typed_problem(seed, LARGE_NODES, LARGE_GPUS, LARGE_JOBS)
    result = _timed(benchmark, problem, LARGE_ROUNDS)
    assert result.gap <= 0.01
