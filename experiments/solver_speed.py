"""Time the allocator's solvers, optionally against a reference copy of ``solvers`` in the same run.

Each measured code (the working tree's ``solvers``, and with ``--reference
DIR`` the ``solvers`` package found in DIR) runs in its own subprocess, one
after the other, on the same seeded instances, so that a loaded machine
affects both alike; with ``--repeats N`` the codes alternate N times and each
figure is the median over the repeats (``repeats`` column).  The CSV keeps the
load average next to each row::

    python experiments/solver_speed.py --reference /path/to/old --repeats 3 --out experiments/results/solver_speed.csv

Cases (``solvers.testing.random_problem``; wall and CPU seconds per solve,
median and 95th percentile):

* ``milp 64 CPUs / 40 jobs, new structure``: 16 x 4 CPUs, 40 jobs, ten seeds,
  every solve on a structure not seen before (the structure cache emptied);
* ``milp 64 CPUs / 40 jobs, same structure``: the same instances with other
  job weights, after one solve of each (other objective, same structure);
* ``milp 2048 CPUs / 1000 jobs``: 512 x 4 CPUs, 1000 jobs, two seeds (the
  "large" formulation at the default gap);
* ``evolutionary 100 x 100, 64 CPUs / 40 jobs``: 100 generations of 100, after compilation.

A whole workload-6 simulation is timed by ``experiments/encode_speed.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("solver_speed")

ROOT = Path(__file__).resolve().parents[1]
#: Workload 6 of the AdaptDL traces (read in place).
WORKLOAD = ROOT.parent / "shared" / "traces" / "adaptdl-osdi21" / "workloads" / "workload-6.csv"
#: Seeds of the 64-CPU instances and of the 2048-CPU ones.
SMALL_SEEDS, LARGE_SEEDS = range(10), range(2)
#: Solves per instance timed after the first (the 64-CPU cases).
REPEATS = 3


def timed(fn) -> tuple[float, float, object]:
    """Call ``fn()``: (wall seconds, CPU seconds of this process, its answer)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def speed_row(case: str, walls: list, cpus: list, **extra) -> dict:
    """One CSV row of ``case``: its solves' median and 95th-percentile wall seconds, median CPU seconds."""
    return {
        "case": case,
        "solves": len(walls),
        "wall_median_s": statistics.median(walls),
        "wall_p95_s": float(np.percentile(walls, 95)),
        "cpu_median_s": statistics.median(cpus),
        **extra,
    }


def _reweighted(problem, seed: int):
    from solvers import Problem

    fields = {f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)}
    fields["weight"] = problem.weight * np.random.default_rng(seed).uniform(0.5, 2.0, problem.num_jobs)
    return Problem(**fields)


def clear_milp_cache() -> None:
    """Empty the MILP's structure cache: the registry's solver's, or the module's of a
    reference copy that keeps it there (one that keeps none has nothing to clear)."""
    from solvers import SOLVERS

    solver = getattr(SOLVERS["milp"], "solver", None)
    if solver is not None:
        solver.structures.clear()
        return
    try:
        from solvers.milp.compiled import STRUCTURES
    except ImportError:
        return
    STRUCTURES.clear()


def _milp_cases() -> list[dict]:
    from solvers import solve
    from solvers.testing import random_problem

    problems = [random_problem(s, num_nodes=16, cpus_per_node=4, num_jobs=40) for s in SMALL_SEEDS]
    solve(problems[0], "milp")  # one-off imports
    rows = []
    walls, cpus, gaps = [], [], []
    for _ in range(REPEATS):
        for p in problems:
            clear_milp_cache()
            w, c, r = timed(lambda: solve(p, "milp"))
            walls.append(w), cpus.append(c), gaps.append(r.gap)
    rows.append(speed_row("milp 64 CPUs / 40 jobs, new structure", walls, cpus, max_gap=max(gaps)))
    walls, cpus, gaps = [], [], []
    for i, p in enumerate(problems):
        solve(p, "milp")
        for k in range(REPEATS):
            q = _reweighted(p, 100 * i + k)
            w, c, r = timed(lambda: solve(q, "milp"))
            walls.append(w), cpus.append(c), gaps.append(r.gap)
    rows.append(speed_row("milp 64 CPUs / 40 jobs, same structure", walls, cpus, max_gap=max(gaps)))
    walls, cpus, gaps = [], [], []
    for s in LARGE_SEEDS:
        p = random_problem(s, num_nodes=512, cpus_per_node=4, num_jobs=1000)
        clear_milp_cache()
        w, c, r = timed(lambda: solve(p, "milp"))
        walls.append(w), cpus.append(c), gaps.append(r.gap)
    rows.append(speed_row("milp 2048 CPUs / 1000 jobs", walls, cpus, max_gap=max(gaps)))
    return rows


def _evolutionary_case() -> dict:
    from solvers import solve
    from solvers.testing import random_problem

    problems = [random_problem(s, num_nodes=16, cpus_per_node=4, num_jobs=40) for s in SMALL_SEEDS[:4]]
    solve(problems[0], "evolutionary", seed=0)  # compilation
    walls, cpus = [], []
    for p in problems:
        w, c, _ = timed(lambda: solve(p, "evolutionary", seed=0, population_size=100, generations=100))
        walls.append(w), cpus.append(c)
    return speed_row("evolutionary 100 x 100, 64 CPUs / 40 jobs", walls, cpus)


def worker() -> None:
    """Measure in this process and print the rows as JSON."""
    rows = _milp_cases() + [_evolutionary_case()]
    for row in rows:
        row["load_average_1min"] = os.getloadavg()[0]
    json.dump(rows, sys.stdout)


def _run(code: str, path: str | None) -> list[dict]:
    return run_worker(code, path, Path(__file__), [])


def run_worker(code: str, path: str | None, script: Path, flags: list[str]) -> list[dict]:
    """The rows ``script --worker FLAGS`` prints (its last line, JSON), each tagged ``code``;
    with ``path``, that folder's solvers come first (pollux_opt from the working tree), then
    the script's own folder (``-P`` leaves it off ``sys.path``; the scripts import each other)."""
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path, str(script.parent)])
    cmd = [sys.executable, *(["-P"] if path else []), str(script), "--worker", *flags]
    log.info("measuring %s", code)
    out = subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return [{"code": code, **row} for row in json.loads(out.strip().splitlines()[-1])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", help="folder holding a reference copy of the solvers package")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the codes, alternating (default 1)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "solver_speed.csv"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker()
        return 0
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    codes = [lambda: _run("current", None)] + ([lambda: _run("reference", args.reference)] if args.reference else [])
    write_rows(alternate(codes, args.repeats), Path(args.out))
    return 0


def alternate(codes: list, repeats: int) -> list[dict]:
    """The rows of each code's measurement (callables returning rows), the codes run in turn
    ``repeats`` times, as :func:`median_rows` of all."""
    return median_rows([row for _ in range(repeats) for measure in codes for row in measure()])


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per (code, case): the median of each numeric figure over the repeats, with their count."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["code"], row["case"]), []).append(row)
    out = []
    for runs in groups.values():
        merged = dict(runs[0], repeats=len(runs))
        for key, value in runs[0].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                merged[key] = statistics.median(r[key] for r in runs)
        out.append(merged)
    return out


def machine_name() -> str:
    """This machine's processor model and CPU count, e.g. ``"Intel(R) Xeon(R) Processor, 2 vCPUs"``."""
    model = "unknown processor"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} vCPUs"


def write_rows(rows: list[dict], out: Path) -> None:
    """The timing rows as a CSV at ``out`` (written atomically), with the machine's CPU count and model."""
    import pandas as pd

    from pollux_opt.records.files import atomic_write_csv

    df = pd.DataFrame(rows)
    df["cpus"] = os.cpu_count()
    df["machine"] = machine_name()
    atomic_write_csv(out, df)
    log.info("wrote %s\n%s", out, df.to_string())


if __name__ == "__main__":
    sys.exit(main())
