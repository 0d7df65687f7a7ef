"""Compare policies on real CPU jobs, for several workload sets.

Runs ``pollux-opt demo`` once per named workload set (each into its own
directory under ``--out``; an existing directory is resumed, so an interrupted
sweep continues where it stopped) and prints one table of the headline numbers
(average JCT, worst rho, average goodput, scheduler overhead).  With ``--csv``
each policy's run becomes one row of that CSV (appended, so that repeated
sweeps are all kept, each under its ``--sweep`` label), with the machine's
mean load average during the run::

    python experiments/real_cluster.py --quick --out results/real-quick
    python experiments/real_cluster.py --quick --sets mixed burst stream \\
        --policies fixed dynamic pollux fair-jct --sweep 1 --csv experiments/results/real_cluster.csv

Numbers are wall-clock measurements on a shared machine: compare policies
within one sweep.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from pathlib import Path

from pollux_opt.backends.local import run_demo
from pollux_opt.backends.local.run import DEMO_POLICIES
from pollux_opt.records.files import atomic_write_csv
from pollux_opt.workloads.sets import WORKLOAD_SETS
from solver_speed import machine_name

HEADLINE = ("avg_jct_s", "worst_rho", "avg_goodput", "overhead_pct_of_interval", "makespan_s", "num_completed")
#: Seconds between samples of the load average during a run.
LOAD_SAMPLE_S = 5.0


class LoadSampler:
    """The mean 1-minute load average while it runs (sampled every :data:`LOAD_SAMPLE_S`)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(LOAD_SAMPLE_S):
                return

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else float("nan")


def run_set(out: Path, name: str, policies: tuple[str, ...], *, quick: bool, interval: float | None) -> list[dict]:
    """Each policy on set ``name`` in turn (resumed where its run exists), then the set's comparison;
    one row per policy with its wall time and mean load."""
    rows = []
    for policy in policies:
        start = time.monotonic()
        with LoadSampler() as load:
            summary = run_demo(out, name, quick=quick, interval=interval, policies=(policy,), progress=False)[policy]
        rows.append({"workload": name, "policy": policy, **{k: summary.get(k) for k in HEADLINE},
                     "load1": load.mean, "wall_s": time.monotonic() - start,
                     "machine": machine_name()})
    run_demo(out, name, quick=quick, interval=interval, policies=policies, progress=False)  # all done: plots
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=sorted(WORKLOAD_SETS), choices=sorted(WORKLOAD_SETS))
    parser.add_argument("--policies", nargs="+", default=list(DEMO_POLICIES), metavar="POLICY",
                        help=f"policies, run in this order (default: {' '.join(DEMO_POLICIES)})")
    parser.add_argument("--quick", action="store_true", help="quick variants, 10 s rounds")
    parser.add_argument("--out", default="results/real", help="output directory")
    parser.add_argument("--interval", type=float, help="round interval in seconds (default 30; 10 with --quick)")
    parser.add_argument("--csv", type=Path, help="append one row per run to this CSV")
    parser.add_argument("--sweep", default="1", help="label of this sweep in the CSV (default 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import pandas as pd

    rows = []
    for name in args.sets:
        rows += run_set(Path(args.out) / name, name, tuple(args.policies), quick=args.quick, interval=args.interval)
    table = pd.DataFrame(rows).set_index(["workload", "policy"])
    print(table.to_string(float_format=lambda x: f"{x:.3g}"))
    (Path(args.out) / "headline.json").write_text(json.dumps(rows, indent=2))
    if args.csv is not None:
        frame = pd.DataFrame(rows).assign(sweep=args.sweep, quick=args.quick)
        if args.csv.exists():  # earlier sweeps kept, by column name (a column they lack stays empty there)
            frame = pd.concat([pd.read_csv(args.csv), frame], ignore_index=True)
        atomic_write_csv(args.csv, frame)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
