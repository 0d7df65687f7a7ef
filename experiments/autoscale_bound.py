"""A lower bound on the node-hours that any scheduler needs for the AdaptDL workloads at
a given average JCT: the yardstick for the shared-cluster autoscaling points.

The relaxation drops everything that couples jobs or costs extra.  Every job
runs alone from its arrival, on any number ``k`` of slots (at most the
largest cluster's), in any layout over at most its nodes, at any local batch
within the profile's limits and any accumulation (up to
:data:`MAX_ACCUM_STEPS` steps) within its largest batch, and it
pays no restart but its first start's delay (the simulator's).  A slot is
billed only while it trains, and a node holds ``slots_per_node`` slots, so
node-seconds >= slot-seconds / slots_per_node for any real schedule.  A
job's statistical efficiency changes with its epoch only, so its cheapest
way to finish is epoch by epoch: with a second of a job worth ``lambda``
slot-seconds (the cost rule's ``time_value``), each epoch runs at the ``k``
that minimises ``(k + lambda) / goodput_e(k)`` per unit of progress, its best
goodput on ``k`` slots being known exactly.

Each ``lambda`` gives the relaxation's node-hours ``N(lambda)`` and average
JCT ``T(lambda)``.  By weak duality, a schedule of ``jobs`` jobs whose average
JCT is at most ``J`` takes at least
``max_lambda N(lambda) + lambda / slots_per_node * jobs * (T(lambda) - J)``
node-seconds: ``results_autoscale.py`` evaluates it at the fixed cluster's
JCT plus the target's allowance.  Contention (the largest cluster holds 64
slots at once), node start-up, node granularity and restarts all only add to
a real schedule's cost, so the bound is loose by their amount.

    python experiments/autoscale_bound.py --out experiments/results
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pollux_opt.agent.stats import adascale_gain  # noqa: E402
from pollux_opt.backends.sim import SimConfig, default_trace_dir, load_profiles  # noqa: E402
from pollux_opt.records.files import atomic_write_csv  # noqa: E402
from pollux_opt.runtime.allocation import normalize_placement  # noqa: E402
from pollux_opt.workloads.adaptdl import read_adaptdl_csv  # noqa: E402

log = logging.getLogger("autoscale_bound")

#: The largest cluster of the shared-cluster experiment (experiments/autoscale.py): 16 x 4.
NODES, SLOTS_PER_NODE = 16, 4
#: Accumulation steps tried per local batch (a job's batch stays within its profile's largest).
MAX_ACCUM_STEPS = 64
#: Local batch sizes tried besides the profile's measured ones (a geometric grid).
LOCAL_GRID = 256
#: The time values (slot-seconds per job-second) whose relaxations are written.
TIME_VALUES = (0.0, *np.geomspace(1 / 64, 1024, 49))


def layouts(k: int) -> list[tuple[int, ...]]:
    """Every even split of ``k`` replicas over ``ceil(k / SLOTS_PER_NODE)`` to ``min(k, NODES)`` nodes."""
    return [tuple(normalize_placement(k, n).values()) for n in range(-(-k // SLOTS_PER_NODE), min(k, NODES) + 1)]


def best_goodput(profile) -> np.ndarray:
    """``rate[e, k - 1]``: the most progress per second that ``k`` slots give in epoch ``e``
    (AdaScale gain over step time, the simulator's truth), shape ``(max_epochs, NODES * SLOTS_PER_NODE)``."""
    low, high = profile.min_local_bsz, profile.max_local_bsz
    measured = profile.placements.local_bsz.to_numpy()
    grid = np.unique(np.concatenate([np.geomspace(low, high, LOCAL_GRID).round(),
                                     measured[(measured >= low) & (measured <= high)]]).astype(int))
    epochs = profile.max_epochs
    rate = np.zeros((epochs, NODES * SLOTS_PER_NODE))
    for k in range(1, rate.shape[1] + 1):
        times = np.array([[profile.step_sync(layout, int(m)) for m in grid] for layout in layouts(k)])
        step, sync = times[..., 0], times[..., 1]
        for accum in range(MAX_ACCUM_STEPS):
            batch = k * grid * (accum + 1)
            ok = batch <= profile.max_batch_size
            if not ok.any():
                break
            total = (step + (step - sync) * accum).min(axis=0)[ok]  # the best layout per local batch
            b = batch[ok].astype(float)
            for e in range(epochs):
                gain = adascale_gain(profile.grad_stats(b, e), b / profile.init_batch_size)
                rate[e, k - 1] = max(rate[e, k - 1], float((gain / total).max()))
    return rate


def relaxation(profile, rate: np.ndarray, time_value: float, start_s: float) -> tuple[float, float]:
    """(slot-seconds, seconds) of one job alone at ``time_value``: each epoch at its cheapest ``k``."""
    progress = np.diff([profile.progress_at(e) for e in range(profile.max_epochs + 1)])
    k = np.arange(1, rate.shape[1] + 1)
    with np.errstate(divide="ignore"):
        cost = (k + time_value) / rate  # cost per unit of progress, (epochs, k)
    best = cost.argmin(axis=1)
    seconds = progress / rate[np.arange(rate.shape[0]), best]
    return float(start_s + (seconds * (best + 1)).sum()), float(start_s + seconds.sum())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("experiments/results"))
    p.add_argument("--traces", type=Path, default=None, help="the AdaptDL trace folder (default: the shared one)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    traces = args.traces or default_trace_dir()
    if traces is None:
        raise SystemExit("no AdaptDL traces found: give --traces")
    profiles = load_profiles(traces)
    start_s = SimConfig().restart_delay  # the simulator charges a first start as a restart
    workloads = {w.stem: Counter(j.kind for j in read_adaptdl_csv(w))
                 for w in sorted((traces / "workloads").glob("workload-*.csv"))}
    apps = sorted(set().union(*workloads.values()))
    rates = {}
    for app in apps:
        rates[app] = best_goodput(profiles[app])
        log.info("%s: best goodput tabled for %d epochs x %d slots", app, *rates[app].shape)
    rows = []
    for lam in TIME_VALUES:
        alone = {a: relaxation(profiles[a], rates[a], lam, start_s) for a in apps}
        for name, counts in workloads.items():
            jobs = sum(counts.values())
            slot_s = sum(n * alone[a][0] for a, n in counts.items())
            jct = sum(n * alone[a][1] for a, n in counts.items()) / jobs
            rows.append({"set": "adaptdl", "workload": name, "time_value": float(lam), "jobs": jobs,
                         "slots_per_node": SLOTS_PER_NODE, "node_hours": slot_s / SLOTS_PER_NODE / 3600,
                         "avg_jct_s": jct})
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "autoscale_bound.csv"
    atomic_write_csv(path, pd.DataFrame(rows))
    log.info("wrote %s (%d rows)", path, len(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
