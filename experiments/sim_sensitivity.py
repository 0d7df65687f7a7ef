"""Sensitivity of simulated JCT: job load, scheduling interval,
restart delay, profile error (noise on what jobs report) and the fairness exponent p.

Each axis varies one setting around the paper's defaults on one AdaptDL
workload (16 x 4, interval 60 s, restart 30 s).  Job load resamples the
workload from the Philly trace with the load multiplier.  Writes
``OUT/sensitivity.csv`` and one plot per axis ``OUT/sensitivity-AXIS.png``.

    python experiments/sim_sensitivity.py --out runs/sim-sens [--workload 6] [--jobs 2]
    python experiments/sim_sensitivity.py --quick --out /tmp/q
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pandas as pd

from pollux_opt import Cluster, Options
from pollux_opt.backends.sim import (
    SimConfig,
    default_trace_dir,
    load_profiles,
    quiet_library_logs,
    run_tasks,
    simulate,
)
from pollux_opt.workloads.adaptdl import philly_workload, read_adaptdl_csv
from pollux_opt.backends.sim.state import SIM_DEFAULT_CPUS_PER_NODE, SIM_DEFAULT_INTERVAL_S, SIM_DEFAULT_NODES
from pollux_opt.model.options import DEFAULT_RESTART_DELAY
from solvers import P_RANGE
from solver_speed import machine_name

AXES = {
    "load": [0.5, 1.0, 1.5, 2.0],
    "interval_s": [30.0, 60.0, 120.0, 240.0, 480.0],
    "restart_delay_s": [0.0, 30.0, 120.0, 300.0],
    "report_noise": [0.0, 0.1, 0.3, 0.5],
    # the power mean's exponent up to the end of the allocator's domain (solvers.P_RANGE)
    "p": [1.0, -1.0, P_RANGE[0]],
}
QUICK_AXES = {"load": [0.5, 1.0], "interval_s": [60.0, 240.0], "restart_delay_s": [30.0], "report_noise": [0.0, 0.3], "p": [-1.0]}
QUICK_JOBS = 10
#: The paper's settings (16 x 4, interval 60 s, restart 30 s, exact reports, p = -1); each axis varies one.
DEFAULTS = {"load": 1.0, "interval_s": SIM_DEFAULT_INTERVAL_S, "restart_delay_s": DEFAULT_RESTART_DELAY,
            "report_noise": 0.0, "p": -1.0}

log = logging.getLogger("sim_sensitivity")
#: Row fields logged as each run finishes.
PROGRESS_FIELDS = ("axis", "value", "policy", "avg_jct_s", "wall_s")


def _policy(name: str, p: float, restart: float):
    if name == "pollux":
        from pollux_opt.scheduling.policies import PolluxPolicy

        return PolluxPolicy(options=Options(p=p, restart_delay=max(restart, 1e-9)))
    return name


def run_one(task: dict) -> dict:
    """Top-level (picklable): one (axis, value, policy) point; one CSV row."""
    quiet_library_logs()
    quick, axis, value, pol = task["quick"], task["axis"], task["value"], task["policy"]
    traces = Path(task["traces"])
    profiles = load_profiles(traces)
    settings = dict(DEFAULTS, **{axis: value})
    if axis == "load":
        jobs = philly_workload(traces / "philly.csv", profiles, load=value,
                               num_jobs=QUICK_JOBS if quick else 160, seed=task["workload"])
    else:
        jobs = read_adaptdl_csv(traces / "workloads" / f"workload-{task['workload']}.csv")
        jobs = jobs[:QUICK_JOBS] if quick else jobs
    cluster = Cluster.uniform(4, 4) if quick else Cluster.uniform(SIM_DEFAULT_NODES, SIM_DEFAULT_CPUS_PER_NODE)
    cfg = SimConfig(restart_delay=settings["restart_delay_s"], report_noise=settings["report_noise"])
    res = simulate(jobs, profiles, _policy(pol, settings["p"], settings["restart_delay_s"]), cluster=cluster,
                   interval=settings["interval_s"], config=cfg)
    return {"axis": axis, "value": value, "policy": pol, "avg_jct_s": res.avg_jct,
            "p99_jct_s": res.p99_jct, "makespan_s": res.makespan,
            "completed": res.completed, "jobs": res.num_jobs, "wall_s": res.wall_seconds,
            "machine": machine_name()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workload", type=int, default=6)
    ap.add_argument("--policies", nargs="+", default=["pollux", "tiresias"])
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    traces = Path(args.traces) if args.traces else default_trace_dir()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    axes = QUICK_AXES if args.quick else AXES
    tasks = [
        {"axis": axis, "value": value, "policy": pol, "quick": args.quick, "traces": str(traces),
         "workload": args.workload}
        for axis, values in axes.items() for value in values for pol in args.policies
        if not (axis == "p" and pol != "pollux")
    ]
    rows = []

    def record(task: dict, row: dict) -> None:
        rows.append(row)
        log.info("done %s", {k: row[k] for k in PROGRESS_FIELDS})
        pd.DataFrame(rows).sort_values(["axis", "value", "policy"]).to_csv(out / "sensitivity.csv", index=False)

    run_tasks(run_one, tasks, jobs=args.jobs, on_result=record)
    df = pd.DataFrame(rows).sort_values(["axis", "value", "policy"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for axis, grp in df.groupby("axis"):
        fig, ax = plt.subplots(figsize=(4, 3))
        for pol, g in grp.groupby("policy"):
            ax.plot(g["value"], g["avg_jct_s"] / 3600, marker="o", label=pol)
        ax.set_xlabel(axis)
        ax.set_ylabel("average JCT (h)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"sensitivity-{axis}.png", dpi=120)
        plt.close(fig)
    print(df.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
