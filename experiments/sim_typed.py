"""Heterogeneity-aware scheduling on Sia's 64-GPU cluster, simulated.

The eight AdaptDL workloads on ``sia-64`` (6 x 4 ``aws`` (T4, measured) + 3 x 8
``rtx`` + 2 x 8 ``dgx-ext``, the synthetic types of
:mod:`pollux_opt.backends.sim.synthetic_types`) under ``pollux`` (aware),
``pollux-unaware`` and ``sia``.  For every (workload, policy): average and p99
JCT, makespan, worst rho (shared metrics' summary.json), GPU-hours per job
(replica-seconds used / 3600 / jobs), the policy's wall seconds per round
(median and p95) and the simulation's wall seconds.  Writes ``OUT/typed.csv``
(one row per pair), ``OUT/typed_means.csv`` and one run directory per pair;
``--results`` writes the rows into ``experiments/results/sim_typed.csv``
(replacing those of the same workload and policy, keeping the others);
``--policies pollux-all-shapes`` adds Pollux offered every shape (:data:`VARIANTS`);
``--merge`` writes the rows of earlier runs' ``typed.csv`` files there the same way.

    python experiments/sim_typed.py --out runs/sim-typed [--jobs 2] [--results]
    python experiments/sim_typed.py --out runs/sim-typed --merge runs/a/typed.csv runs/b/typed.csv
    python experiments/sim_typed.py --quick --out /tmp/q    # first 12 jobs of workload-1, smoke test
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from pollux_opt import Cluster, Options
from pollux_opt.backends.sim import default_trace_dir, quiet_library_logs, run_tasks, simulate
from pollux_opt.backends.sim.synthetic_types import build_typed_profiles
from pollux_opt.model.cluster_types import PRESETS
from pollux_opt.records.events import read_events
from pollux_opt.records.files import atomic_write_csv
from pollux_opt.workloads.adaptdl import read_adaptdl_csv

if str(Path(__file__).resolve().parent) not in sys.path:  # the sibling experiment, also when loaded by path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_compare import grid_parser  # noqa: E402
from solver_speed import machine_name  # noqa: E402

POLICIES = ("pollux", "pollux-unaware", "sia")
#: Variants run by name with ``--policies``: label -> (registered policy, its options).
#: ``pollux-all-shapes`` is type-aware Pollux offered every (nodes, replicas)
#: shape instead of Sia's configurations (``Options.shapes``, pollux_opt.model.configs).
VARIANTS = {"pollux-all-shapes": ("pollux", {"options": Options(shapes="all")})}
CLUSTER = "sia-64"
QUICK_JOBS = 12
RESULTS = Path(__file__).resolve().parent / "results" / "sim_typed.csv"


@lru_cache(maxsize=2)
def _profiles(traces: str, types: tuple[str, ...]) -> dict:
    return build_typed_profiles(traces, types=types)


def _round_seconds(out_dir: Path) -> np.ndarray:
    """The policy's wall seconds of each round (``solver_s`` of the allocation events)."""
    return np.array([e["solver_s"] for e in read_events(out_dir / "events.jsonl")
                     if e.get("type") == "allocation" and e.get("solver_s") is not None], dtype=float)


def run_one(task: dict) -> dict:
    """Top-level (picklable): simulate one (workload, policy) pair; one CSV row."""
    quiet_library_logs()
    types = PRESETS[task["cluster"]]
    cluster = Cluster.from_types(types)
    profiles = _profiles(task["traces"], types.names)
    jobs = read_adaptdl_csv(task["workload"])
    if task["quick"]:
        jobs = jobs[:QUICK_JOBS]
    out_dir = Path(task["out_dir"])
    policy, options = VARIANTS.get(task["policy"], (task["policy"], None))
    res = simulate(jobs, profiles, policy, cluster=cluster, interval=task["interval"], out_dir=out_dir,
                   policy_options=options)
    summary = json.loads((out_dir / "summary.json").read_text())
    used = pd.read_csv(out_dir / "jobs.csv").attained_service.sum()
    rounds = _round_seconds(out_dir)
    return {
        "workload": Path(task["workload"]).stem, "policy": task["policy"], "cluster": task["cluster"],
        "jobs": res.num_jobs, "completed": res.completed, "avg_jct_s": res.avg_jct, "p99_jct_s": res.p99_jct,
        "makespan_s": res.makespan, "worst_rho": summary.get("worst_rho"),
        "gpu_hours_per_job": float(used) / 3600.0 / max(res.num_jobs, 1),
        "round_s_median": float(np.median(rounds)) if rounds.size else float("nan"),
        "round_s_p95": float(np.percentile(rounds, 95)) if rounds.size else float("nan"),
        "wall_s": res.wall_seconds, "load1_end": os.getloadavg()[0], "machine": machine_name(),
    }


def merge_results(df: pd.DataFrame) -> None:
    """Write ``df``'s rows into :data:`RESULTS`, replacing rows of the same
    (workload, policy) and keeping the others (so runs over parts of the grid
    fill one table)."""
    if RESULTS.is_file():
        old = pd.read_csv(RESULTS)
        keep = ~old.set_index(["workload", "policy"]).index.isin(df.set_index(["workload", "policy"]).index)
        df = pd.concat([old[keep], df], ignore_index=True)
    atomic_write_csv(RESULTS, df.sort_values(["workload", "policy"]))


def main(argv=None) -> int:
    ap = grid_parser(__doc__.splitlines()[0], POLICIES)
    ap.add_argument("--results", action="store_true", help=f"also write the rows to {RESULTS}")
    ap.add_argument("--merge", nargs="+", default=[], metavar="CSV",
                    help=f"write the rows of these typed.csv files (earlier runs) to {RESULTS} and exit")
    args = ap.parse_args(argv)
    if args.merge:
        merge_results(pd.concat([pd.read_csv(p) for p in args.merge], ignore_index=True))
        return 0
    traces = Path(args.traces) if args.traces else default_trace_dir()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workloads = [1] if args.quick else args.workloads
    tasks = [
        {"traces": str(traces), "workload": str(traces / "workloads" / f"workload-{w}.csv"), "policy": p,
         "quick": args.quick, "cluster": CLUSTER, "interval": args.interval,
         "out_dir": str(out / f"workload-{w}-{p}")}
        for w in workloads for p in args.policies
    ]
    rows: list[dict] = []
    t0 = time.perf_counter()

    def write(task, row):
        rows.append(row)
        df = pd.DataFrame(rows).sort_values(["workload", "policy"])
        atomic_write_csv(out / "typed.csv", df)
        if args.results and not args.quick:
            merge_results(df)
        print(f"{row['workload']} {row['policy']}: avg JCT {row['avg_jct_s']:.0f} s, "
              f"wall {row['wall_s']:.0f} s ({time.perf_counter() - t0:.0f} s so far)", flush=True)

    run_tasks(run_one, tasks, jobs=args.jobs, on_result=write)
    df = pd.DataFrame(rows)
    means = df.groupby("policy")[["avg_jct_s", "p99_jct_s", "makespan_s", "worst_rho", "gpu_hours_per_job",
                                  "round_s_median", "round_s_p95", "wall_s"]].mean()
    means.to_csv(out / "typed_means.csv")
    print(means.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
