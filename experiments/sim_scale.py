"""Scale study: 64 to 2048 CPUs with proportional load,
synthetic parametric profiles, recording the policy's solver time per round.

Writes ``OUT/scale.csv`` (one row per cluster size and policy: avg JCT,
rounds, mean and max solver seconds per round, wall time) and ``OUT/scale.png``.

    python experiments/sim_scale.py --out runs/sim-scale --sizes 64 128 256 512 --jobs 2
    python experiments/sim_scale.py --out runs/sim-scale-big --sizes 1024 2048 --max-rounds 60
    python experiments/sim_scale.py --quick --out /tmp/q
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from pollux_opt import Cluster
from pollux_opt.backends.sim import ParametricProfile, quiet_library_logs, run_tasks, simulate
from pollux_opt.workloads.job import WorkloadJob
from solver_speed import machine_name

log = logging.getLogger("sim_scale")
#: Row fields logged as each run finishes.
PROGRESS_FIELDS = ("cpus", "policy", "rounds", "mean_solver_s", "wall_s")

SIZES = [64, 128, 256, 512, 1024, 2048]
QUICK_SIZES = [16, 32]
#: Jobs per CPU over the submission window (the AdaptDL workloads: 160 jobs on 64 GPUs).
JOBS_PER_CPU = 160 / 64
CPUS_PER_NODE = 4
WINDOW_S = 8 * 3600.0


def synthetic_profiles() -> dict[str, ParametricProfile]:
    """Three synthetic applications: small/noisy, medium, large/communication-heavy."""
    return {
        "small": ParametricProfile("small", alpha_c=0.01, beta_c=0.0005, noise_start=2, noise_end=40, max_epochs=10),
        "medium": ParametricProfile("medium", max_epochs=20),
        "large": ParametricProfile("large", alpha_c=0.1, beta_c=0.004, alpha_r=0.2, beta_r=0.01,
                                   noise_start=5, noise_end=100, max_epochs=30),
    }


def workload(cpus: int, seed: int, window_s: float) -> list[WorkloadJob]:
    rng = np.random.default_rng(seed)
    n = max(2, int(round(JOBS_PER_CPU * cpus)))
    apps = rng.choice(["small", "medium", "large"], size=n, p=[0.6, 0.3, 0.1])
    times = np.sort(rng.uniform(0, window_s, size=n))
    return [WorkloadJob(id=f"{a}-{i}", kind=str(a), arrival_s=float(round(t)),
                        replicas={"small": 1, "medium": 4, "large": 8}[a],
                        batch_size={"small": 256, "medium": 512, "large": 1024}[a])
            for i, (a, t) in enumerate(zip(apps, times))]


def run_one(task: dict) -> dict:
    """Top-level (picklable): simulate one (cluster size, policy) pair; one CSV row."""
    quiet_library_logs()
    cpus, pol = task["cpus"], task["policy"]
    jobs = workload(cpus, seed=cpus, window_s=task["window_s"])
    per_round: list[float] = []
    res = simulate(jobs, synthetic_profiles(), pol, cluster=Cluster.uniform(cpus // CPUS_PER_NODE, CPUS_PER_NODE),
                   progress=lambda now, views, d: per_round.append(d.solver_seconds), max_rounds=task["max_rounds"])
    return {"cpus": cpus, "policy": pol, "jobs": len(jobs), "completed": res.completed,
            "avg_jct_s": res.avg_jct if res.completed == len(jobs) else float("nan"), "rounds": res.rounds,
            "max_rounds": task["max_rounds"],
            "mean_solver_s": float(np.mean(per_round)) if per_round else float("nan"),
            "p95_solver_s": float(np.quantile(per_round, 0.95)) if per_round else float("nan"),
            "max_solver_s": float(np.max(per_round)) if per_round else float("nan"),
            "wall_s": res.wall_seconds, "machine": machine_name()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", nargs="+", default=["pollux", "tiresias"])
    ap.add_argument("--sizes", nargs="+", type=int, default=None)
    ap.add_argument("--max-rounds", type=int, default=None,
                    help="stop each run after this many rounds (solver timing at sizes too large to run to the end; "
                         "avg JCT is then left empty)")
    ap.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    window = 3600.0 if args.quick else WINDOW_S
    tasks = [{"cpus": c, "policy": p, "window_s": window, "max_rounds": args.max_rounds}
             for c in sizes for p in args.policies]
    rows = []

    def record(task: dict, row: dict) -> None:
        rows.append(row)
        log.info("done %s", {k: row[k] for k in PROGRESS_FIELDS})
        pd.DataFrame(rows).sort_values(["cpus", "policy"]).to_csv(out / "scale.csv", index=False)

    run_tasks(run_one, tasks, jobs=args.jobs, on_result=record)
    df = pd.DataFrame(rows).sort_values(["cpus", "policy"])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3))
    for pol, g in df.groupby("policy"):
        ax.loglog(g["cpus"], g["mean_solver_s"], marker="o", label=pol)
    ax.set_xlabel("CPUs")
    ax.set_ylabel("mean solver time per round (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "scale.png", dpi=120)
    plt.close(fig)
    print(df.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
