"""Turn measurements of real executor runs into AdaptDL-format profile folders.

``pollux-opt profile RUN_DIR ... --out PROFILES_DIR`` reads what real runs
recorded (``RUN_DIR/config.json``, ``RUN_DIR/events.jsonl`` and, per job,
``RUN_DIR/jobs/<id>/{job.json,events.jsonl,steps.csv}``) and writes one folder
per application (the job's built-in workload name, e.g. ``digits-cnn``)
holding ``placements.csv``, ``scalability.csv`` and ``validation-B.csv`` files
in the layout of ``shared/traces/adaptdl-osdi21/README.md``, so that
``pollux-opt simulate --profiles PROFILES_DIR`` can replay the workload.  All
runs and jobs of one application are pooled.  It also writes
``workload-<run>.csv`` (the run's jobs in the simulator's workload format) and
``export.json`` (an :class:`ExportedApp` per application) at the top of ``PROFILES_DIR``.

Conversions (runtime convention -> trace convention):

* Step time.  A runtime step of ``s`` accumulation steps runs ``s + 1``
  micro-batches of ``local_bsz`` samples: ``step_time`` is the whole optimizer
  step, ``compute_time`` all forward/backward passes, ``sync_time`` the
  collectives (plus control broadcast).  A trace row is one micro-batch
  without accumulation, and the simulator charges ``T + s (T - T_sync)`` for
  a step with accumulation.  So the per-micro-batch compute is
  ``c = (step_time - sync_time) / (s + 1)`` and the trace row is
  ``step_time = c + sync_time``, ``sync_time = sync_time``: the simulator then
  reproduces the measured step time exactly.
* Nodes.  ``steps.csv`` stores replicas, not nodes; the placement of each
  worker generation is taken from the job's ``started`` / ``rescaled`` /
  ``restarted`` event (``details.placement``, ``{node: replicas}``) whose
  checkpoint step precedes the generation's first step.  On one machine that
  is one node unless the run's ``config.json`` split the cores into nodes.
* Gradient statistics.  ``grad_sqr_est`` / ``grad_var_est`` are the per-step
  unbiased estimates of :func:`~pollux_opt.agent.stats.micro_batch_estimates`
  (not smoothed); ``grad_var_est`` is already the variance of a batch of the
  spec's ``init_batch_size`` M0 samples (``sigma^2 / M0``), which is the trace
  convention because every exported application's smallest validated batch
  size is its spec's M0.  No rescaling is needed; were the smallest batch B0
  different, the variance would scale by ``M0 / B0``.  Per epoch row, the
  estimates of all pooled steps falling in that stretch of progress are
  averaged (then clipped as the runtime's moving average clips them).
* Progress.  The runtime's ``progress`` is already in M0-steps (sum of AdaScale
  gains), the trace's unit.  Real jobs finish at a target metric rather than
  after a number of data epochs, and the data-set size is not recorded, so an
  "epoch" here is one of :data:`EXPORT_EPOCHS` equal slices of the mean
  progress at which the pooled jobs reached their target; the simulator
  completes a job after all of them (``max_epochs`` = number of rows).
* Iterations.  ``validation-B.csv`` is written for B = M0, 2 M0, 4 M0, ... and
  the spec's ``max_batch_size``; ``iteration`` is the steps at a fixed batch B
  to reach each row's progress, ``sum(delta_progress / gain(B))`` with the
  AdaScale gain of that row's statistics (at B = M0, iteration = progress).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from solvers import InvalidProblem

from pollux_opt.backends.sim.run_records import JobData, find_run_dirs, read_job, read_jsonl, workload_of_run
from pollux_opt.backends.sim.profile_files import PLACEMENT_COLUMNS, SCALABILITY_COLUMNS
from pollux_opt.records.files import atomic_write_csv, atomic_write_json, safe_name
from pollux_opt.agent.stats import MIN_GRAD_SQR_FRACTION
from pollux_opt.workloads.adaptdl import write_adaptdl_csv

__all__ = ["EXPORT_EPOCHS", "ExportedApp", "export_profiles"]

logger = logging.getLogger(__name__)

#: Rows ("epochs") of each exported validation file: equal slices of the
#: progress to completion (project choice: enough to follow the noise scale's
#: growth over training, few enough that each slice pools tens of steps of a
#: CPU job of a few hundred steps).
EXPORT_EPOCHS = 20


@dataclass(frozen=True)
class ExportedApp:
    """What was written for one application (also stored in ``export.json``).

    Attributes:
        name: application (folder) name, the jobs' spec name.
        init_batch_size: M0 (samples), the smallest validated batch.
        max_batch_size: largest validated batch (samples).
        target_progress: progress to completion (M0-steps), the last row's.
        jobs: ``run/job`` identifiers pooled.
        steps: steps.csv rows pooled.
        restart_seconds: median measured rescale / restart time (s), None if none.
        start_seconds: median measured first-start time (s), None if none.
        verify_seconds: median time from reaching the target to the verified
            completion (s), None if no job completed; the simulator's
            ``SimConfig.completion_delay`` for this application.
        folder: the written folder.
    """

    name: str
    init_batch_size: int
    max_batch_size: int
    target_progress: float
    jobs: tuple[str, ...]
    steps: int
    restart_seconds: float | None
    start_seconds: float | None
    verify_seconds: float | None
    folder: str


def _mean_rows(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Mean step and sync time per configuration.

    The mean, not the runtime's lower quartile
    (``pollux_opt.agent.measurements.STEP_TIME_QUANTILE``, a model of a
    configuration's own cost) nor the median: a job's training
    time is the sum of its steps, slow ones included, and the simulator should
    reproduce the time jobs took on a shared machine.  Replaying four
    ``demo --quick`` runs, the worst matched error per run was 4-17.5 % with
    the mean and 12.6-29.5 % with the median.
    """
    return (df.groupby(keys, as_index=False)[["trace_step", "trace_sync"]].mean()
            .rename(columns={"trace_step": "step_time", "trace_sync": "sync_time"}))


def _median(per_job) -> float | None:
    """Median of the seconds measured by all jobs (None: none measured)."""
    values = [s for seconds in per_job for s in seconds]
    return float(np.median(values)) if values else None


def _batch_grid(m0: int, max_bsz: int) -> list[int]:
    out, b = [], m0
    while b < max_bsz:
        out.append(b)
        b *= 2
    return out + [max_bsz]


def _validation(jobs: list[JobData], m0: int, max_bsz: int) -> tuple[dict[int, pd.DataFrame], float]:
    done = [j for j in jobs if j.completed]
    if not done:
        logger.warning("application %r: no job reached its target; using the furthest progress", jobs[0].app)
    target = float(np.mean([j.final_progress for j in (done or jobs)]))
    # Each step's slice, by the fraction of its own job's progress to completion
    # (so that runs are aligned by phase of training), pooled over jobs.
    parts = []
    for j in jobs:
        denom = j.final_progress if j.completed else target
        s = j.steps
        before = s.progress.shift(fill_value=0.0)  # progress at the start of the step
        frac = (before / max(denom, 1e-12)).clip(0.0, 1.0 - 1e-12)
        parts.append(pd.DataFrame({
            "slice": (frac * EXPORT_EPOCHS).astype(int), "sqr": s.grad_sqr_est, "var": s.grad_var_est,
            "metric_frac": frac,
        }))
    pooled = pd.concat(parts, ignore_index=True).replace([np.inf, -np.inf], np.nan).dropna(subset=["sqr", "var"])
    if pooled.empty:
        raise InvalidProblem(
            f"application {jobs[0].app!r}: no finite grad_sqr_est/grad_var_est in steps.csv of {[j.key for j in jobs]}"
        )
    means = pooled.groupby("slice")[["sqr", "var"]].mean().reindex(range(EXPORT_EPOCHS)).ffill().bfill()
    var = means["var"].clip(lower=0.0).to_numpy(float)
    sqr = np.maximum(means["sqr"].to_numpy(float), MIN_GRAD_SQR_FRACTION * var)
    sqr = np.where(sqr > 0, sqr, 1.0)  # no gradient and no noise: any value gives gain 1 at every batch
    progress = target * np.arange(1, EXPORT_EPOCHS + 1) / EXPORT_EPOCHS
    metric = np.full(EXPORT_EPOCHS, np.nan)
    vals = [(j.validation.progress.to_numpy(float) / (j.final_progress if j.completed else target), j.validation.value)
            for j in jobs if len(j.validation)]
    if vals:
        xs = np.concatenate([v[0] for v in vals])
        ys = np.concatenate([np.asarray(v[1], float) for v in vals])
        order = np.argsort(xs)
        metric = np.interp(progress / target, xs[order], ys[order])
    delta = np.diff(np.concatenate([[0.0], progress]))
    out = {}
    for b in _batch_grid(m0, max_bsz):
        scale = b / m0
        gain = (var + sqr) / (var / scale + sqr)
        out[b] = pd.DataFrame({
            "progress": progress, "iteration": np.cumsum(delta / gain), "metric": metric,
            "grad_sqr": sqr, "grad_var": var,
        })
    return out, target


def export_profiles(run_dirs: Sequence, out_dir, *, apps: Sequence[str] | None = None) -> dict[str, ExportedApp]:
    """Write AdaptDL-format profile folders from real runs (see the module docstring).

    Args:
        run_dirs: run directories (or folders of them, e.g. a demo output).
        out_dir: folder to write ``APP/`` folders, ``workload-<run>.csv`` and ``export.json`` into.
        apps: only these applications (default: every one found).

    Returns:
        ``{application: ExportedApp}``.

    Raises:
        InvalidProblem: a missing run dir, or no job with recorded steps.
    """
    if not run_dirs:
        raise InvalidProblem("run_dirs must name at least one run directory, got none")
    for app in apps or ():
        safe_name("apps entry", app)
    runs = find_run_dirs(run_dirs)
    jobs: list[JobData] = []
    for run in runs:
        run_events = read_jsonl(run / "events.jsonl")
        for job_dir in sorted(d for d in (run / "jobs").iterdir() if d.is_dir()):
            data = read_job(run, job_dir, run_events)
            if data is not None and (apps is None or data.app in apps):
                jobs.append(data)
    if not jobs:
        raise InvalidProblem(
            f"no job with recorded steps (jobs/<id>/steps.csv and job.json) under {[str(r) for r in runs]}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    for app in sorted({j.app for j in jobs}):
        group = [j for j in jobs if j.app == app]
        m0s = {j.init_batch_size for j in group}
        if len(m0s) > 1:
            raise InvalidProblem(f"application {app!r}: jobs disagree on init_batch_size {sorted(m0s)}")
        m0, max_bsz = m0s.pop(), max(j.max_batch_size for j in group)
        steps = pd.concat([j.steps for j in group], ignore_index=True)
        warm = steps[steps.warm]
        if warm.empty:
            warm = steps
        folder = out / safe_name("application", app)
        folder.mkdir(exist_ok=True)
        placements = _mean_rows(warm[warm.placement != ""], ["placement", "local_bsz"])
        atomic_write_csv(folder / "placements.csv", placements[list(PLACEMENT_COLUMNS)])
        scal = _mean_rows(warm, ["num_nodes", "num_replicas", "local_bsz"])
        atomic_write_csv(folder / "scalability.csv", scal[list(SCALABILITY_COLUMNS)])
        validation, target = _validation(group, m0, max_bsz)
        for old in folder.glob("validation-*.csv"):
            old.unlink()
        for b, df in validation.items():
            atomic_write_csv(folder / f"validation-{b}.csv", df)
        result[app] = ExportedApp(
            name=app, init_batch_size=m0, max_batch_size=max(validation), target_progress=target,
            jobs=tuple(j.key for j in group), steps=len(steps),
            restart_seconds=_median(j.launch_seconds for j in group),
            start_seconds=_median(j.start_seconds for j in group),
            verify_seconds=_median(j.verify_seconds for j in group), folder=str(folder),
        )
    for run in runs:
        if (run / "config.json").is_file():
            wl = [j for j in workload_of_run(run) if j.kind in result]
            if wl:
                write_adaptdl_csv(wl, out / f"workload-{run.name}.csv")
    summary = {name: {**vars(a), "jobs": list(a.jobs)} for name, a in result.items()}
    atomic_write_json(out / "export.json", summary, allow_nan=True)
    return result
