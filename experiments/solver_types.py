"""Time the solvers on clusters with node types, and the untyped case against a reference copy.

Each measured code runs in its own subprocess, one after the other, on the
same seeded instances (``--repeats N``: N alternating rounds, each figure the
median over them, as in ``solver_speed.py``); the CSV keeps the load average
next to each row::

    python experiments/solver_types.py --out experiments/results/solver_types.csv
    python experiments/solver_types.py --reference /path/to/old   # also the untyped case on old solvers
    python experiments/solver_types.py --reference /path/to/old --reference-typed   # and its typed cases

Cases (``solvers.testing.random_typed_problem`` / ``random_problem``; wall and
CPU seconds per solve, median and 95th percentile):

* ``milp Sia 64 GPUs (3 types) / 40 jobs``: Sia's cluster (6 x 4 GPUs of
  type 0, 3 x 8 of type 1, 2 x 8 of type 2), 40 jobs with configurations on
  every type, ten seeds, three solves each with the structure cache emptied;
* ``greedy Sia 64 GPUs (3 types) / 40 jobs``: the same instances;
* ``milp 2048 GPUs (3 types) / 1000 jobs``: 128 x 4 + 96 x 8 + 96 x 8 GPUs,
  1000 jobs, two seeds (``formulation="auto"``, default gap; target <= 0.5 s
  at a gap <= 1 %); ``..., seeds 2-4``: three more seeds, for the gap;
* ``milp 64 CPUs / 40 jobs (untyped)``: 16 x 4 CPUs, ten seeds, for the
  current code and (``--reference``) the reference: types must not slow the
  untyped path.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from solver_speed import alternate, clear_milp_cache, run_worker, speed_row, timed, write_rows

log = logging.getLogger("solver_types")

ROOT = Path(__file__).resolve().parents[1]
#: Seeds of the 64-GPU instances and of the 2048-GPU ones (timed; the others checked for their gap).
SMALL_SEEDS, LARGE_SEEDS, LARGE_GAP_SEEDS = range(10), range(2), range(2, 5)
#: Solves per small instance.
REPEATS = 3
#: The 2048-GPU cluster of three types: nodes and GPUs per node of each.
LARGE_NODES, LARGE_GPUS = (128, 96, 96), (4, 8, 8)
LARGE_JOBS = 1000


def _row(case: str, walls: list, cpus: list, **extra) -> dict:
    """:func:`solver_speed.speed_row` with the 1-minute load average at the end of the case."""
    return speed_row(case, walls, cpus, load_average_1min=os.getloadavg()[0], **extra)


def _repeated(case: str, problems: list, solver: str) -> dict:
    from solvers import solve

    walls, cpus, gaps = [], [], []
    for _ in range(REPEATS):
        for p in problems:
            clear_milp_cache()
            w, c, r = timed(lambda: solve(p, solver))
            walls.append(w), cpus.append(c), gaps.append(r.gap)
    return _row(case, walls, cpus, max_gap=max(gaps))


def _typed_cases() -> list[dict]:
    from solvers import solve
    from solvers.testing import random_typed_problem

    sia = [random_typed_problem(s, num_jobs=40) for s in SMALL_SEEDS]
    solve(sia[0], "milp")  # one-off imports
    rows = [_repeated("milp Sia 64 GPUs (3 types) / 40 jobs", sia, "milp")]
    rows.append(_repeated("greedy Sia 64 GPUs (3 types) / 40 jobs", sia, "greedy"))
    rows.append(_large("milp 2048 GPUs (3 types) / 1000 jobs", LARGE_SEEDS))
    rows.append(_large("milp 2048 GPUs (3 types) / 1000 jobs, seeds 2-4", LARGE_GAP_SEEDS))
    return rows


def _large(case: str, seeds) -> dict:
    from solvers import solve
    from solvers.testing import random_typed_problem

    walls, cpus, gaps, forms = [], [], [], set()
    for s in seeds:
        p = random_typed_problem(s, LARGE_NODES, LARGE_GPUS, LARGE_JOBS)
        clear_milp_cache()
        w, c, r = timed(lambda: solve(p, "milp"))
        walls.append(w), cpus.append(c), gaps.append(r.gap), forms.add(r.stats["formulation"])
    return _row(case, walls, cpus, max_gap=max(gaps), formulation="/".join(sorted(forms)))


def _untyped_case() -> dict:
    from solvers import solve
    from solvers.testing import random_problem

    problems = [random_problem(s, num_nodes=16, cpus_per_node=4, num_jobs=40) for s in SMALL_SEEDS]
    solve(problems[0], "milp")
    return _repeated("milp 64 CPUs / 40 jobs (untyped)", problems, "milp")


def worker(typed: bool) -> None:
    """Measure in this process and print the rows as JSON."""
    rows = [_untyped_case()] + (_typed_cases() if typed else [])
    json.dump(rows, sys.stdout)


def _run(code: str, path: str | None, typed: bool) -> list[dict]:
    return run_worker(code, path, Path(__file__), ["--typed"] if typed else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", help="folder holding a reference copy of the solvers package (untyped case only)")
    ap.add_argument(
        "--reference-typed", action="store_true", help="also measure the typed cases on the reference (it must support node types)"
    )
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the codes, alternating (default 1)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "solver_types.csv"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--typed", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.typed)
        return 0
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    codes = [lambda: _run("current", None, True)]
    if args.reference:
        codes.append(lambda: _run("reference", args.reference, args.reference_typed))
    write_rows(alternate(codes, args.repeats), Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
