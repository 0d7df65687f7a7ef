"""Simulator fidelity: simulate a real run's workload with
profiles measured by the executor in that run, and compare average JCTs.

Input: a ``pollux-opt demo`` output folder (one run directory per policy) or
run directories of ``pollux-opt run``.  All runs are pooled into one set of
AdaptDL-format profiles (``pollux-opt profile``), then each run's workload is
simulated under the same policy, cluster and interval, in two variants:

* ``paper``: Pollux's simulator semantics: fixed rounds (arrivals wait for
  the next round), completion the moment the target progress is reached, the
  median measured (re)start time as every restart's delay;
* ``matched``: also what the real executor does around the jobs: the loop
  starts a round early when a job arrives or reaches its target (checked every
  ``POLL_S`` as the real backend polls), a job completes only after its
  fresh-process verification, a first start costs what it took (building the
  job's data and model; each application's median measured times), and a
  one-replica job runs its batch as two micro-batches (the executor's
  variance estimate).

Writes ``OUT/fidelity.csv`` (one row per policy and variant: real and
simulated average JCT, relative error) and ``OUT/fidelity.png``, and prints
the table::

    pollux-opt demo --quick --out runs/demo
    python experiments/sim_fidelity.py runs/demo --out runs/fidelity
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pollux_opt import Cluster  # noqa: E402
from pollux_opt.model import Node  # noqa: E402
from pollux_opt.backends.local.backend import POLL_S  # noqa: E402
from pollux_opt.backends.sim import SimConfig, load_profiles, simulate  # noqa: E402
from pollux_opt.backends.sim.export import export_profiles  # noqa: E402
from pollux_opt.backends.sim.run_records import find_run_dirs  # noqa: E402
from pollux_opt.workloads.adaptdl import read_adaptdl_csv  # noqa: E402

log = logging.getLogger("sim_fidelity")

#: The fidelity target: simulated vs real average JCT within this fraction.
TARGET_REL_ERROR = 0.15


def _cluster(config: dict) -> Cluster:
    return Cluster(tuple(Node(str(n["id"]), int(n["cpus"])) for n in config["cluster"]))


def fidelity(run_args: list[str], out: Path) -> pd.DataFrame:
    """Rows: policy, variant, real and simulated average JCT (s), relative error."""
    runs = find_run_dirs(run_args)
    out.mkdir(parents=True, exist_ok=True)
    exported = export_profiles(runs, out / "profiles")
    profiles = load_profiles(out / "profiles")
    restarts = [a.restart_seconds for a in exported.values() if a.restart_seconds is not None]
    restart_delay = statistics.median(restarts) if restarts else 0.0
    verify = {name: a.verify_seconds or 0.0 for name, a in exported.items()}
    start = {name: a.start_seconds if a.start_seconds is not None else restart_delay for name, a in exported.items()}
    rows = []
    for run in runs:
        config = json.loads((run / "config.json").read_text())
        summary = json.loads((run / "summary.json").read_text())
        policy = config["policy"]
        jobs = read_adaptdl_csv(out / "profiles" / f"workload-{run.name}.csv")
        variants = {
            "paper": SimConfig(restart_delay=restart_delay),
            "matched": SimConfig(restart_delay=restart_delay, completion_delay=verify, wake_every=POLL_S,
                                 start_delay=start, split_single=True),
        }
        for variant, sim_config in variants.items():
            res = simulate(jobs, profiles, policy, cluster=_cluster(config), interval=float(config["interval_s"]),
                           config=sim_config, out_dir=out / f"{run.name}-{variant}")
            real = float(summary["avg_jct_s"])
            rows.append({
                "run": run.name, "policy": policy, "variant": variant, "jobs": len(jobs),
                "real_avg_jct_s": real, "sim_avg_jct_s": res.avg_jct,
                "rel_error": (res.avg_jct - real) / real, "restart_delay_s": restart_delay,
                "completion_delay_s": json.dumps(verify) if variant == "matched" else "{}",
            })
    table = pd.DataFrame(rows)
    table.to_csv(out / "fidelity.csv", index=False)
    _plot(table, out / "fidelity.png")
    return table


def _plot(table: pd.DataFrame, path: Path) -> None:
    """Bars of real and simulated average JCT per policy (one group per variant)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(dict.fromkeys(table.run))
    fig, ax = plt.subplots(figsize=(5, 3))
    width = 0.8 / 3
    real = table.groupby("run").real_avg_jct_s.first()
    for i, run in enumerate(runs):
        ax.bar(i - width, real[run], width, color="black", label="real" if i == 0 else None)
        for j, variant in enumerate(("paper", "matched")):
            sim = table[(table.run == run) & (table.variant == variant)].sim_avg_jct_s.iloc[0]
            ax.bar(i + j * width, sim, width, color=("tab:gray", "tab:blue")[j],
                   label=f"simulated ({variant})" if i == 0 else None)
    ax.set_xticks(range(len(runs)), runs)
    ax.set_ylabel("average JCT (s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="demo output folder(s) or run directories")
    ap.add_argument("--out", required=True, help="folder for profiles, simulated runs and fidelity.csv")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    table = fidelity(args.runs, Path(args.out))
    with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
        print(table.drop(columns=["completion_delay_s"]).to_string(index=False))
    worst = table.groupby("variant").rel_error.apply(lambda e: e.abs().max())
    for variant, err in worst.items():
        verdict = "within" if err <= TARGET_REL_ERROR else "outside"
        print(f"{variant}: worst |relative error| {err:.1%} ({verdict} the {TARGET_REL_ERROR:.0%} target)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
