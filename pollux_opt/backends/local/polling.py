"""What the jobs report, read for the scheduler: a job's ``JobReport`` and its
checkpoint files become unified events (:mod:`pollux_opt.records.events`; the
backend writes them, in time order) and the :class:`~pollux_opt.scheduling.loop.JobView`
a policy sees.  These functions keep the job's
:class:`~pollux_opt.backends.local.handle.JobBookkeeping` up to date.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.backends.local.handle import JobBookkeeping
from pollux_opt.lifecycle import JobState
from pollux_opt.records.events import goodput_model_to_json
from pollux_opt.scheduling.loop import JobView

__all__ = [
    "checkpoint_events", "complete_fields", "job_view", "max_replicas", "model_of",
    "models_of", "report_fields", "submit_fields", "translate_runtime_events", "verifying",
]

def verifying(job: JobBookkeeping) -> bool:
    """The job reached its target and its final checkpoint is being re-checked
    in a fresh process (``report.verifying``).  It is not offered to policies,
    nor moved, until the check ends."""
    return job.report is not None and job.report.verifying


def max_replicas(job: JobBookkeeping, total_cpus: int) -> int:
    """Most replicas ``job`` may get on ``total_cpus`` CPUs: at most its workload's
    cap, with a feasible batch configuration (K * min_local_bsz <= B, ``B`` its
    fixed batch or, if None, the spec's largest)."""
    b = job.spec.max_batch_size if job.fixed_batch_size is None else job.fixed_batch_size
    return max(1, min(job.wl.max_replicas or total_cpus, total_cpus, b // job.spec.min_local_bsz))


def submit_fields(job: JobBookkeeping, total_cpus: int) -> dict:
    """Fields of the job's ``submit`` event (a job whose spec does not resolve has no limits nor target)."""
    spec = job.spec
    return {
        "kind": job.wl.kind, "arrival_s": job.wl.arrival_s, "submitted_replicas": job.wl.replicas,
        "submitted_batch_size": job.wl.batch_size, "min_replicas": job.wl.min_replicas, "weight": job.weight,
        "max_replicas": None if spec is None else max_replicas(job, total_cpus),
        "fixed_batch_size": job.fixed_batch_size, "target": None if spec is None else spec.target,
        "metric": None if spec is None else spec.metric,
    }


def model_of(report):
    """The job's fitted goodput model, or None while it cannot be fitted."""
    try:
        return report.goodput_model()
    except (InvalidProblem, ValueError):
        return None


def _fitted_model(report, params, measurements):
    """A goodput model of throughput ``params``, else of a fit here to
    ``measurements`` (a short job may finish before the runtime's first periodic
    fit), with neutral gradient statistics if none were measured; None where
    neither gives parameters."""
    from pollux_opt.agent.agent import neutral_stats
    from pollux_opt.model import GoodputModel

    if params is None and len(measurements):
        try:
            params = measurements.fit()
        except (InvalidProblem, ValueError, FloatingPointError):
            return None
    return None if params is None else GoodputModel(params, report.grad_stats or neutral_stats(report.limits),
                                                    report.limits)


# ------------------------------------------------------------------ reports in
def translate_runtime_events(job: JobBookkeeping, report, started_unix: float) -> list[tuple[float, str, dict]]:
    """The runtime events of ``report`` newer than the last translated one, as
    unified events ``(t, type, fields)``, ``t`` in run seconds.

    ``started``/``rescaled`` end a move (``rescale_end``; a first start needs
    none) and add their duration to ``job.durations``; a requested stop ends a
    move to ``{}``; a lost worker or a failed final check re-forms the job
    (``restart_after_fault``); reaching the target releases its CPUs
    (``validation`` with ``target_reached``).  Each change of the runtime's
    state is a ``state`` event.
    """
    out = []
    for move in report.transitions:
        if move.time <= job.state_time:
            continue
        job.state_time = move.time
        out.append((move.time - started_unix, "state", {
            "state": move.new.value, "old": move.old.value, "reason": move.reason, "verifying": move.verifying,
            "at": move.time}))
    for ev in report.events:
        if ev.time <= job.src_time:
            continue
        job.src_time = ev.time
        t, d = ev.time - started_unix, dict(ev.details)
        if ev.kind in ("started", "rescaled"):
            seconds = d.get("seconds")
            if seconds is not None:
                job.durations.append(float(seconds))
            if ev.kind == "started" and job.startup_s is None and seconds is not None:
                job.startup_s = float(seconds)
            if ev.kind == "rescaled" or job.restarts:  # a start after a stop ends that rescale
                out.append((t, "rescale_end", {"placement": job.placement, "duration_s": seconds,
                                               "resumed_step": d.get("step"),
                                               "from_checkpoint": d.get("from_checkpoint"), "src_time": ev.time}))
        elif ev.kind == "stopped" and d.get("reason") == "request":
            dur = t - job.change_t if math.isfinite(job.change_t) else None
            out.append((t, "rescale_end", {"placement": {}, "duration_s": dur, "src_time": ev.time}))
        elif ev.kind in ("worker_lost", "verification_failed"):
            job.hold(t, job.placement if ev.kind == "worker_lost" else report.placement)
            job.restarts += 1 if job.placement else 0
            out.append((t, "restart_after_fault", {
                "placement": job.placement, "reason": ev.kind,
                "details": {k: d[k] for k in ("rank", "exitcode", "reason") if k in d}, "src_time": ev.time,
            }))
        elif ev.kind == "target_reached":
            job.hold(t, {})
            job.target_t, job.last_metric = t, d.get("metric")
            out.append((t, "validation", {
                "value": d.get("metric"), "metric": job.spec.metric, "step": d.get("step"),
                "progress": report.progress, "target_reached": True, "src_time": ev.time,
            }))
    return out


def checkpoint_events(job: JobBookkeeping, directory: str | os.PathLike) -> list[dict]:
    """Fields of one ``checkpoint`` event per checkpoint in ``directory`` newer
    than the last one logged (oldest first).

    Only a checkpoint the job could resume from is logged: its metadata parses
    and its payload hashes to the recorded SHA-256
    (:func:`pollux_opt.runtime.checkpoint.verify`).  One that does not verify
    (a forged or damaged file) is remembered and skipped, so that it neither
    appears in the log nor moves ``last_ckpt_step``.
    """
    from pollux_opt.runtime.checkpoint import list_checkpoints, verify

    try:
        names = frozenset(os.listdir(directory))
    except OSError:
        return []
    if names == job.ckpt_names:
        return []
    job.ckpt_names = names
    out = []
    for info in reversed(list_checkpoints(Path(directory))):  # oldest first
        if info.step <= job.last_ckpt_step or info.meta_path.name in job.ckpt_rejected:
            continue
        if not verify(info):
            job.ckpt_rejected.add(info.meta_path.name)
            continue
        job.last_ckpt_step = info.step
        out.append({"step": info.step, "progress": info.meta.get("progress"), "final": bool(info.meta.get("final", False))})
    return out


def report_fields(job: JobBookkeeping, report, now: float, every: float) -> dict | None:
    """Fields of the periodic ``report`` event of a running job, due ``every``
    seconds: goodput and throughput measured since the previous one.  None when
    none is due, and for the first of a running spell (it only sets the reference)."""
    dt = now - job.report_t
    if report.state is not JobState.RUNNING or not report.placement or dt < every:
        return None
    progress, samples = job.report_progress, job.report_samples
    job.report_t, job.report_progress, job.report_samples = now, report.progress, report.samples
    if not dt > 0:  # nan: no reference yet
        return None
    m0 = job.spec.init_batch_size
    model = model_of(report)
    base = predicted = math.nan
    if model is not None:
        choice = model.optimize(1, 1, fixed_batch_size=m0)
        base = float(choice.goodput) if bool(choice.feasible) else math.nan
        if report.num_replicas and report.local_bsz:  # what the model says of the configuration that ran
            predicted = float(model.throughput(max(len(report.placement), 1), report.num_replicas,
                                               report.local_bsz, report.accum_steps or 0))
    return {
        "throughput": (report.samples - samples) / dt, "goodput": (report.progress - progress) * m0 / dt,
        "goodput_base": base, "predicted_throughput": predicted, "batch_size": report.batch_size,
        "local_bsz": report.local_bsz, "accum_steps": report.accum_steps,
        "noise_scale": report.grad_stats.noise_scale if report.grad_stats is not None else None,
        "init_batch_size": m0, "max_batch_size": job.spec.max_batch_size,
        "progress": report.progress, "step": report.step, "replicas": report.num_replicas, "metric": report.metric,
    }


def complete_fields(job: JobBookkeeping, report, now: float) -> dict:
    """Fields of the job's ``complete`` event (its CPU-seconds brought up to ``now``
    first).  ``model``: the runtime's goodput model, else one fitted here; on a
    cluster of several node types ``type_models``, ``{node type: model}`` of the
    types it measured (its own fit there, no projections)."""
    job.account(now)
    model = model_of(report)
    if model is None:
        model = _fitted_model(report, None, report.measurements)
    typed = {}
    if report.type_measurements:
        fits = {t: _fitted_model(report, report.type_params.get(t), m) for t, m in report.type_measurements.items()}
        typed["type_models"] = {t: goodput_model_to_json(m) for t, m in fits.items() if m is not None}
    return {**typed,
        "verified": True, "value": report.final_metric, "metric": report.metric_name, "target": report.target,
        "progress": report.progress, "step": report.step, "model": goodput_model_to_json(model),
        "startup_s": job.startup_s, "verify_s": now - job.target_t if math.isfinite(job.target_t) else None,
        "cpu_seconds": job.cpu_seconds,
    }


def models_of(report, types: Sequence[str]):
    """The job's per-type goodput models on ``types``, or None while it has none."""
    try:
        return report.goodput_models(tuple(types)) or None
    except (InvalidProblem, ValueError):
        return None


def job_view(job: JobBookkeeping, now: float, total_cpus: int, fallback_delay: float,
             types: Sequence[str] | None = None) -> JobView | None:
    """What a policy sees of ``job`` at ``now`` (None: nothing to decide for it).

    Its restart delay is the median of its own measured rescales (else starts),
    else ``fallback_delay``; its CPU-seconds are brought up to ``now``.  On a
    cluster of several node ``types`` the view carries the job's per-type
    goodput models (:func:`models_of`).
    """
    if job.report is None or job.state.terminal or verifying(job) or job.cancelling:
        return None
    # Only a job whose workers exist holds its placement (one asked to stop, or not yet started, holds none).
    held = dict(job.placement) if job.state.holds_workers else {}
    report = job.report
    delays = list(report.rescale_times) or list(report.start_times)
    delay = float(np.median(delays)) if delays else fallback_delay
    job.account(now)
    cap = max_replicas(job, total_cpus)
    profiled = int(report.measurements.num_replicas.max()) if len(report.measurements) else 0
    return JobView(
        job_id=job.id, submit_time=job.submit, state=job.state if held else JobState.QUEUED, placement=held,
        restarts=job.restarts, age=max(now - job.submit, 0.0),
        min_replicas=min(job.wl.min_replicas, cap), max_replicas=cap,
        submitted_replicas=job.wl.replicas, submitted_batch_size=job.wl.batch_size,
        goodput_model=model_of(report), restart_delay=delay, progress=float(report.progress),
        attained_service=job.cpu_seconds, max_profiled_replicas=profiled, weight=job.weight,
        goodput_models=None if types is None else models_of(report, types),
        fixed_batch_size=report.fixed_batch_size, batch_size=int(report.batch_size or 0),
    )
