"""Compare fixed, dynamic and pollux on real CPU jobs, for several workload sets.

Runs ``pollux-opt demo`` once per named workload set (each into its own
directory under ``--out``; an existing directory is resumed, so an interrupted
sweep continues where it stopped) and prints one table per set plus an
overall table of the headline numbers (average JCT, worst rho, average goodput,
scheduler overhead)::

    python experiments/real_cluster.py --quick --out results/real-quick
    python experiments/real_cluster.py --sets mixed burst stream --out results/real

Numbers are wall-clock measurements on a shared machine: compare policies
within one sweep, as ratios.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from pollux_opt.backends.local import run_demo
from pollux_opt.workloads.sets import WORKLOAD_SETS

HEADLINE = ("avg_jct_s", "worst_rho", "avg_goodput", "overhead_pct_of_interval", "makespan_s", "num_completed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=sorted(WORKLOAD_SETS), choices=sorted(WORKLOAD_SETS))
    parser.add_argument("--quick", action="store_true", help="quick variants, 10 s rounds")
    parser.add_argument("--out", default="results/real", help="output directory")
    parser.add_argument("--interval", type=float, help="round interval in seconds (default 30; 10 with --quick)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import pandas as pd

    rows = []
    for name in args.sets:
        summaries = run_demo(Path(args.out) / name, name, quick=args.quick, interval=args.interval)
        for policy, s in summaries.items():
            rows.append({"workload": name, "policy": policy, **{k: s.get(k) for k in HEADLINE}})
    table = pd.DataFrame(rows).set_index(["workload", "policy"])
    print(table.to_string(float_format=lambda x: f"{x:.3g}"))
    (Path(args.out) / "headline.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
