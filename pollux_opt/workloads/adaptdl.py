"""The AdaptDL workload CSVs, and a Philly-style workload generator.

An AdaptDL workload CSV (``shared/traces/adaptdl-osdi21/workloads/*.csv``) has
one row per job: ``name`` (its id), ``time`` (submission second),
``application`` (the profile it runs) and the user's tuned fixed
configuration ``num_replicas`` / ``batch_size`` that non-adaptive baselines run
with.  :func:`read_adaptdl_csv` reads it into :class:`~pollux_opt.workloads.job.WorkloadJob`
(``id``, ``arrival_s``, ``kind``, ``replicas``, ``batch_size``) and
:func:`write_adaptdl_csv` writes one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import pandas as pd

from solvers import InvalidProblem

from pollux_opt.model.domains import Real, check
from pollux_opt.records.files import atomic_write_csv
from pollux_opt.records.tables import read_table
from pollux_opt.workloads.job import WorkloadJob

if TYPE_CHECKING:  # the profiles live in the simulator, which imports this module
    from pollux_opt.backends.sim.traces import Profile

__all__ = [
    "ADAPTDL_COLUMNS", "philly_workload", "pinned_config", "read_adaptdl_csv", "tuned_config", "write_adaptdl_csv",
]

#: Columns of an AdaptDL workload CSV -> the :class:`WorkloadJob` field each holds.
ADAPTDL_COLUMNS = {
    "name": "id", "time": "arrival_s", "application": "kind", "num_replicas": "replicas", "batch_size": "batch_size",
}

#: Length of the submission window of the AdaptDL workloads (README: 8 hours).
DEFAULT_WINDOW_S = 8 * 3600
#: Jobs per AdaptDL workload at load 1 (README: 160 jobs).
DEFAULT_NUM_JOBS = 160
#: Replica counts tried when tuning a fixed configuration (artifact's list for 16 x 4 GPUs).
TUNING_REPLICAS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
#: Scaling-efficiency window a "tuned" configuration must fall in (artifact: 0.5 to 0.8).
TUNED_EFFICIENCY = (0.5, 0.8)
#: Longest JCT, seconds, for a tuned configuration (artifact: 12 hours).
TUNED_MAX_JCT_S = 12 * 3600
#: Replicas per node assumed when tuning (the 16 x 4 cluster of the paper).
TUNING_REPLICAS_PER_NODE = 4
#: Replicas of a job that is not elastic: Pollux's simulator runs NCF on one
#: GPU under Pollux and Optimus (artifact ``simulator.py``, ``max_replicas = 1``).
PINNED_REPLICAS = 1


def read_adaptdl_csv(path) -> list[WorkloadJob]:
    """The jobs of an AdaptDL workload CSV (see the module docstring), sorted by arrival then id.

    Raises:
        InvalidProblem: a missing or unreadable file (not UTF-8, not CSV), a
            missing column, a duplicate name, or a bad cell (naming its row
            and column) or row.
    """
    path = Path(path)
    if not path.is_file():
        raise InvalidProblem(f"workload file {str(path)!r} does not exist")
    df = read_table(path, "workload", columns=list(ADAPTDL_COLUMNS), numeric=("time",),
                    integer=("num_replicas", "batch_size"), text=("name", "application"))
    if df.name.duplicated().any():
        raise InvalidProblem(f"workload {str(path)!r}: duplicate job name {df.name[df.name.duplicated()].iloc[0]!r}")
    jobs = [
        WorkloadJob(id=str(r.name), kind=str(r.application), arrival_s=float(r.time),
                    replicas=r.num_replicas, batch_size=r.batch_size)
        for r in df.itertuples(index=False)
    ]
    return sorted(jobs, key=lambda j: (j.arrival_s, j.id))


def write_adaptdl_csv(jobs: Sequence[WorkloadJob], path) -> None:
    """Write ``jobs`` as an AdaptDL workload CSV (atomically)."""
    rows = [{col: getattr(j, attr) for col, attr in ADAPTDL_COLUMNS.items()} for j in jobs]
    atomic_write_csv(path, pd.DataFrame(rows, columns=list(ADAPTDL_COLUMNS)))


def _spread(k: int, per_node: int) -> tuple[int, ...]:
    full, rest = divmod(k, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


def tuned_config(profile: Profile, num_replicas: int) -> tuple[int, float]:
    """Best validated batch size at ``num_replicas`` packed on 4-replica nodes, and its JCT (s).

    The "tuned" fixed configuration of a non-adaptive job: the validated batch
    size that minimises the true time to completion (artifact's
    ``get_configurations``).  Returns (0, inf) when no batch size fits.
    """
    placement = _spread(num_replicas, TUNING_REPLICAS_PER_NODE)
    best = (0, math.inf)
    for b in _validated(profile):
        local = math.ceil(b / num_replicas)
        if local < profile.min_local_bsz:
            continue
        accum = math.ceil(local / profile.max_local_bsz) - 1
        atomic = math.ceil(local / (accum + 1))
        step, sync = profile.step_sync(placement, atomic)
        jct = profile.iterations(b, profile.max_epochs) * (step + accum * (step - sync))
        if jct < best[1]:
            best = (b, jct)
    return best


def pinned_config(profile: Profile) -> tuple[int, int]:
    """(replicas, total batch size) a job that is not elastic runs with, whatever its workload row says.

    :data:`PINNED_REPLICAS` replicas at the :func:`tuned_config` batch size
    there.  For NCF this is Pollux's simulator's configuration, one GPU at
    batch 32768 (artifact ``simulator.py``: ``job.target_batch_size = 32768``).

    Raises:
        InvalidProblem: no validated batch size fits one replica of ``profile``.
    """
    batch, _ = tuned_config(profile, PINNED_REPLICAS)
    if batch <= 0:
        raise InvalidProblem(f"profile {profile.name!r}: no batch size fits {PINNED_REPLICAS} replica(s)")
    return PINNED_REPLICAS, int(batch)


def _validated(profile: Profile) -> list[int]:
    vals = getattr(profile, "validation", None)
    if vals:
        return sorted(vals)
    out, b = [], profile.init_batch_size
    while b <= profile.max_batch_size:
        out.append(b)
        b *= 2
    return out


def _configurations(profile: Profile) -> list[tuple[int, int, float]]:
    """(replicas, batch, jct) of tuned configurations with scaling efficiency in the window."""
    base = tuned_config(profile, 1)
    ret = []
    for k in TUNING_REPLICAS[1:]:
        if k * profile.min_local_bsz > profile.max_batch_size:
            break
        b, jct = tuned_config(profile, k)
        if b and jct < TUNED_MAX_JCT_S and TUNED_EFFICIENCY[0] < base[1] / jct / k < TUNED_EFFICIENCY[1]:
            ret.append((k, b, jct))
    return ret or [(1, base[0], base[1])]


#: The job-load multiplier of a sampled workload (1: the trace's rate).
_LOAD = Real(gt=0)


def philly_workload(
    philly_csv,
    profiles: Mapping[str, Profile],
    *,
    load: float = 1.0,
    num_jobs: int = DEFAULT_NUM_JOBS,
    window_s: float = DEFAULT_WINDOW_S,
    seed: int = 0,
) -> list[WorkloadJob]:
    """Sample a workload from a Philly-style trace (``timestamp,duration,num_gpus,...``).

    Arrivals: ``round(num_jobs * load)`` jobs submitted uniformly over the
    ``window_s`` seconds, at the arrival pattern of the trace's busiest
    ``window_s`` stretch (resampled offsets of its jobs).  Each sampled Philly job
    is matched to the application (and tuned configuration) whose tuned
    replica count and time are closest in log-GPU-time to its own, so the mix
    of job sizes follows the trace (Pollux, section 5.3).

    Args:
        philly_csv: path of the trace.
        profiles: application name -> profile.
        load: job-load multiplier (> 0).
        num_jobs: jobs at load 1.
        window_s: submission window, seconds.
        seed: random seed.

    Raises:
        InvalidProblem: bad arguments or trace.
    """
    check("load", load, _LOAD)
    if not profiles:
        raise InvalidProblem("profiles must not be empty")
    path = Path(philly_csv)
    if not path.is_file():
        raise InvalidProblem(f"philly trace {str(path)!r} does not exist")
    df = pd.read_csv(path)
    for col in ("timestamp", "duration", "num_gpus"):
        if col not in df.columns:
            raise InvalidProblem(f"philly trace {str(path)!r} lacks column {col!r}")
    df = df.dropna(subset=["timestamp", "duration", "num_gpus"])
    df = df[(df.duration > 0) & (df.num_gpus > 0)]
    t = pd.to_datetime(df.timestamp).astype("int64").to_numpy() / 1e9
    rng = np.random.default_rng(seed)
    n = max(1, int(round(num_jobs * load)))
    # Arrival offsets: a random window of the trace, offsets resampled from it.
    order = np.argsort(t)
    t, gpu_time = t[order], (df.duration.to_numpy() * df.num_gpus.to_numpy())[order]
    start = rng.uniform(t[0], max(t[0], t[-1] - window_s))
    inside = (t >= start) & (t < start + window_s)
    pool = np.flatnonzero(inside) if inside.sum() >= 2 else np.arange(t.size)
    pick = rng.choice(pool, size=n, replace=True)
    times = np.sort(rng.uniform(0.0, window_s, size=n))
    # Applications: nearest tuned GPU-time in log scale.
    options = []
    for name, prof in sorted(profiles.items()):
        for k, b, jct in _configurations(prof):
            options.append((name, k, b, math.log(max(jct * k, 1.0))))
    logs = np.array([o[3] for o in options])
    jobs = []
    for i, (when, idx) in enumerate(zip(times, pick)):
        dist = np.abs(logs - math.log(max(gpu_time[idx], 1.0)))
        best = np.flatnonzero(dist <= dist.min() + 1e-9)
        name, k, b, _ = options[int(rng.choice(best))]
        jobs.append(WorkloadJob(id=f"{name}-{i}", kind=name, arrival_s=float(round(when)),
                                replicas=k, batch_size=b))
    return jobs
