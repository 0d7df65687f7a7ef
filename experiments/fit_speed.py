"""Time the throughput fits of one workload-6 Pollux simulation, for the
working tree's fit and optionally other copies of ``throughput_fit.py``.

For each code (the working tree's :func:`pollux_opt.model.fit_throughput`,
then each ``--code LABEL=FILE``, a copy of ``pollux_opt/model/throughput_fit.py``
loaded by path, e.g. ``git show HEAD:pollux_opt/model/throughput_fit.py``):

* ``simulation`` rows: one simulation (16 x 4 CPUs, interval 60 s) with that
  code fitting every job's throughput model: wall and CPU seconds of the
  simulation, number of fits, their seconds and share of the simulation's
  (wall and CPU), the mean JCT, and whether jobs.csv is identical to the
  working tree's;
* ``replay`` rows: the fits the working tree's simulation made, replayed with
  every code in turn (``--repeats`` rounds, interleaved so that a loaded
  machine affects all alike): wall and CPU milliseconds per fit (best round)
  and how many fits give parameters other than the working tree's, to the bit.

On a shared machine the CPU figures are the steadier ones.

The 1-minute load average is kept next to each row::

    git show HEAD:pollux_opt/model/throughput_fit.py > /tmp/reference_fit.py
    python experiments/fit_speed.py --code reference=/tmp/reference_fit.py --out experiments/results/fit_speed.csv
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from solver_speed import WORKLOAD, write_rows

log = logging.getLogger("fit_speed")

ROOT = Path(__file__).resolve().parents[1]
#: The working tree's code, in the CSV.
TREE = "working tree"


def _load(label: str, path: str):
    """The ``fit_throughput`` of a copy of throughput_fit.py (its imports resolve to the working tree)."""
    name = "_fit_speed_" + "".join(c if c.isalnum() else "_" for c in label)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fit_throughput


def _simulate(fit, out_dir: Path) -> tuple[dict, list]:
    """One simulation with ``fit`` as the throughput fit: its figures and the fits' (args, kwargs, result)."""
    import pollux_opt.model as model
    from pollux_opt.cli.main import main

    calls, seconds = [], [0.0, 0.0]

    def timed(*args, **kwargs):
        start, cpu = time.perf_counter(), time.process_time()
        result = fit(*args, **kwargs)
        seconds[0] += time.perf_counter() - start
        seconds[1] += time.process_time() - cpu
        calls.append((tuple(a.copy() for a in args), {k: v.copy() for k, v in kwargs.items()}, result))
        return result

    saved, model.fit_throughput = model.fit_throughput, timed
    start, cpu = time.perf_counter(), time.process_time()
    try:
        main(["simulate", "--workload", str(WORKLOAD), "--policy", "pollux", "--nodes", "16",
              "--cpus-per-node", "4", "--interval", "60", "--out", str(out_dir)])
    except SystemExit as exc:
        if exc.code:
            raise
    finally:
        model.fit_throughput = saved
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    jobs = (out_dir / "jobs.csv").read_text()
    jcts = [float(row["jct"]) for row in csv.DictReader(jobs.splitlines())]
    figures = {"wall_s": wall, "cpu_s": cpu, "fits": len(calls), "fit_s": seconds[0], "fit_cpu_s": seconds[1],
               "fit_share": seconds[0] / wall, "fit_cpu_share": seconds[1] / cpu,
               "avg_jct_s": sum(jcts) / len(jcts), "jobs_csv": jobs}
    return figures, calls


def _replay(codes: dict, calls: list, repeats: int) -> dict:
    """Per code: (best wall and CPU seconds per fit, fits whose parameters differ from the recorded ones)."""
    best = {label: [float("inf"), float("inf")] for label in codes}
    differing = {}
    for _ in range(repeats):
        for label, fit in codes.items():
            start, cpu = time.perf_counter(), time.process_time()
            results = [fit(*args, **kwargs) for args, kwargs, _ in calls]
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            best[label] = [min(best[label][0], wall / len(calls)), min(best[label][1], cpu / len(calls))]
            differing[label] = sum(got != want for got, (_, _, want) in zip(results, calls))
    return {label: (*best[label], differing[label]) for label in codes}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", action="append", default=[], metavar="LABEL=FILE",
                        help="another copy of throughput_fit.py to time (repeatable)")
    parser.add_argument("--repeats", type=int, default=3, help="replay rounds per code (default 3)")
    parser.add_argument("--no-sim-codes", action="store_true",
                        help="simulate with the working tree only (replay every code)")
    parser.add_argument("--out", type=Path, help="CSV to write (default: print)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    logging.getLogger("pollux_opt").setLevel(logging.WARNING)

    from pollux_opt.model import fit_throughput

    codes = {TREE: fit_throughput}
    for spec in args.code:
        label, sep, path = spec.partition("=")
        if not sep or not label or not Path(path).is_file():
            raise SystemExit(f"--code must be LABEL=FILE with an existing file, got {spec!r}")
        codes[label] = _load(label, path)
    rows, reference_jobs, calls = [], None, None
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, fit) in enumerate(codes.items()):
            if i and args.no_sim_codes:
                break
            figures, recorded = _simulate(fit, Path(tmp) / f"sim{i}")
            jobs = figures.pop("jobs_csv")
            if reference_jobs is None:
                reference_jobs, calls = jobs, recorded
            rows.append({"case": "simulation", "code": label, **figures,
                         "identical_jobs_csv": jobs == reference_jobs, "load_average_1min": os.getloadavg()[0]})
            log.info("%s", rows[-1])
    for label, (per_fit, cpu_per_fit, differing) in _replay(codes, calls, args.repeats).items():
        rows.append({"case": "replay", "code": label, "fits": len(calls), "ms_per_fit": 1e3 * per_fit,
                     "cpu_ms_per_fit": 1e3 * cpu_per_fit, "differing_fits": differing, "load_average_1min": os.getloadavg()[0]})
        log.info("%s", rows[-1])
    emit_rows(rows, args.out)
    return 0


def emit_rows(rows: list[dict], out: Path | None) -> None:
    """The rows as CSV: on stdout, or written atomically at ``out`` (:func:`solver_speed.write_rows`)."""
    if out is not None:
        write_rows(rows, Path(out))
        return
    writer = csv.DictWriter(sys.stdout, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
    writer.writeheader()
    writer.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
