"""What a scheduler reads from a job (:class:`JobReport`) and how it configures one
(:class:`RuntimeOptions`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from pollux_opt.lifecycle import JobState, Transition
from pollux_opt.model import BatchLimits, GoodputModel, GradientStats, ThroughputParams
from pollux_opt.model.domains import Boolean, Integer, Real, check_fields, domain_field
from pollux_opt.agent.agent import goodput_model
from pollux_opt.runtime.divergence import DEFAULT_DIVERGENCE_FACTOR, DEFAULT_DIVERGENCE_REPORTS
from pollux_opt.agent.measurements import Measurements

__all__ = ["Event", "JobReport", "Measurements", "RuntimeOptions"]

#: Step counts and batch sizes the runtime options may set (None: unset).
_OPTIONAL_POSITIVE = Integer(ge=1, none=True)
#: Wall seconds between the runtime's periodic actions, and its gloo timeout.
_PERIOD_S = Real(gt=0)


@dataclass(frozen=True)
class RuntimeOptions:
    """How the runtime drives one job (persisted in the work directory).

    Attributes:
        fixed_batch_size: if set, the job trains with this total batch (samples)
            on any allocation, choosing only the split into local batch and
            accumulation for throughput ("fixed" and throughput-only baselines);
            if None, the batch is chosen for goodput (Pollux co-adaptation).
        checkpoint_interval_s: wall seconds between periodic checkpoints while
            running (bounds the steps a killed rank 0 repeats; a killed peer of
            rank 0 costs none, see :mod:`~pollux_opt.runtime.trainer`).
        checkpoint_every_steps: if set, also checkpoint every this many steps.
        keep_checkpoints: newest checkpoints kept on disk (>= 2 so that a corrupt
            newest one has a predecessor).
        adapt_interval_s: wall seconds between re-fits of the throughput model
            and batch re-optimisation.
        report_interval_s: wall seconds between progress reports of rank 0.
        step_limit: if set, the job checkpoints and stops (state ``queued``) at
            this optimizer step (for experiments and tests).
        max_restarts: fault restarts allowed before the job fails.
        collective_timeout_s: gloo timeout; faults are normally detected much
            sooner by the controller, which watches the worker processes.
        warmup_steps: steps after each (re)start or batch change left out of
            the throughput measurements (first-step allocation and caches).
        divergence_factor, divergence_reports: the divergence rule of
            :mod:`~pollux_opt.runtime.divergence` (a report's mean loss above
            ``divergence_factor`` times the first report's, ``divergence_reports``
            times in a row, fails the job; a factor of None disables it).
        resume_after_failed_verification: when the fresh-process check does not
            confirm the target, train on from the final checkpoint on the job's
            last allocation (True, for a job driven on its own) or wait, ``queued``,
            holding no workers until the next ``start``/``rescale`` (False, for a job a
            scheduler drives: its CPUs were handed back when it reached the
            target and may belong to another job by now).
    """

    fixed_batch_size: int | None = domain_field(None, _OPTIONAL_POSITIVE)
    checkpoint_interval_s: float = domain_field(10.0, _PERIOD_S)
    checkpoint_every_steps: int | None = domain_field(None, _OPTIONAL_POSITIVE)
    keep_checkpoints: int = domain_field(3, Integer(ge=2))
    adapt_interval_s: float = domain_field(2.0, _PERIOD_S)
    report_interval_s: float = domain_field(0.2, _PERIOD_S)
    step_limit: int | None = domain_field(None, _OPTIONAL_POSITIVE)
    max_restarts: int = domain_field(3, Integer(ge=0))
    collective_timeout_s: float = domain_field(300.0, _PERIOD_S)
    warmup_steps: int = domain_field(2, Integer(ge=0))
    resume_after_failed_verification: bool = domain_field(True, Boolean())
    divergence_factor: float | None = domain_field(DEFAULT_DIVERGENCE_FACTOR, Real(gt=1, none=True))
    divergence_reports: int = domain_field(DEFAULT_DIVERGENCE_REPORTS, Integer(ge=1))

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Event:
    """Something that happened to a job: ``kind`` plus JSON-safe ``details``.

    Kinds include ``started``, ``rescaled``, ``stopped``, ``checkpoint_corrupt``,
    ``worker_lost``, ``restarted``, ``target_reached``, ``verified``,
    ``verification_failed``, ``failed`` and ``batch_changed``.  ``time`` is Unix seconds.
    """

    time: float
    kind: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobReport:
    """A snapshot of one job, for a scheduler.

    Attributes:
        job_id: the job's identifier (its work directory's name by default).
        kind: the spec's name.
        state: life-cycle state (:class:`~pollux_opt.lifecycle.JobState`).
        step: optimizer steps completed (as last reported by rank 0).
        progress: M0-equivalent iterations completed (sum of AdaScale gains).
        samples: training samples consumed (the data position).
        epoch: samples / train_size.
        metric_name, target, higher_is_better: the completion criterion.
        metric: latest validation metric (None before the first evaluation).
        final_metric: the metric of the final checkpoint re-evaluated in a fresh
            process (set only when verified).
        placement: ``{node: replicas}`` currently held (empty when none, also
            while verifying).
        num_replicas, num_nodes: totals of ``placement``.
        local_bsz, accum_steps, batch_size: the batch configuration in use (or
            last used); batch_size = K * local_bsz * (accum_steps + 1).
        fixed_batch_size: the user-fixed total batch, or None when adaptive.
        measurements: measured step times per configuration.
        throughput_params: fitted throughput model (None before any measurement).
        grad_stats: smoothed gradient statistics (None before any step).
        limits: batch limits of the job.
        restart_delay: median measured rescale time (seconds; None before any
            rescale): the job's restart delay for the scheduler's penalty.
        rescale_times: every measured rescale time (seconds), oldest first.
        start_times: measured (re)start times from ``queued`` (seconds).
        num_restarts: fault restarts so far.
        age: wall seconds since the job was first started.
        worker_pids: process ids of the current workers, by rank.
        error: why the job failed (None otherwise).
        events: everything recorded so far (also in ``<workdir>/events.jsonl``).
        type_measurements: on a cluster of several node types, the step times
            measured on each type (``{node type: Measurements}``; empty on an
            untyped cluster); ``measurements`` pools every type.
        type_params: the throughput fit of each measured type (None until fitted).
        verifying: the job reached its target and its final checkpoint is being
            re-checked in a fresh process (state ``running``, holding no CPUs).
        transitions: every state change of this handle's life
            (:class:`~pollux_opt.lifecycle.Transition`), oldest first.
    """

    job_id: str
    kind: str
    state: JobState
    step: int
    progress: float
    samples: int
    epoch: float
    metric_name: str
    target: float
    higher_is_better: bool
    metric: float | None
    final_metric: float | None
    placement: Mapping[str, int]
    num_replicas: int
    num_nodes: int
    local_bsz: int
    accum_steps: int
    batch_size: int
    fixed_batch_size: int | None
    measurements: Measurements
    throughput_params: ThroughputParams | None
    grad_stats: GradientStats | None
    limits: BatchLimits
    restart_delay: float | None
    rescale_times: tuple[float, ...]
    start_times: tuple[float, ...]
    num_restarts: int
    age: float
    worker_pids: tuple[int, ...]
    error: str | None
    events: tuple[Event, ...]
    type_measurements: Mapping[str, Measurements] = field(default_factory=dict)
    type_params: Mapping[str, ThroughputParams | None] = field(default_factory=dict)
    verifying: bool = False
    transitions: tuple[Transition, ...] = ()

    def goodput_model(self) -> GoodputModel | None:
        """The job's :class:`~pollux_opt.model.goodput.GoodputModel`, or None until it
        has both a throughput fit and gradient statistics (a scheduler should
        then give the job its base allocation).

        In fixed-batch mode the gradient statistics do not matter (use
        ``speedup(..., fixed_batch_size=report.fixed_batch_size)``); if none
        were measured, neutral ones (no noise) stand in.
        """
        return goodput_model(self.throughput_params, self.grad_stats, self.limits,
                             fixed_batch=self.fixed_batch_size is not None)

    def goodput_models(self, types: tuple[str, ...] | list[str]) -> dict[str, GoodputModel] | None:
        """The job's goodput model on each of ``types`` (a cluster's node types),
        one shared gradient statistic; None where the job has measured no type.

        A type's own fit once the job has measured there; an unmeasured type
        gets the fit of a measured one (:func:`pollux_opt.model.projection.projection_plan`:
        the type measured at the most replica counts beyond one, else the one
        with the most measured configurations) at speed ratio 1, the optimistic
        assumption its first measurement replaces.  The declared speed of a
        type (its ``cpu_quota``) is never used.
        """
        from pollux_opt.model.projection import project_params, projection_plan

        if not self.type_measurements:
            return None
        fixed = self.fixed_batch_size is not None
        own = {t: goodput_model(self.type_params.get(t), self.grad_stats, self.limits, fixed_batch=fixed)
               for t in self.type_measurements}
        fitted = {t for t, m in own.items() if m is not None}
        replicas = {t: m.num_replicas.tolist() for t, m in self.type_measurements.items()}
        out = {}
        for t, (src, ratio) in projection_plan(tuple(types), replicas, fitted, {}).items():
            model = own[src]
            out[t] = model if src == t else GoodputModel(
                project_params(model.throughput_params, ratio), model.grad_stats, self.limits)
        return out

    def events_of(self, kind: str) -> tuple[Event, ...]:
        """The recorded events of one kind, oldest first."""
        return tuple(e for e in self.events if e.kind == kind)
