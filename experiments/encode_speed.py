"""Time the encoding of each round's allocation problem (``to_problem``) in one
workload-6 simulation (Pollux unless --policy says otherwise), for the working tree and optionally other copies
of the repository.

Each code runs the simulation (16 x 4 CPUs, interval 60 s) in its own
process, with ``PYTHONPATH`` at the copy's root (the working tree: this
repository); codes alternate for ``--repeats`` rounds, so that a loaded
machine affects all alike.  A row: wall and CPU seconds of the simulation,
wall and CPU (thread) seconds of ``to_problem`` and its share of the
simulation's, the wall seconds and calls of its other stages (the throughput
fits, the MILP solves, every HiGHS run and HiGHS's branch-and-bound runs among
them, the policy's allocator jobs and fair-jct's work rates; empty where the
code has no such function), the hits and misses of the
policy's batch-search cache (empty where the code has none), the mean JCT,
whether jobs.csv is identical to the working tree's first run, and the
1-minute load average before and after::

    mkdir /tmp/head && git archive HEAD | tar -x -C /tmp/head
    python experiments/encode_speed.py --code reference=/tmp/head --out experiments/results/encode_speed.csv
    python experiments/encode_speed.py --policy pollux --policy fair-jct --repeats 2 \\
        --out experiments/results/fair_jct_speed.csv

``--policy`` (repeatable) simulates each policy in turn (default: pollux);
"identical" compares a run with the working tree's first run of its policy.

On a shared machine the CPU figures are the steadier ones.
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fit_speed import emit_rows
from solver_speed import WORKLOAD

log = logging.getLogger("encode_speed")

ROOT = Path(__file__).resolve().parents[1]
#: The working tree's code, in the CSV.
TREE = "working tree"


#: Stages timed (CSV column -> the (module, attribute path) of each function it
#: covers): each is looked up by its callers at call time, so wrapping the
#: attribute times every call.  The HiGHS runs are the LP relaxations and every
#: MIP; ``_solve_mip`` the MIPs among them.  The policy's allocator jobs are
#: Pollux's, and fair-jct's on top of them (weights, restart factors); its work
#: rates are the batch searches behind its weights.
STAGES = {
    "encode_s": (("pollux_opt.model.allocate", "to_problem"),),
    "fit_s": (("pollux_opt.model", "fit_throughput"),),
    "solve_s": (("solvers.milp.solve", "MilpSolver.__call__"),),
    "highs_mip_s": (("solvers.milp.highs", "_solve_mip"),),
    "highs_s": (("solvers.milp.highs_model", "HighsModel.run"),),
    "policy_jobs_s": (("pollux_opt.scheduling.policies.goodput", "AllocatorPolicy.allocator_jobs"),
                      ("pollux_opt.scheduling.policies.fair_jct", "FairJctPolicy.allocator_jobs")),
    "work_rates_s": (("pollux_opt.scheduling.policies.fair_jct", "_rates"),),
}


def _calls_column(stage: str) -> str:
    """The CSV column of a stage's call count (``fit_s`` -> ``fit_calls``)."""
    return stage.removesuffix("_s") + "_calls"


def _timer(totals: dict, name: str, fn):
    """``fn`` adding its wall and thread CPU seconds and one call to ``totals[name]``
    ([wall, cpu, calls]); a call inside another call of the same stage (an override
    calling the method it overrides) is counted once, by the outer one.  It keeps ``fn``'s
    signature (``functools.wraps``): the solver registry reads a solver's options from it."""
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        spent = totals.setdefault(name, [0.0, 0.0, 0, False])
        if spent[3]:
            return fn(*args, **kwargs)
        spent[3] = True
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start
            spent[1] += time.thread_time() - cpu
            spent[2] += 1
            spent[3] = False
    return timed


def _time_stages(totals: dict) -> None:
    """Wrap every function of :data:`STAGES` that the code has."""
    for name, places in STAGES.items():
        for module, path in places:
            try:
                owner = importlib.import_module(module)
            except ImportError:
                continue
            *parents, attr = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent, None)
            if owner is not None and hasattr(owner, attr):
                setattr(owner, attr, _timer(totals, name, getattr(owner, attr)))


def _record_caches(allocate, caches: dict) -> None:
    """Make ``allocate.to_problem`` keep each batch-search cache it is given in ``caches`` (by id)."""
    encode = allocate.to_problem

    def recorded(*args, **kwargs):
        if kwargs.get("cache") is not None:
            caches.setdefault(id(kwargs["cache"]), kwargs["cache"])
        return encode(*args, **kwargs)

    allocate.to_problem = recorded


def _worker(out_dir: Path, policy: str) -> dict:
    """One simulation under ``policy`` in this process, its stages timed: its figures (run with the
    code's PYTHONPATH)."""
    allocate = importlib.import_module("pollux_opt.model.allocate")
    from pollux_opt.cli.main import main

    stages: dict = {}
    _time_stages(stages)
    by_id: dict = {}  # the policy's batch-search caches that to_problem was given
    _record_caches(allocate, by_id)
    start, cpu = time.perf_counter(), time.process_time()
    main(["simulate", "--workload", str(WORKLOAD), "--policy", policy, "--nodes", "16",
          "--cpus-per-node", "4", "--interval", "60", "--out", str(out_dir)])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    caches = list(by_id.values())
    encode_s, encode_cpu_s = stages.get("encode_s", [0.0, 0.0])[:2]
    jcts = [float(row["jct"]) for row in csv.DictReader((out_dir / "jobs.csv").open())]
    return {"wall_s": wall, "cpu_s": cpu, "encode_s": encode_s, "encode_cpu_s": encode_cpu_s,
            "encode_share": encode_s / wall, "encode_cpu_share": encode_cpu_s / cpu,
            **{name: stages[name][0] if name in stages else "" for name in STAGES if name != "encode_s"},
            **{_calls_column(name): stages[name][2] if name in stages else "" for name in STAGES},
            "cache_hits": sum(c.hits for c in caches) if caches else "",
            "cache_misses": sum(c.misses for c in caches) if caches else "",
            "avg_jct_s": sum(jcts) / len(jcts), "module": allocate.__file__}


def _run(root: Path, out_dir: Path, policy: str) -> dict:
    """:func:`_worker` in a child process with ``root`` first on PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, __file__, "--worker", str(out_dir), "--policy", policy], env=env,
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", action="append", default=[], metavar="LABEL=DIR",
                        help="another copy of the repository to time (repeatable)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the codes (default 1)")
    parser.add_argument("--out", type=Path, help="CSV to write (default: print)")
    parser.add_argument("--policy", action="append", default=None, metavar="POLICY",
                        help="policy to simulate (repeatable; default pollux)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    policies = args.policy or ["pollux"]
    if args.worker is not None:
        print(json.dumps(_worker(args.worker, policies[0])))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    codes = {TREE: ROOT}
    for spec in args.code:
        label, sep, path = spec.partition("=")
        if not sep or not label or not (Path(path) / "pollux_opt").is_dir():
            raise SystemExit(f"--code must be LABEL=DIR with a copy of the repository, got {spec!r}")
        codes[label] = Path(path).resolve()
    rows, reference = [], {}  # policy -> the working tree's first jobs.csv
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for policy in policies:
                for label, root in codes.items():
                    out_dir = Path(tmp) / f"{r}-{len(rows)}"
                    load_before = os.getloadavg()[0]
                    figures = _run(root, out_dir, policy)
                    jobs = (out_dir / "jobs.csv").read_text()
                    reference.setdefault(policy, jobs)
                    rows.append({"code": label, "policy": policy, "round": r, **figures,
                                 "identical_jobs_csv": jobs == reference[policy], "load_average_1min_before":
                                 load_before, "load_average_1min_after": os.getloadavg()[0]})
                    log.info("%s", rows[-1])
    emit_rows(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
