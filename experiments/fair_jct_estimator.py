"""Error of fair-jct's online remaining-work estimate against the simulator's truth.

Simulates AdaptDL workloads under fair-jct and, every ``--every`` rounds, logs
for each running or queued job with a fitted model: its attained work, the
policy's estimate of its remaining work (mean residual of the learned work
distribution, reference seconds; see
:mod:`pollux_opt.scheduling.policies.remaining`) and the true remaining work
(the profile's progress to completion, minus the job's progress, in the same
reference seconds).  The truth is read by this script only, never by the policy.

Writes ``OUT/fair_jct_estimator_rounds.csv`` (one row per logged job-round)
and ``OUT/fair_jct_estimator.csv``: per workload, estimator variant and
application, the median and 90th percentile of the relative error
``|estimate - truth| / truth`` and the median ratio ``estimate / truth``.

    python experiments/fair_jct_estimator.py --out runs/fj-est [--workloads 1 6] [--jobs 2]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from pollux_opt import Cluster
from pollux_opt.backends.sim import default_trace_dir, load_profiles, quiet_library_logs, run_tasks
from pollux_opt.backends.sim.backend import SimBackend
from pollux_opt.backends.sim.state import SIM_DEFAULT_CPUS_PER_NODE, SIM_DEFAULT_INTERVAL_S, SIM_DEFAULT_NODES
from pollux_opt.records.files import atomic_write_csv
from pollux_opt.records.events import NullLog
from pollux_opt.scheduling.loop import run as run_loop
from pollux_opt.scheduling.policies import FairJctPolicy
from pollux_opt.scheduling.policies.remaining import reference_rate
from pollux_opt.workloads.adaptdl import read_adaptdl_csv

log = logging.getLogger("fair_jct_estimator")


class _Logged(FairJctPolicy):
    """fair-jct that records its estimates beside the backend's truth (experiment only)."""

    def attach(self, backend: SimBackend, every: int) -> None:
        self._backend, self._every, self._round, self.rows = backend, every, 0, []

    def estimates(self, cluster, active):
        est = super().estimates(cluster, active)
        self._round += 1
        if self._round % self._every:
            return est
        for v in active:
            if v.goodput_model is None:
                continue
            job = self._backend._jobs[v.job_id]  # the truth, for the log only
            p = job.profile
            true_rem = (p.progress_at(p.max_epochs) - v.progress) / reference_rate(v.goodput_model)
            done, rem = est[v.job_id].done, est[v.job_id].remaining
            self.rows.append({"t": self._backend.now(), "job_id": v.job_id, "application": job.spec.kind,
                              "completed_seen": self._history.completed, "done": done, "estimate": rem,
                              "truth": true_rem})
        return est


def run_one(task: dict) -> list[dict]:
    """Top-level (picklable): one workload under one estimator variant; the logged rows."""
    quiet_library_logs()
    traces = Path(task["traces"])
    profiles = load_profiles(traces)
    jobs = read_adaptdl_csv(traces / "workloads" / f"workload-{task['workload']}.csv")
    cluster = Cluster.uniform(SIM_DEFAULT_NODES, SIM_DEFAULT_CPUS_PER_NODE)
    backend = SimBackend(jobs, profiles, cluster)
    policy = _Logged(by_family=task["by_family"])
    policy.attach(backend, task["every"])
    run_loop(backend, policy, cluster, NullLog(), interval=SIM_DEFAULT_INTERVAL_S, max_rounds=task["max_rounds"])
    variant = "by-family" if task["by_family"] else "pooled"
    return [{"workload": f"workload-{task['workload']}", "variant": variant, **r} for r in policy.rows]


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per workload, variant and application: error statistics of the estimate."""
    df = rows[rows.truth > 0].copy()
    df["rel_error"] = (df.estimate - df.truth).abs() / df.truth
    df["ratio"] = df.estimate / df.truth
    groups = [df.assign(application="all"), df]
    out = pd.concat(groups).groupby(["workload", "variant", "application"]).agg(
        samples=("rel_error", "size"), median_rel_error=("rel_error", "median"),
        p90_rel_error=("rel_error", lambda x: float(np.percentile(x, 90))),
        median_ratio=("ratio", "median"))
    return out.reset_index()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", nargs="+", type=int, default=[1, 6])
    ap.add_argument("--every", type=int, default=10, help="log every this many rounds")
    ap.add_argument("--variants", nargs="+", choices=["by-family", "pooled"], default=["by-family", "pooled"])
    ap.add_argument("--max-rounds", type=int, default=None, help="stop each simulation after this many rounds")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    traces = str(Path(args.traces) if args.traces else default_trace_dir())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = [{"traces": traces, "workload": w, "by_family": f, "every": args.every, "max_rounds": args.max_rounds}
             for w in args.workloads for f in (v == "by-family" for v in args.variants)]
    rows = pd.DataFrame([r for res in run_tasks(run_one, tasks, jobs=args.jobs) for r in res])
    atomic_write_csv(out / "fair_jct_estimator_rounds.csv", rows)
    summary = summarize(rows)
    atomic_write_csv(out / "fair_jct_estimator.csv", summary)
    log.info("\n%s", summary.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
