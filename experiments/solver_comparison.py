"""Solver comparison: MILP vs evolutionary vs greedy on seeded random clusters.

For each cluster size, one seeded instance (``solvers.testing.random_problem``:
concave speedup tables, about half the jobs running) is solved by every
solver.  Per solver and size it records the build, jit-compile and solve
seconds separately (the evolutionary solver's solve time is a second call,
after compilation, and also as CPU seconds), the objective and the relative
gap to the MILP's best bound; for the evolutionary solver the spread of the
objective over its seeds.  The MILP's bound is valid for the whole problem, so
the gap of a heuristic is an upper bound on its distance to the optimum.

Writes ``OUT/solver_comparison.csv`` (one row per solver and size) and
``OUT/solver_comparison.png`` (gap vs time, log time axis, one point per
solver and size), and prints the table.

    python experiments/solver_comparison.py --out runs/solvers
    python experiments/solver_comparison.py --quick --out /tmp/q   # small sizes only, < 1 min

``benchmarks/test_solver_comparison_bench.py`` runs the same grid under
pytest-benchmark (``pytest benchmarks/ --benchmark``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from solvers import Problem, Result, solve, violations
from solvers.testing import random_problem

log = logging.getLogger("solver_comparison")

SOLVERS = ("milp", "greedy", "evolutionary")


@dataclasses.dataclass(frozen=True)
class Size:
    """A cluster of ``nodes`` x ``cpus`` CPUs with ``jobs`` jobs."""

    nodes: int
    cpus: int
    jobs: int

    @property
    def label(self) -> str:
        return f"{self.nodes}x{self.cpus}/{self.jobs}"


#: The grid: 16 x 4 CPUs with 10, 20 and 40 jobs, 64 x 4 with 100, 512 x 4 with 1000.
SIZES = (Size(16, 4, 10), Size(16, 4, 20), Size(16, 4, 40), Size(64, 4, 100), Size(512, 4, 1000))
QUICK_SIZES = (Size(16, 4, 10), Size(16, 4, 20))
#: Seed of each size's instance.
INSTANCE_SEED = 0
#: Solves per size for the MILP and the greedy (medians of their times are reported).
REPEATS = 3
#: Seeds of the evolutionary solver, for the spread of its objective.
EVO_SEEDS = tuple(range(10))
#: Above this many CPUs x jobs the dense encoding is too slow for the full
#: setting: at 512 x 4 with 1000 jobs one population is 100 x 512 x 1000 int32
#: (205 MB) and a generation takes 3-5 s on the 2-core machine (by its load),
#: so 100 generations x 10 seeds would take about an hour.
LARGE_WORK = 2048 * 1000
#: The evolutionary setting run at such sizes instead (about a minute).
LARGE_EVO_GENERATIONS = 10
LARGE_EVO_SEEDS = (0,)


@dataclasses.dataclass(frozen=True)
class EvoPlan:
    """How the evolutionary solver runs at one size, and why if reduced."""

    generations: int
    seeds: tuple[int, ...]
    note: str = ""


def evo_plan(size: Size) -> EvoPlan:
    """The full setting (100 generations, 10 seeds) unless the size is too large for it."""
    if size.nodes * size.cpus * size.jobs >= LARGE_WORK:
        return EvoPlan(
            LARGE_EVO_GENERATIONS,
            LARGE_EVO_SEEDS,
            f"reduced to {LARGE_EVO_GENERATIONS} generations x {len(LARGE_EVO_SEEDS)} seed: "
            f"the dense population (100 x {size.nodes} x {size.jobs} int32) takes 3-5 s per "
            "generation here",
        )
    return EvoPlan(100, EVO_SEEDS)


def instance(size: Size, seed: int = INSTANCE_SEED) -> Problem:
    """The seeded instance of one size."""
    return random_problem(seed, num_nodes=size.nodes, cpus_per_node=size.cpus, num_jobs=size.jobs)


def timed_median(problem: Problem, solver: str, repeats: int = REPEATS) -> tuple[Result, dict]:
    """The last of ``repeats`` solves, and the medians of its time fields."""
    runs = [timed(problem, solver) for _ in range(repeats)]
    med = {
        "build_s": statistics.median(r.build_seconds for r, _, _ in runs),
        "solve_s": statistics.median(r.solve_seconds for r, _, _ in runs),
        "total_s": statistics.median(w for _, w, _ in runs),
        "solve_cpu_s": statistics.median(c for _, _, c in runs),
    }
    return runs[-1][0], med


def timed(problem: Problem, solver: str, **options: Any) -> tuple[Result, float, float]:
    """(result, wall seconds, CPU seconds) of one solve; raises if the answer is infeasible."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = solve(problem, solver, **options)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    broken = violations(problem, result.placement)
    if broken or not result.status.has_solution:
        raise RuntimeError(f"{solver}: {result.status.value}, {broken[:3]} {result.message}")
    return result, wall, cpu


def relative_gap(bound: float, objective: float) -> float:
    """(bound - objective) / |bound|."""
    return (bound - objective) / abs(bound) if bound else math.nan


def _row(size: Size, solver: str, result: Result, bound: float, **extra: Any) -> dict:
    return {
        "size": size.label,
        "nodes": size.nodes,
        "cpus_per_node": size.cpus,
        "jobs": size.jobs,
        "solver": solver,
        "status": result.status.value,
        "objective": result.objective,
        "milp_bound": bound,
        "gap": relative_gap(bound, result.objective),
        "build_s": result.build_seconds,
        "compile_s": float(result.stats.get("compile_seconds", 0.0)),
        "solve_s": result.solve_seconds,
        **extra,
    }


def compare_size(size: Size, seed: int = INSTANCE_SEED) -> list[dict]:
    """One row per solver for one size (the MILP first: its bound is every gap's reference)."""
    problem = instance(size, seed)
    milp, times = timed_median(problem, "milp")
    bound = milp.bound if math.isfinite(milp.bound) else milp.objective
    log.info("%s milp %s objective %.6g bound %.6g in %.3f s", size.label, milp.status.value,
             milp.objective, bound, times["total_s"])
    rows = [_row(size, "milp", milp, bound, **times)]

    greedy, times = timed_median(problem, "greedy")
    log.info("%s greedy objective %.6g in %.3f s", size.label, greedy.objective, times["total_s"])
    rows.append(_row(size, "greedy", greedy, bound, **times))

    plan = evo_plan(size)
    options = {"generations": plan.generations}
    first, first_wall, first_cpu = timed(problem, "evolutionary", seed=plan.seeds[0], **options)
    log.info("%s evolutionary: first call %.2f s (compile %.2f s)", size.label, first_wall,
             first.stats["compile_seconds"])
    if len(plan.seeds) == 1:  # a large size: no second call (its times include the compile)
        runs = [(first, first_wall, first_cpu)]
    else:  # every timed call after compilation
        runs = [timed(problem, "evolutionary", seed=s, **options) for s in plan.seeds]
    objectives = [r.objective for r, _, _ in runs]
    log.info("%s evolutionary objectives %s", size.label, [f"{o:.6g}" for o in objectives])
    rows.append(
        _row(
            size,
            "evolutionary",
            runs[0][0],
            bound,
            build_s=first.build_seconds,  # encode + compile (the first call)
            compile_s=float(first.stats["compile_seconds"]),
            solve_s=statistics.median(r.solve_seconds for r, _, _ in runs),
            total_s=statistics.median(w for _, w, _ in runs),
            solve_cpu_s=statistics.median(c for _, _, c in runs),
            generations=plan.generations,
            seeds=len(plan.seeds),
            objective=statistics.mean(objectives),
            objective_min=min(objectives),
            objective_max=max(objectives),
            objective_std=float(np.std(objectives)),
            gap=statistics.mean(relative_gap(bound, o) for o in objectives),
            gap_max=max(relative_gap(bound, o) for o in objectives),
            note=plan.note,
        )
    )
    return rows


def plot(df: pd.DataFrame, path: Path) -> None:
    """Gap to the MILP bound vs time (log axis), one point per solver and size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for solver, marker in zip(SOLVERS, "osD"):
        g = df[df.solver == solver]
        ax.scatter(g.total_s, 100 * g.gap.clip(lower=0), marker=marker, label=solver)
        for _, r in g.iterrows():
            ax.annotate(r["size"], (r.total_s, 100 * max(r.gap, 0)), fontsize=7,
                        textcoords="offset points", xytext=(4, 3))
    ax.set_xscale("log")
    # Linear below 0.1 % (the MILP's own gaps are ~0), logarithmic above.
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("time per solve (s; evolutionary after compilation)")
    ax.set_ylabel("gap to the MILP bound (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


COLUMNS = ["size", "solver", "objective", "gap", "build_s", "compile_s", "solve_s", "solve_cpu_s"]


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """Write ``df`` atomically (a crash never leaves a half-written file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    df.to_csv(tmp, index=False)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the CSV and the plot")
    parser.add_argument("--quick", action="store_true", help="small sizes only (< 1 minute)")
    parser.add_argument("--log-level", default="INFO", help="progress logging level (INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    log.setLevel(args.log_level.upper())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for size in QUICK_SIZES if args.quick else SIZES:
        log.info("size %s", size.label)
        rows += compare_size(size)
        write_csv(pd.DataFrame(rows), out / "solver_comparison.csv")  # partial results survive
    df = pd.DataFrame(rows)
    plot(df, out / "solver_comparison.png")
    print(df[COLUMNS].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
