"""fair-jct against pollux in simulation: the AdaptDL workloads and Philly-sampled loads.

For every (workload, policy): average and p99 JCT, worst rho, Jain's index of
1 / rho, makespan and the simulation's wall time (16 x 4 nodes, interval 60 s
by default).  Workloads are the eight AdaptDL CSVs (``--workloads``) and, with
``--loads``, workloads sampled from ``philly.csv`` by
:func:`~pollux_opt.workloads.adaptdl.philly_workload` at each job-load
multiplier and seed.  Writes ``OUT/fair_jct.csv`` (one row per run) and
``OUT/fair_jct_means.csv`` (per set and policy).

    python experiments/fair_jct.py --out runs/fair-jct [--workloads 1 2 ..] [--jobs 2]
    python experiments/fair_jct.py --out runs/fair-jct-load --workloads --loads 0.5 1.5 2 --seeds 0 1
    python experiments/fair_jct.py --quick --out /tmp/q      # 12 jobs of workload-1 on 4 x 4

``--option NAME=VALUE`` passes a fair-jct option (e.g. ``bound=3``, ``bound=none``); ``--interval``,
``--noise`` (log-normal sigma of what jobs report) and ``--restart-delay`` (seconds
a job's start or restart costs) set the sensitivity axes.
With ``--noise``, each run's ``worst_rho_ref`` is also measured against a
noise-free reference: the metric's rho divides a job's JCT by its isolated JCT
from the model the job fitted, and under noise that model is fitted from
noisy reports, so the worst rho of a noisy run largely measures the noise of
its own yardstick.
``worst_rho_ref`` divides each JCT by the job's isolated JCT in the
noise-free Pollux run of the same workload and settings (simulated in the
same task), the same yardstick for every policy and noise level.
``--merge DIR ...`` joins the ``fair_jct.csv`` of runs made apart (e.g. two
processes on different workloads) into ``OUT/fair_jct.csv`` (``--csv`` names
another file) without simulating; a later DIR's run of the same workload,
policy and settings replaces an earlier one.

    python experiments/fair_jct.py --out experiments/results --merge runs/fj-a runs/fj-b
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import pandas as pd

from pollux_opt import Cluster
from pollux_opt.backends.sim import SimConfig, default_trace_dir, load_profiles, quiet_library_logs, run_tasks, simulate
from pollux_opt.backends.sim.state import SIM_DEFAULT_CPUS_PER_NODE, SIM_DEFAULT_INTERVAL_S, SIM_DEFAULT_NODES
from pollux_opt.model.options import DEFAULT_RESTART_DELAY
from pollux_opt.records.files import atomic_write_csv
from pollux_opt.workloads.adaptdl import philly_workload, read_adaptdl_csv
from solver_speed import machine_name

log = logging.getLogger("fair_jct")
POLICIES = ("pollux", "fair-jct")
QUICK_JOBS = 12
#: The columns that name one run (a row of the CSV).
RUN_KEY = ["set", "workload", "policy", "options", "interval_s", "report_noise", "restart_delay_s"]
#: Summary fields copied into each row.
SUMMARY_FIELDS = ("worst_rho", "frac_rho_gt_1", "jain_index")
#: The policy whose noise-free run is the yardstick of ``worst_rho_ref``.
REFERENCE_POLICY = "pollux"


def _workload(task: dict, profiles):
    traces = Path(task["traces"])
    if task["load"] is None:
        jobs = read_adaptdl_csv(traces / "workloads" / f"workload-{task['workload']}.csv")
    else:
        jobs = philly_workload(traces / "philly.csv", profiles, load=task["load"], seed=task["seed"])
    return jobs[:QUICK_JOBS] if task["quick"] else jobs


def worst_rho_against(summary: dict, reference: dict) -> float:
    """The largest ``JCT / JCT_isolated`` over the jobs completed in both runs, each JCT
    from ``summary`` and each isolated JCT from ``reference`` (``summary.json`` dicts);
    nan where no job has both."""
    iso = {j["id"]: j["jct_isolated_s"] for j in reference["jobs"] if j["completed"]}
    rho = [j["jct_s"] / iso[j["id"]] for j in summary["jobs"]
           if j["completed"] and (iso.get(j["id"]) or 0) > 0]
    return max(rho, default=math.nan)


def run_one(task: dict) -> dict:
    """Top-level (picklable): simulate one (workload, policy); one CSV row.  With report
    noise, also the noise-free :data:`REFERENCE_POLICY` run of ``worst_rho_ref``."""
    quiet_library_logs()
    profiles = load_profiles(task["traces"])
    jobs = _workload(task, profiles)
    cluster = Cluster.uniform(task["nodes"], SIM_DEFAULT_CPUS_PER_NODE)
    options = task["options"] if task["policy"].startswith("fair-jct") else {}

    def run(policy: str, noise: float, out_dir: Path, policy_options: dict):
        config = SimConfig(report_noise=noise, restart_delay=task["restart_delay"])
        res = simulate(jobs, profiles, policy, cluster=cluster, interval=task["interval"],
                       config=config, out_dir=out_dir, policy_options=policy_options)
        return res, json.loads((out_dir / "summary.json").read_text())

    res, summary = run(task["policy"], task["noise"], Path(task["out_dir"]), options)
    ref_rho = math.nan
    if task["noise"] > 0:
        ref = run(REFERENCE_POLICY, 0.0, Path(task["out_dir"]) / "reference", {})[1]
        ref_rho = worst_rho_against(summary, ref)
    return {
        "set": task["set"], "workload": task["name"], "load": task["load"], "seed": task["seed"],
        "policy": task["policy"], "options": json.dumps(options, sort_keys=True),
        "interval_s": task["interval"], "report_noise": task["noise"], "restart_delay_s": task["restart_delay"],
        "jobs": res.num_jobs, "completed": res.completed, "avg_jct_s": res.avg_jct, "p99_jct_s": res.p99_jct,
        "makespan_s": res.makespan, **{k: summary.get(k) for k in SUMMARY_FIELDS}, "worst_rho_ref": ref_rho,
        "wall_s": res.wall_seconds, "solver_s": res.solver_seconds, "machine": machine_name(),
    }


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def _axis_suffix(args) -> str:
    """The sensitivity settings that differ from the defaults, as a name suffix
    (e.g. ``-noise0.5``; empty at the defaults), so that each setting is its own set."""
    parts = []
    if args.noise != 0.0:
        parts.append(f"-noise{args.noise:g}")
    if args.interval != SIM_DEFAULT_INTERVAL_S:
        parts.append(f"-interval{args.interval:g}")
    if args.restart_delay != DEFAULT_RESTART_DELAY:
        parts.append(f"-restart{args.restart_delay:g}")
    return "".join(parts)


def tasks_for(args, traces: Path, out: Path) -> list[dict]:
    options = dict((kv.split("=", 1)[0], _value(kv.split("=", 1)[1])) for kv in args.option)
    base = {"traces": str(traces), "quick": args.quick, "nodes": 4 if args.quick else SIM_DEFAULT_NODES,
            "interval": args.interval, "noise": args.noise, "restart_delay": args.restart_delay, "options": options}
    axis = _axis_suffix(args)
    sets = [dict(set=f"adaptdl{axis}", name=f"workload-{w}{axis}", workload=w, load=None, seed=None)
            for w in args.workloads]
    sets += [dict(set=f"philly-{load:g}x{axis}", name=f"philly-{load:g}x-s{seed}{axis}", workload=None, load=load,
                  seed=seed) for load in args.loads for seed in args.seeds]
    return [{**base, **s, "policy": p, "out_dir": str(out / f"{s['name']}-{p}")}
            for s in sets for p in args.policies]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=None, help="trace folder (default: ../shared/traces/adaptdl-osdi21)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", nargs="+", default=list(POLICIES))
    ap.add_argument("--workloads", nargs="*", type=int, default=list(range(1, 9)))
    ap.add_argument("--loads", nargs="*", type=float, default=[])
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--option", action="append", default=[], help="fair-jct option NAME=VALUE")
    ap.add_argument("--interval", type=float, default=SIM_DEFAULT_INTERVAL_S)
    ap.add_argument("--noise", type=float, default=0.0, help="report noise (log-normal sigma of measurements)")
    ap.add_argument("--restart-delay", type=float, default=DEFAULT_RESTART_DELAY,
                    help=f"seconds a job's (re)start costs (default {DEFAULT_RESTART_DELAY:g})")
    ap.add_argument("--jobs", type=int, default=1, help="parallel processes")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                    help="join DIR/fair_jct.csv of earlier runs into OUT/fair_jct.csv (no simulation)")
    ap.add_argument("--csv", default="fair_jct.csv", help="file name of --merge's output (default fair_jct.csv)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.workloads, args.loads = [1], []
    traces = Path(args.traces) if args.traces else default_trace_dir()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        return _merge([Path(d) / "fair_jct.csv" for d in args.merge], out / args.csv)
    rows: list[dict] = []

    def done(task, row):
        rows.append(row)
        log.info("%s %s: avg JCT %.0f s, worst rho %.2f, wall %.0f s", row["workload"], row["policy"],
                 row["avg_jct_s"], row["worst_rho"] or float("nan"), row["wall_s"])
        atomic_write_csv(out / "fair_jct.csv", pd.DataFrame(rows))

    run_tasks(run_one, tasks_for(args, traces, out), jobs=args.jobs, on_result=done)
    _write_means(pd.DataFrame(rows), out / "fair_jct_means.csv")
    return 0


def _write_means(df: pd.DataFrame, path: Path) -> None:
    """``path``: per set, policy and options, the means of the runs' figures."""
    means = df.groupby(["set", "policy", "options"])[["avg_jct_s", "p99_jct_s", "worst_rho", "jain_index",
                                                      "wall_s"]].mean()
    atomic_write_csv(path, means.reset_index())
    log.info("\n%s", means.to_string())


def _merge(paths: list[Path], target: Path) -> int:
    """Join the CSVs at ``paths`` into ``target`` (and its means beside it, ``*_means.csv``);
    of rows with the same :data:`RUN_KEY`, the last one's."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"--merge: no fair_jct.csv at {missing}")
    df = pd.concat([pd.read_csv(p) for p in paths], ignore_index=True)
    # runs written without the column ran at the default delay
    df["restart_delay_s"] = df.get("restart_delay_s", pd.Series(index=df.index, dtype=float)).fillna(
        DEFAULT_RESTART_DELAY)
    # a later DIR's run of the same set, workload, policy and settings replaces an earlier one
    df = df.drop_duplicates(RUN_KEY, keep="last").reset_index(drop=True)
    atomic_write_csv(target, df)
    _write_means(df, target.with_name(target.stem + "_means.csv"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
