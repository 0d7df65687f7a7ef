"""Policy comparison on the AdaptDL workloads at 16 nodes x 4.

For every (workload, policy): average and p99 JCT, makespan, worst rho and the
fraction of jobs with rho > 1 (from the shared metrics' summary.json).  Writes
``OUT/compare.csv``, one run directory per pair and ``OUT/compare.png``.

    python experiments/sim_compare.py --out runs/sim-compare [--traces DIR] [--jobs 2]
    python experiments/sim_compare.py --quick --out /tmp/q    # 1 short workload, smoke test

``--quick`` simulates the first 12 jobs of workload-1 on 4 x 4.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from pollux_opt import Cluster
from pollux_opt.backends.sim import (
    default_trace_dir,
    load_profiles,
    quiet_library_logs,
    run_tasks,
    simulate,
)
from pollux_opt.workloads.adaptdl import read_adaptdl_csv
from pollux_opt.backends.sim.state import SIM_DEFAULT_CPUS_PER_NODE, SIM_DEFAULT_INTERVAL_S, SIM_DEFAULT_NODES
from solver_speed import machine_name

POLICIES = ("pollux", "tiresias", "optimus")
#: Published Pollux-simulator averages over the eight workloads, hours (Pollux, OSDI 2021).
PUBLISHED_AVG_JCT_H = {"pollux": 0.76, "tiresias": 1.12, "optimus": 1.58}
QUICK_JOBS = 12


def run_one(task: dict) -> dict:
    """Top-level (picklable): simulate one (workload, policy) pair; one CSV row."""
    quiet_library_logs()
    profiles = load_profiles(task["traces"])
    jobs = read_adaptdl_csv(task["workload"])
    if task["quick"]:
        jobs = jobs[:QUICK_JOBS]
    cluster = Cluster.uniform(task["nodes"], task["cpus_per_node"])
    res = simulate(jobs, profiles, task["policy"], cluster=cluster, interval=task["interval"],
                   out_dir=task["out_dir"])
    summary = json.loads((Path(task["out_dir"]) / "summary.json").read_text())
    return {
        "workload": Path(task["workload"]).stem, "policy": task["policy"], "jobs": res.num_jobs,
        "completed": res.completed, "avg_jct_s": res.avg_jct, "p99_jct_s": res.p99_jct,
        "makespan_s": res.makespan, "worst_rho": summary.get("worst_rho"),
        "frac_rho_gt_1": summary.get("frac_rho_gt_1"), "wall_s": res.wall_seconds,
        "solver_s": res.solver_seconds, "machine": machine_name(),
    }


def plot(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    pivot = df.pivot(index="workload", columns="policy", values="avg_jct_s") / 3600
    pivot.plot.bar(ax=ax)
    ax.set_ylabel("average JCT (h)")
    ax.set_title("AdaptDL workloads, simulated")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def grid_parser(description: str, policies) -> argparse.ArgumentParser:
    """The arguments of a (workload, policy) grid experiment: ``--traces``,
    ``--out``, ``--policies`` (default ``policies``), ``--workloads`` (1..8),
    ``--interval`` (seconds), ``--jobs`` (parallel processes) and ``--quick``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--traces", default=None, help="trace folder (default: ../shared/traces/adaptdl-osdi21)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", nargs="+", default=list(policies))
    ap.add_argument("--workloads", nargs="+", type=int, default=list(range(1, 9)))
    ap.add_argument("--interval", type=float, default=SIM_DEFAULT_INTERVAL_S)
    ap.add_argument("--jobs", type=int, default=1, help="parallel processes")
    ap.add_argument("--quick", action="store_true")
    return ap


def main(argv=None) -> int:
    args = grid_parser(__doc__.splitlines()[0], POLICIES).parse_args(argv)
    traces = Path(args.traces) if args.traces else default_trace_dir()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workloads = [1] if args.quick else args.workloads
    nodes = 4 if args.quick else SIM_DEFAULT_NODES
    tasks = [
        {"traces": str(traces), "workload": str(traces / "workloads" / f"workload-{w}.csv"), "policy": p,
         "quick": args.quick, "nodes": nodes, "cpus_per_node": SIM_DEFAULT_CPUS_PER_NODE, "interval": args.interval,
         "out_dir": str(out / f"workload-{w}-{p}")}
        for w in workloads for p in args.policies
    ]
    rows = run_tasks(run_one, tasks, jobs=args.jobs)
    df = pd.DataFrame(rows)
    df.to_csv(out / "compare.csv", index=False)
    means = df.groupby("policy")[["avg_jct_s", "p99_jct_s", "makespan_s", "wall_s"]].mean()
    means["published_avg_jct_s"] = [PUBLISHED_AVG_JCT_H.get(p, float("nan")) * 3600 for p in means.index]
    means.to_csv(out / "compare_means.csv")
    plot(df, out / "compare.png")
    print(means.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
