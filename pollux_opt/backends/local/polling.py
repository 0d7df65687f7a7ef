"""Translation between the jobs' handles and the scheduler: reports in, commands out.

In: what a job's handle reports (its ``JobReport``: state, progress,
measurements, runtime events; its checkpoint files) becomes unified events
(:mod:`pollux_opt.records.events`) and the :class:`~pollux_opt.scheduling.loop.JobView`
a policy sees.  Out: a :class:`~pollux_opt.scheduling.loop.Decision` becomes
one command per job whose placement changes (start, rescale or stop).

These functions update the job's :class:`~pollux_opt.backends.local.bookkeeping.JobBookkeeping`
and return the events to write; the backend writes them, in time order.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Iterable, Mapping, Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.backends.local.bookkeeping import JobBookkeeping
from pollux_opt.backends.local.handle import JobHandle
from pollux_opt.lifecycle import JobState
from pollux_opt.records.events import goodput_model_to_json
from pollux_opt.records.replay import clean_placement
from pollux_opt.scheduling.loop import Decision, JobView

__all__ = [
    "Translation", "checkpoint_events", "command", "complete_fields", "final_model", "job_view",
    "max_feasible_replicas", "model_of", "models_of", "plan_moves", "report_fields", "translate_runtime_events",
    "verifying",
]

_CKPT_META_RE = re.compile(r"^ckpt-(\d+)\.json$")


def verifying(job: JobBookkeeping) -> bool:
    """The job reached its target and its final checkpoint is being re-checked
    in a fresh process (``report.verifying``).  It is not offered to policies,
    nor moved, until the check ends."""
    return job.report is not None and job.report.verifying


def max_feasible_replicas(spec, batch_size: int | None) -> int:
    """Largest replica count with a feasible batch configuration (K * min_local_bsz <= B),
    ``B`` the fixed ``batch_size`` or, if None, the spec's largest batch."""
    b = spec.max_batch_size if batch_size is None else batch_size
    return max(1, b // spec.min_local_bsz)


def model_of(report):
    """The job's fitted goodput model, or None while it cannot be fitted."""
    try:
        return report.goodput_model()
    except (InvalidProblem, ValueError):
        return None


def final_model(report):
    """The job's goodput model for its ``complete`` event: the runtime's, else one
    fitted here to its measurements (a short job may finish before the runtime's
    first periodic fit), with neutral gradient statistics if none were measured."""
    model = model_of(report)
    if model is not None or len(report.measurements) == 0:
        return model
    from pollux_opt.model import GoodputModel, GradientStats

    params = _fit_here(report.measurements)
    if params is None:
        return None
    stats = report.grad_stats or GradientStats(1.0, 0.0, report.limits.init_batch_size)
    return GoodputModel(params, stats, report.limits)


def _fit_here(measurements):
    """Throughput parameters fitted to ``measurements`` (None: no rows, or the fit failed)."""
    try:
        return measurements.fit()
    except (InvalidProblem, ValueError, FloatingPointError):
        return None


def _max_profiled(report) -> int:
    """Most replicas the job's measurements cover (0 before any)."""
    k = report.measurements.num_replicas
    return int(k.max()) if len(k) else 0


# ------------------------------------------------------------------ reports in
@dataclass
class Translation:
    """What :func:`translate_runtime_events` found: ``events`` to write, as
    ``(t, type, fields)`` with ``t`` in run seconds; ``measured`` (re)start and
    rescale durations, seconds; ``target_reached``: the job reached its target
    (its CPUs are free and the scheduler should decide again)."""

    events: list[tuple[float, str, dict]] = field(default_factory=list)
    measured: list[float] = field(default_factory=list)
    target_reached: bool = False


def _rescale_end(t: float, job: JobBookkeeping, d: Mapping, src_time: float, seconds) -> tuple[float, str, dict]:
    return (t, "rescale_end", {"placement": job.placement, "duration_s": seconds, "resumed_step": d.get("step"),
                               "from_checkpoint": d.get("from_checkpoint"), "src_time": src_time})


def translate_runtime_events(job: JobBookkeeping, report, started_unix: float) -> Translation:
    """The runtime events of ``report`` newer than the last translated one, as unified events.

    ``started``/``rescaled`` end a move (``rescale_end``; a first start needs
    none); a requested stop ends a move to ``{}``; a lost worker or a failed
    final check re-forms the job (``restart_after_fault``); reaching the target
    releases its CPUs (``validation`` with ``target_reached``).
    """
    out = Translation()
    for ev in report.events:
        if ev.time <= job.src_time:
            continue
        job.src_time = ev.time
        t, d = ev.time - started_unix, dict(ev.details)
        if ev.kind in ("started", "rescaled"):
            seconds = d.get("seconds")
            if seconds is not None:
                out.measured.append(float(seconds))
            if ev.kind == "started" and job.startup_s is None and seconds is not None:
                job.startup_s = float(seconds)
            if ev.kind == "rescaled" or job.restarts:  # a start after a stop ends that rescale
                out.events.append(_rescale_end(t, job, d, ev.time, seconds))
        elif ev.kind == "stopped" and d.get("reason") == "request":
            dur = t - job.change_t if math.isfinite(job.change_t) else None
            out.events.append((t, "rescale_end", {"placement": {}, "duration_s": dur, "src_time": ev.time}))
        elif ev.kind in ("worker_lost", "verification_failed"):
            job.hold(t, job.placement if ev.kind == "worker_lost" else report.placement)
            job.restarts += 1 if job.placement else 0
            out.events.append((t, "restart_after_fault", {
                "placement": job.placement, "reason": ev.kind,
                "details": {k: d[k] for k in ("rank", "exitcode", "reason") if k in d}, "src_time": ev.time,
            }))
        elif ev.kind == "target_reached":
            job.hold(t, {})
            job.target_t, job.last_metric = t, d.get("metric")
            out.events.append((t, "validation", {
                "value": d.get("metric"), "metric": job.spec.metric, "step": d.get("step"),
                "progress": report.progress, "target_reached": True, "src_time": ev.time,
            }))
            out.target_reached = True
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
    from pollux_opt.runtime.checkpoint import CheckpointInfo, verify

    directory = Path(directory)
    try:
        names = frozenset(os.listdir(directory))
    except OSError:
        return []
    if names == job.ckpt_names:
        return []
    job.ckpt_names = names
    out = []
    for name in sorted(names):
        m = _CKPT_META_RE.match(name)
        if not m or int(m.group(1)) <= job.last_ckpt_step or name in job.ckpt_rejected:
            continue
        step = int(m.group(1))
        try:
            meta = json.loads((directory / name).read_text())
        except (OSError, ValueError):
            meta = None  # the metadata is written whole (atomically): unreadable stays unreadable
        info = CheckpointInfo(step, directory / f"{name[:-len('.json')]}.pt", directory / name, meta)
        if not isinstance(meta, dict) or "sha256" not in meta or not verify(info):
            job.ckpt_rejected.add(name)
            continue
        job.last_ckpt_step = step
        out.append({"step": step, "progress": meta.get("progress"), "final": bool(meta.get("final", False))})
    return out


def report_fields(job: JobBookkeeping, report, now: float) -> dict | None:
    """Fields of a periodic ``report`` event: goodput and throughput measured since
    the previous one; None for the first of a running spell (it only sets the reference)."""
    m0 = job.spec.init_batch_size
    goodput = throughput = math.nan
    if math.isfinite(job.report_t) and now > job.report_t:
        dt = now - job.report_t
        goodput = (report.progress - job.report_progress) * m0 / dt
        throughput = (report.samples - job.report_samples) / dt
    job.report_t, job.report_progress, job.report_samples = now, report.progress, report.samples
    model = model_of(report)
    base = math.nan
    if model is not None:
        choice = model.optimize(1, 1, fixed_batch_size=m0)
        base = float(choice.goodput) if bool(choice.feasible) else math.nan
    noise = report.grad_stats.noise_scale if report.grad_stats is not None else None
    if not math.isfinite(goodput):
        return None
    return {
        "throughput": throughput, "goodput": goodput, "goodput_base": base, "batch_size": report.batch_size,
        "local_bsz": report.local_bsz, "accum_steps": report.accum_steps, "noise_scale": noise,
        "progress": report.progress, "step": report.step, "replicas": report.num_replicas, "metric": report.metric,
    }


def type_models_json(report) -> dict[str, dict]:
    """``{node type: goodput model JSON}`` of the types the job has measured (its own
    fit there, no projections), for the ``complete`` event; a type measured after
    the runtime's last periodic fit (a short job) is fitted here, as in :func:`final_model`."""
    from pollux_opt.model import GoodputModel
    from pollux_opt.agent.agent import neutral_stats

    stats = report.grad_stats or neutral_stats(report.limits)
    params = {t: report.type_params.get(t) or _fit_here(m) for t, m in report.type_measurements.items()}
    return {t: goodput_model_to_json(GoodputModel(p, stats, report.limits)) for t, p in params.items()
            if p is not None}


def complete_fields(job: JobBookkeeping, report, now: float) -> dict:
    """Fields of the job's ``complete`` event (its CPU-seconds brought up to ``now`` first;
    ``type_models`` on a cluster of several node types, :func:`type_models_json`)."""
    job.account(now)
    typed = {"type_models": type_models_json(report)} if getattr(report, "type_measurements", None) else {}
    return {**typed,
        "verified": True, "value": report.final_metric, "metric": report.metric_name, "target": report.target,
        "progress": report.progress, "step": report.step, "model": goodput_model_to_json(final_model(report)),
        "startup_s": job.startup_s, "verify_s": now - job.target_t if math.isfinite(job.target_t) else None,
        "cpu_seconds": job.cpu_seconds,
    }


def models_of(report, types: Sequence[str]):
    """The job's per-type goodput models on ``types``, or None while it has none."""
    models = getattr(report, "goodput_models", None)  # a stand-in handle's report may have none
    try:
        return None if models is None else models(tuple(types)) or None
    except (InvalidProblem, ValueError):
        return None


def job_view(job: JobBookkeeping, now: float, max_replicas: int, fallback_delay: float,
             types: Sequence[str] | None = None) -> JobView | None:
    """What a policy sees of ``job`` at ``now`` (None: nothing to decide for it).

    Its restart delay is the median of its own measured rescales (else starts),
    else ``fallback_delay``; its CPU-seconds are brought up to ``now``.  On a
    cluster of several node ``types`` the view carries the job's per-type
    goodput models (:func:`models_of`).
    """
    if job.report is None or job.state.terminal or verifying(job):
        return None
    # Only a job whose workers exist holds its placement (one asked to stop, or not yet started, holds none).
    held = dict(job.placement) if job.state.holds_workers else {}
    report = job.report
    delays = list(report.rescale_times) or list(report.start_times)
    delay = float(np.median(delays)) if delays else fallback_delay
    job.account(now)
    return JobView(
        job_id=job.id, submit_time=job.submit, state=job.state if held else JobState.QUEUED, placement=held,
        restarts=job.restarts, age=max(now - job.submit, 0.0),
        min_replicas=min(job.wl.min_replicas, max_replicas), max_replicas=max_replicas,
        submitted_replicas=job.wl.replicas, submitted_batch_size=job.wl.batch_size,
        goodput_model=model_of(report), restart_delay=delay, progress=float(report.progress),
        attained_service=job.cpu_seconds, max_profiled_replicas=_max_profiled(report), weight=job.wl.weight,
        goodput_models=None if types is None else models_of(report, types),
        fixed_batch_size=getattr(report, "fixed_batch_size", None), batch_size=int(report.batch_size or 0),
    )


# ---------------------------------------------------------------- commands out
def plan_moves(jobs: Iterable[JobBookkeeping], decision: Decision,
               node_ids: Collection[str]) -> list[tuple[JobBookkeeping, dict[str, int]]]:
    """``(job, new placement)`` for each live job whose placement ``decision`` changes.

    Raises:
        InvalidProblem: the decision places a job on a node not in ``node_ids``.
    """
    moves = []
    for job in jobs:
        if not job.submitted or job.finished or job.handle is None or verifying(job):
            continue
        target = clean_placement(decision.placement.get(job.id))
        if target == job.placement:
            continue
        for nid in target:
            if nid not in node_ids:
                raise InvalidProblem(f"decision places job {job.id!r} on unknown node {nid!r}")
        moves.append((job, target))
    return moves


def command(handle: JobHandle, started: bool, target: Mapping[str, int], cpus: Sequence[int] | None,
            **nodes: Mapping[str, str]) -> None:
    """Move a job to ``target``: stop it (``{}``), start it (first placement) or rescale it
    (the job picks its batch there).

    ``nodes``: ``node_types`` and ``cgroups`` of the target's nodes, on a typed
    or throttled cluster (see :class:`~pollux_opt.runtime.allocation.WorkerAllocation`).
    """
    if not target:
        handle.stop()
    elif not started:
        handle.start(target, cpus=cpus, **nodes)
    else:
        handle.rescale(target, cpus=cpus, **nodes)
