"""Autoscaled clusters in simulation: node-hours (cost) against completion time, per sizing rule.

Three sets (``--sets``):

* ``cloud``: Pollux's cloud case, one large ImageNet job alone (the first
  ImageNet job of AdaptDL's workload-6, as its user submitted it, arriving at
  0) on at most 16 x 4 GPUs: the goodput cost rule at several time values,
  the goodput threshold rule at several thresholds, the throughput threshold
  rule with the job co-adapting its batch (the sizing decision
  alone) and with the job weak-scaling (its submitted per-replica batch, the
  total growing with its replicas: the system of Or et al., MLSys 2020), and
  fixed clusters of several sizes.  Each run's cluster size over time goes to
  ``autoscale_timeline.csv``.
* ``adaptdl``: the eight AdaptDL workloads under Pollux on an autoscaled
  16 x 4 maximum (the goodput cost rule at several time values, the goodput
  and throughput threshold rules; the threshold rules also with a longer
  release hold, :data:`LONGER_HOLDS`), beside fixed clusters of 16, 14 and 12
  nodes.
* ``sia``: the same workloads on ``sia-64``'s node types under Pollux (type-aware),
  each type priced per node-hour (:data:`SIA_PRICES`), autoscaled (as ``adaptdl``)
  and fixed.

Every run's nodes come up 120 s after their request (``--startup``), min 1 node.
Writes ``OUT/autoscale.csv`` (one row per run; a rerun of the same run replaces
its row), ``OUT/autoscale_timeline.csv`` and two plots from them:
``autoscale_cloud.png`` (the cloud case's cluster size over time) and
``autoscale_cost.png`` (node-hours, or cost where priced, against average JCT
per rule, means over the workloads, with ``autoscale_bound.py``'s lower bound
where ``OUT/autoscale_bound.csv`` is present); ``--plot-only`` redraws them.

    python experiments/autoscale.py --out experiments/results --jobs 2
    python experiments/autoscale.py --out /tmp/q --quick --sets cloud adaptdl --workloads 1
    python experiments/autoscale.py --out experiments/results --plot-only
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from pollux_opt import Cluster
from pollux_opt.backends.sim import SimConfig, default_trace_dir, load_profiles, quiet_library_logs, run_tasks, simulate
from pollux_opt.cli.simulate import cluster_and_profiles
from pollux_opt.records.events import read_events
from pollux_opt.records.files import atomic_write_csv
from pollux_opt.records.timelines import node_timeline
from pollux_opt.scheduling.autoscale import ScaleOptions
from pollux_opt.workloads.adaptdl import read_adaptdl_csv
from results_autoscale import node_hours_bound, run_label
from solver_speed import machine_name

log = logging.getLogger("autoscale")

#: Price per node-hour of sia-64's types, US dollars: AWS EC2 on-demand, Linux,
#: us-east-1 (g4dn.12xlarge, 4 x T4: 3.912; p4d.24xlarge, 8 x A100 40GB:
#: 32.7726).  No cloud sells 8 x RTX 2080 Ti nodes: ``rtx`` is priced at the
#: T4 node's price per GPU (0.978), an assumption of this experiment.
SIA_PRICES = {"aws": 3.912, "rtx": 8 * 3.912 / 4, "dgx-ext": 32.7726}
#: The cloud case's job: the first ImageNet job of this workload.
CLOUD_WORKLOAD = 6
#: The columns that name one run.
RUN_KEY = ["set", "workload", "rule", "time_value", "grow_above", "shrink_below", "weak_scaling", "nodes",
           "release_after_s"]
QUICK_JOBS = 12
#: The goodput cost rule's time values (slot-seconds per job-second) per set.
GOODPUT_TIME_VALUES = {"cloud": (8, 12, 16, 24, 32, 48, 64), "adaptdl": (2, 4, 8, 16, 32), "sia": (4, 16, 32, 64)}
#: Goodput threshold-rule thresholds (grow_above; shrink_below is half of it) per set.
GOODPUT_GROW = {"cloud": (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7), "adaptdl": (0.3, 0.5, 0.7),
                "sia": (0.25, 0.5, 1.0)}
THROUGHPUT_GROW = 0.5
#: Longer release holds (seconds a smaller size must be wanted before nodes go; the
#: default is the start-up delay), run with the goodput rule at 0.5 and the throughput rule.
LONGER_HOLDS = {"cloud": (), "adaptdl": (600.0,), "sia": (600.0,)}
#: Fixed cluster sizes per set (nodes of 4; None: the whole ``sia-64``).
FIXED_NODES = {"cloud": (2, 4, 8, 12, 16), "adaptdl": (12, 14, 16), "sia": (None,)}
#: The largest cluster of the 4-GPU-node sets: 16 x 4, the paper's.
MAX_NODES = 16


def _jobs(task: dict):
    traces = Path(task["traces"])
    if task["set"] == "cloud":
        jobs = read_adaptdl_csv(traces / "workloads" / f"workload-{CLOUD_WORKLOAD}.csv")
        first = next(j for j in sorted(jobs, key=lambda j: j.arrival_s) if j.kind == "imagenet")
        return [replace(first, arrival_s=0.0)]
    jobs = read_adaptdl_csv(traces / "workloads" / f"workload-{task['workload']}.csv")
    return jobs[:QUICK_JOBS] if task["quick"] else jobs


def run_one(task: dict) -> tuple[dict, list[dict]]:
    """Top-level (picklable): simulate one run; its CSV row and its timeline rows."""
    quiet_library_logs()
    if task["set"] == "sia":
        cluster, profiles = cluster_and_profiles("sia-64", None, None, task["traces"], None)
        prices = SIA_PRICES
    else:
        profiles = load_profiles(task["traces"])
        cluster, prices = Cluster.uniform(task["nodes"] or MAX_NODES, 4), None
    threshold = {} if task["lam"] is not None else {"grow_above": task["grow_above"],
                                                      "shrink_below": task["shrink_below"]}
    scale = None if task["rule"] == "fixed" else ScaleOptions(
        min_nodes=1, rule=task["rule"], time_value=task["lam"], startup_s=task["startup"], release_after=task["hold"],
        **threshold)
    res = simulate(_jobs(task), profiles, "pollux", cluster=cluster, config=SimConfig(weak_scaling=task["weak"]),
                   out_dir=task["out_dir"], autoscale=scale, prices=prices)
    sizes = node_timeline(read_events(Path(task["out_dir"]) / "events.jsonl"))
    # nodes provisioned over time, all types: each type's last row at each event time
    total = (sizes.groupby(["t", "type"]).provisioned.last().groupby("t").sum() if len(sizes)
             else pd.Series(dtype=float))
    row = {
        "set": task["set"], "workload": task["name"], "rule": task["rule"], "time_value": task["lam"],
        "band": None if task["lam"] is None else scale.band, "grow_above": task["grow_above"],
        "shrink_below": task["shrink_below"], "weak_scaling": task["weak"],
        "nodes": len(cluster.nodes),
        "startup_s": task["startup"],
        "release_after_s": None if scale is None else scale.hold_s, "jobs": res.num_jobs, "completed": res.completed,
        "avg_jct_s": res.avg_jct, "p99_jct_s": res.p99_jct, "makespan_s": res.makespan,
        "node_hours": res.node_hours, "cost": res.cost,
        "most_nodes": int(total.max()) if len(total) else len(cluster.nodes),
        "wall_s": res.wall_seconds, "machine": machine_name(),
    }
    label = run_label(row)
    timeline = [{"set": task["set"], "workload": task["name"], "run": label, "t": float(t), "nodes": int(n)}
                for t, n in total.items()] if task["set"] == "cloud" else []
    return row, timeline


def tasks_for(args) -> list[dict]:
    base = {"traces": str(args.traces), "quick": args.quick, "startup": args.startup}
    out = []

    def add(set_, name, rule, grow=None, weak=False, nodes=None, hold=None, lam=None):
        shrink = None if grow is None else grow / 2
        run = (f"{set_}-{name}-{rule}-{grow}-{weak}-{nodes}" + ("" if hold is None else f"-hold{hold:g}")
               + ("" if lam is None else f"-lambda{lam:g}"))
        out.append({**base, "set": set_, "name": name, "workload": name.split("-")[-1], "rule": rule,
                    "lam": None if lam is None else float(lam), "grow_above": grow, "shrink_below": shrink,
                    "weak": weak, "nodes": nodes, "hold": hold,
                    "out_dir": str(Path(args.runs) / run)})

    for set_ in args.sets:
        names = ["imagenet"] if set_ == "cloud" else [f"workload-{w}" for w in args.workloads]
        grows = GOODPUT_GROW[set_][:2] if args.quick else GOODPUT_GROW[set_]
        lams = GOODPUT_TIME_VALUES[set_][::2] if args.quick else GOODPUT_TIME_VALUES[set_]
        for name in names:
            for lam in lams:
                add(set_, name, "goodput", lam=lam)
            for g in grows:
                add(set_, name, "goodput", g)
            add(set_, name, "throughput", THROUGHPUT_GROW)
            for hold in () if args.quick else LONGER_HOLDS[set_]:
                add(set_, name, "goodput", 0.5, hold=hold)
                add(set_, name, "throughput", THROUGHPUT_GROW, hold=hold)
            if set_ == "cloud":
                add(set_, name, "throughput", THROUGHPUT_GROW, weak=True)
                add(set_, name, "fixed", weak=True, nodes=16)
            for n in FIXED_NODES[set_]:
                add(set_, name, "fixed", nodes=n)
    return out


def _keys(df: pd.DataFrame, key: list[str] = RUN_KEY) -> pd.Series:
    """One string per row of ``df``'s ``key`` columns (one it lacks: empty)."""
    return df.reindex(columns=key).apply(lambda r: "|".join("" if pd.isna(v) else str(v) for v in r), axis=1)


def _sia_cluster() -> Cluster:
    from pollux_opt.model.cluster_types import load_cluster_types

    return Cluster.from_types(load_cluster_types("sia-64"))


def _task_key(task: dict) -> str:
    """A task's :func:`_keys` string, as its row will have it."""
    nodes = task["nodes"] or (MAX_NODES if task["set"] != "sia" else len(_sia_cluster().nodes))
    hold = None if task["rule"] == "fixed" else (task["startup"] if task["hold"] is None else task["hold"])
    row = {"set": task["set"], "workload": task["name"], "rule": task["rule"], "time_value": task["lam"],
           "grow_above": task["grow_above"],
           "shrink_below": task["shrink_below"], "weak_scaling": task["weak"], "nodes": nodes,
           "release_after_s": hold}
    return _keys(pd.DataFrame([row]).astype({"time_value": float, "grow_above": float, "shrink_below": float,
                                             "release_after_s": float})).iloc[0]


def _merge(path: Path, new: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """``path``'s rows whose ``key`` no new row has, then the new rows."""
    if not path.is_file():
        return new
    old = pd.read_csv(path)
    return pd.concat([old[~_keys(old, key).isin(set(_keys(new, key)))], new], ignore_index=True)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cloud(timeline: pd.DataFrame, runs: pd.DataFrame, path: Path) -> None:
    """The cloud case's nodes over time (hours), one step line per autoscaled run: the cost
    rule's runs in one panel, the threshold rule's in another, the throughput runs in both."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    ordered = runs.sort_values(["rule", "weak_scaling", "time_value", "grow_above"]).to_dict("records")
    groups = dict(tuple(timeline.groupby("run", sort=False)))
    cost = [r for r in ordered if r["rule"] == "goodput" and not pd.isna(r.get("time_value"))]
    threshold = [r for r in ordered if r["rule"] == "goodput" and pd.isna(r.get("time_value"))]
    baseline = [r for r in ordered if r["rule"] == "throughput"]
    for ax, chosen, title in ((axes[0], cost, "goodput, cost rule"), (axes[1], threshold, "goodput, threshold rule")):
        for r in chosen + baseline:
            label = run_label(r)
            if label not in groups:
                continue
            g, end = groups[label], r["makespan_s"]
            t = list(g.t[g.t <= end]) + [end]
            n = list(g.nodes[g.t <= end])
            ax.step([x / 3600 for x in t], n + n[-1:], where="post", label=label,
                    linestyle="--" if r["rule"] == "throughput" else "-")
        ax.set_xlabel("hours since submission")
        ax.set_title(f"One ImageNet job: {title}")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("nodes (4 GPUs each) provisioned")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_cost(df: pd.DataFrame, path: Path, bound: pd.DataFrame | None = None) -> None:
    """Per set of several workloads: mean node-hours (cost where priced) against mean average JCT, per
    run, and ``bound``'s least node-hours at each average JCT (``autoscale_bound.py``) where given."""
    plt = _pyplot()
    sets = [s for s in ("adaptdl", "sia") if s in set(df.set)]
    if not sets:
        return
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4.2), squeeze=False)
    for ax, set_ in zip(axes[0], sets):
        sub = df[df.set == set_].assign(label=lambda d: [run_label(r) for r in d.to_dict("records")])
        y = "cost" if sub.cost.notna().all() else "node_hours"
        means = sub.groupby(["rule", "label"], sort=False)[["avg_jct_s", y]].mean().reset_index()
        for rule, marker in (("goodput", "o"), ("throughput", "s"), ("fixed", "x")):
            m = means[means.rule == rule]
            ax.scatter(m.avg_jct_s, m[y], marker=marker, label=rule)
            for r in m.itertuples():
                ax.annotate(r.label.split(" ", 1)[1] if rule != "throughput" else "", (r.avg_jct_s, getattr(r, y)),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
        if bound is not None and set_ == "adaptdl":
            jct = np.linspace(means.avg_jct_s.min(), means.avg_jct_s.max(), 50)
            ax.plot(jct, [node_hours_bound(bound, j) for j in jct], "k--", lw=1,
                    label="lower bound (no contention)")
        ax.set_xlabel("average JCT, s (mean over workloads)")
        ax.set_ylabel("cost, USD" if y == "cost" else "node-hours")
        ax.set_title("AdaptDL workloads, 16 x 4 at most" if set_ == "adaptdl" else "sia-64's types, priced")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_all(out: Path) -> None:
    df = pd.read_csv(out / "autoscale.csv")
    bound = out / "autoscale_bound.csv"
    plot_cost(df, out / "autoscale_cost.png", pd.read_csv(bound) if bound.is_file() else None)
    if (out / "autoscale_timeline.csv").is_file() and (df.set == "cloud").any():
        plot_cloud(pd.read_csv(out / "autoscale_timeline.csv"), df[df.set == "cloud"], out / "autoscale_cloud.png")


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="folder of autoscale.csv and autoscale_timeline.csv")
    p.add_argument("--runs", type=Path, default=None, help="run directories (default runs/autoscale)")
    p.add_argument("--sets", nargs="+", default=["cloud", "adaptdl", "sia"], choices=["cloud", "adaptdl", "sia"])
    p.add_argument("--workloads", nargs="+", type=int, default=list(range(1, 9)))
    p.add_argument("--traces", type=Path, default=default_trace_dir())
    p.add_argument("--startup", type=float, default=120.0, help="node start-up seconds")
    p.add_argument("--jobs", type=int, default=1, help="simulations in parallel processes")
    p.add_argument("--quick", action="store_true", help="two goodput settings; 12 jobs of each workload")
    p.add_argument("--plot-only", action="store_true", help="redraw the plots from OUT's CSVs; run nothing")
    p.add_argument("--resume", action="store_true", help="skip the runs that OUT/autoscale.csv already has")
    args = p.parse_args(argv)
    args.runs = args.runs or Path("runs") / "autoscale"
    args.out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        plot_all(args.out)
        return 0
    tasks = tasks_for(args)
    if args.resume and (args.out / "autoscale.csv").is_file():
        done_runs = set(_keys(pd.read_csv(args.out / "autoscale.csv")))
        tasks = [t for t in tasks if _task_key(t) not in done_runs]
        log.info("resuming: %d runs left", len(tasks))
    rows, timelines = [], []

    def done(task, result):
        row, timeline = result
        rows.append(row)
        timelines.extend(timeline)
        log.info("%s %s %s: avg JCT %.0f s, %.1f node-hours", row["set"], row["workload"], run_label(row),
                 row["avg_jct_s"], row["node_hours"])
        atomic_write_csv(args.out / "autoscale.csv", _merge(args.out / "autoscale.csv", pd.DataFrame(rows), RUN_KEY))

    run_tasks(run_one, tasks, jobs=args.jobs, on_result=done)
    if timelines:
        atomic_write_csv(args.out / "autoscale_timeline.csv",
                         _merge(args.out / "autoscale_timeline.csv", pd.DataFrame(timelines),
                                ["set", "workload", "run"]))
    plot_all(args.out)
    print(json.dumps({"runs": len(rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
