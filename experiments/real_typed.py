"""Policies on a real heterogeneous cluster: the quick ``hetero`` set on ``local-hetero``.

``local-hetero`` is one node ``fast`` (one unthrottled CPU) and one node
``slow`` (one CPU at a 0.5 cgroup CPU quota; needs root and writable cgroups,
see ``docs/node-types.md``).  Each policy runs the quick ``hetero`` set in
turn through :func:`pollux_opt.backends.local.run_demo` (its own directory
under ``--out``; an existing one is resumed), and each run becomes one row of
``--csv`` (appended, under its ``--sweep`` label)::

    python experiments/real_typed.py --out results/real-typed --sweep 1 \\
        --csv experiments/results/real_typed.csv

With ``--gpus N`` the cluster is this machine's first N GPUs (node type ``gpu``)
beside its remaining CPU cores (``cpu``) instead (``docs/gpus.md``), and the
step ratio is cpu/gpu::

    python experiments/real_typed.py --gpus 1 --out results/real-gpu --csv experiments/results/real_gpu.csv

Columns: ``policy``, ``avg_jct_s``, ``p99_jct_s``, ``max_jct_s``, ``makespan_s``,
``worst_rho``, ``restarts`` (all jobs), ``load1`` (mean 1-minute load during the
run), ``wall_s``, ``step_ratio`` (median over the run's jobs that measured both
types of the slow/fast step time their own fits predict at one replica and
the job's M0; NaN where no job ran on both) and ``sweep_step_ratio`` (the same
ratio per job kind over every run of the sweep, fits of one run's ``fast``
against another's ``slow``; median over the kinds).  Wall-clock numbers on a
shared 2-core machine: compare policies within one sweep.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_cluster import LoadSampler  # noqa: E402
from runtime_measurements import devices  # noqa: E402

from pollux_opt.backends.local import run_demo  # noqa: E402
from pollux_opt.backends.local.nodes import CPU_TYPE_NAME, GPU_TYPE_NAME, gpu_cluster  # noqa: E402
from pollux_opt.model import step_time  # noqa: E402
from pollux_opt.model.cluster_types import PRESETS  # noqa: E402
from pollux_opt.records.events import goodput_model_from_json, read_events  # noqa: E402

#: The policies compared, in the order they run.
POLICIES = ("fixed", "dynamic", "pollux", "pollux-unaware", "sia")
CLUSTER = "local-hetero"
WORKLOAD = "hetero"


def _step_times(events: list[dict]) -> dict[str, dict[str, float]]:
    """``{job id: {node type: predicted step time (s) at one replica and the job's M0}}``
    from the ``type_models`` of the ``complete`` events (own fits only)."""
    out: dict[str, dict[str, float]] = {}
    for e in events:
        if e["type"] != "complete":
            continue
        for node_type, data in (e.get("type_models") or {}).items():
            model = goodput_model_from_json(data)
            m0 = model.limits.init_batch_size
            out.setdefault(e["job_id"], {})[node_type] = float(step_time(model.throughput_params, 1, 1, m0, 0))
    return out


#: The (slower, faster) node types whose step times the ratio compares, per cluster.
SLOW_FAST = {CLUSTER: ("slow", "fast"), "gpus": (CPU_TYPE_NAME, GPU_TYPE_NAME)}


def _ratio(times: dict[str, float], slow: str, fast: str) -> float:
    return times[slow] / times[fast] if {fast, slow} <= set(times) else math.nan


def run_policy(out: Path, policy: str, interval: float | None, cluster: str = CLUSTER, types=None) -> dict:
    """One policy's run (resumed where it exists) on ``types`` (default: the
    ``local-hetero`` preset), as one CSV row."""
    start = time.monotonic()
    with LoadSampler() as load:
        summary = run_demo(out, WORKLOAD, quick=True, interval=interval, policies=(policy,),
                           cluster=types or PRESETS[CLUSTER], progress=False)[policy]
    jobs = summary["jobs"]
    times = _step_times(read_events(out / policy / "events.jsonl"))
    ratios = [r for r in (_ratio(t, *SLOW_FAST[cluster]) for t in times.values()) if math.isfinite(r)]
    return {
        "policy": policy, "avg_jct_s": summary.get("avg_jct_s"), "p99_jct_s": summary.get("p99_jct_s"),
        "max_jct_s": max((j["jct_s"] for j in jobs if j.get("jct_s") is not None), default=math.nan),
        "makespan_s": summary.get("makespan_s"), "worst_rho": summary.get("worst_rho"),
        "restarts": sum(int(j.get("restarts") or 0) for j in jobs), "num_completed": summary.get("num_completed"),
        "load1": load.mean, "wall_s": time.monotonic() - start,
        "step_ratio": statistics.median(ratios) if ratios else math.nan, "_times": times,
    }


def sweep_ratio(rows: list[dict], kinds: dict[str, str], slow: str = "slow", fast: str = "fast") -> float:
    """Median over job kinds of (median slow step time) / (median fast step time), pooled over the runs."""
    by_kind: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        for job_id, times in row["_times"].items():
            for node_type, t in times.items():
                by_kind[kinds.get(job_id, job_id)][node_type].append(t)
    ratios = [statistics.median(t[slow]) / statistics.median(t[fast])
              for t in by_kind.values() if t.get(slow) and t.get(fast)]
    return statistics.median(ratios) if ratios else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), metavar="POLICY")
    parser.add_argument("--out", default="results/real-typed", help="output directory")
    parser.add_argument("--interval", type=float, help="round interval in seconds (default 10, the quick demo's)")
    parser.add_argument("--csv", type=Path, help="append one row per run to this CSV")
    parser.add_argument("--sweep", default="1", help="label of this sweep in the CSV (default 1)")
    parser.add_argument("--gpus", type=int, default=0,
                        help="this machine's first N GPUs beside its CPU cores instead of local-hetero")
    args = parser.parse_args(argv)
    cluster, types = ("gpus", gpu_cluster(args.gpus)) if args.gpus else (CLUSTER, None)
    logging.basicConfig(level=logging.WARNING)
    import pandas as pd

    from pollux_opt.workloads.load import load_workload

    kinds = {j.id: j.kind for j in load_workload(WORKLOAD, quick=True).jobs}
    out = Path(args.out)
    rows = [run_policy(out, p, args.interval, cluster, types) for p in args.policies]
    ratio = sweep_ratio(rows, kinds, *SLOW_FAST[cluster])
    label = CLUSTER if types is None else (f"{args.gpus} x {devices(args.gpus)[1]} + "
                                           f"{types.total_replicas - args.gpus} CPU cores")
    table = pd.DataFrame([{k: v for k, v in r.items() if k != "_times"} for r in rows]).assign(
        sweep_step_ratio=ratio, sweep=args.sweep, cluster=label, workload=f"{WORKLOAD}-quick")
    print(table.set_index("policy").to_string(float_format=lambda x: f"{x:.3g}"))
    (out / "headline.json").write_text(json.dumps(table.to_dict(orient="records"), indent=2))
    if args.csv is not None:
        table.to_csv(args.csv, mode="a", header=not args.csv.exists(), index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
