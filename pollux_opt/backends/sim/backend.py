"""The simulation backend of the scheduler loop, on a simulated clock.

Each :class:`SimJob` follows the hidden truth of its :class:`~._profile.Profile`
(step and sync times per placement and micro-batch, gradient statistics per
epoch, progress to complete), exactly as Pollux's own simulator steps its jobs
(artifact ``simulator.py``): during an interval a running job first serves the
rest of its restart delay, then makes progress at the true goodput

    gain     = (var + sqr) / (var / (M / M0) + sqr)            AdaScale gain
    goodput  = gain / (T_step + s * (T_step - T_sync)) * (1 - slowdown)   units / s

epoch by epoch, and completes once its progress reaches ``progress_at(max_epochs)``.

The policy sees only :class:`~pollux_opt.scheduling.loop.JobView` objects: the
measurements a job reported at configurations it has actually run (optionally
perturbed by multiplicative noise, the "profile error" of the sensitivity
study) and a :class:`~pollux_opt.GoodputModel` fitted online from them by the
job's :class:`~pollux_opt.runtime.agent.JobAgent`, the same agent a real job
runs.  It never sees the profile.  Only
:class:`Oracle` (for Optimus+Oracle, by construction) reads the truth.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.records.events import EventLog, goodput_model_to_json
from pollux_opt.model import BatchConfig, BatchLimits, Cluster, GoodputModel
from pollux_opt.model.domains import Boolean, Integer, Keyed, Real, check, check_fields, domain_field
from pollux_opt.model.options import DEFAULT_RESTART_DELAY
from pollux_opt.runtime.adapt import decided_batch, runnable, split_batch
from pollux_opt.runtime.agent import REFIT_GROWTH, JobAgent
from pollux_opt.runtime.measurements import ConfigKey
from pollux_opt.scheduling.loop import Decision, JobView
from pollux_opt.backends.sim.traces import Profile
from pollux_opt.workloads.adaptdl import pinned_config
from pollux_opt.workloads.job import WorkloadJob

__all__ = ["SimConfig", "SimBackend", "Oracle", "split_batch"]

log = logging.getLogger(__name__)

#: The simulated cluster by default: Pollux's simulator (OSDI 2021 artifact,
#: ``simulator.py``) models 16 nodes of 4 GPUs each; here a GPU is a replica slot.
SIM_DEFAULT_NODES = 16
SIM_DEFAULT_CPUS_PER_NODE = 4
#: Seconds between scheduling rounds by default (Pollux's simulator reallocates
#: every 60 s).  Real runs use their own default (``backends.local``'s 30 s).
SIM_DEFAULT_INTERVAL_S = 60.0
#: Absolute cap on replicas per job (the artifact's simulator caps at 64).
DEFAULT_MAX_REPLICAS = 64
#: Applications whose jobs are not elastic: the paper's simulator runs NCF at
#: its tuned configuration, one GPU at batch 32768, under Pollux, and caps it
#: at one GPU under Optimus (artifact ``simulator.py``, ``get_pollux_job_info``
#: and ``get_optimus_job_info``).  Here such a job runs at its profile's
#: pinned configuration (:func:`~pollux_opt.workloads.adaptdl.pinned_config`)
#: under every policy, whatever its workload row says; the AdaptDL workloads'
#: NCF rows hold that configuration already.  Our Optimus+Oracle caps replicas
#: by the tuned batch alone, as the artifact does for other jobs; it gave NCF
#: one CPU in all eight AdaptDL workloads either way (identical JCTs).
PAPER_FIXED_APPLICATIONS = ("ncf",)
#: Seconds a simulated job waits (restart, start, completion), and report noise.
_NON_NEGATIVE = Real(ge=0)
#: Seconds the simulated clock advances by.
_POSITIVE = Real(gt=0)


@dataclass(frozen=True)
class SimConfig:
    """Simulation settings.

    Attributes:
        restart_delay: seconds a (re)start costs a job (also what views report).
        interference: slowdown fraction in [0, 1) of a multi-node job on a node
            shared with another multi-node job (0: none; the paper's study uses 0.25, 0.5).
        max_replicas: hard cap on replicas per job.
        report_noise: sigma of a log-normal multiplicative error on every
            measurement a job reports (0: exact).
        seed: seed of the report noise.
        emit_reports: also log one ``report`` event per running job per interval.
        completion_delay: seconds from reaching the target to completion, during
            which the job holds no CPUs: a real job's re-evaluation of its final
            checkpoint in a fresh process.  A number for every job, or
            ``{application: seconds}`` (applications not named: 0).  Pollux's
            simulator has none (0); profiles exported from real runs measure it.
        wake_every: None: rounds every ``interval`` exactly, as Pollux's simulator
            (arrivals wait for the next round).  A number of seconds: like the
            real backend, which polls its jobs this often and starts the next
            round early once a job arrives or reaches its target.
        start_delay: seconds a job's first start costs (building its data and
            model), a number or ``{application: seconds}``; None: ``restart_delay``
            (Pollux's simulator charges every start alike).
        split_single: run a one-replica job's batch without accumulation as two
            micro-batches of half the size, as the real executor does so that
            every step yields two gradients for the variance estimate
            (``pollux_opt.runtime.adapt.executable``); False: as configured.
        fixed_applications: applications whose jobs are not elastic: they
            run at their profile's pinned configuration
            (:func:`~pollux_opt.workloads.adaptdl.pinned_config`: one replica
            at the tuned batch size), not the one in their workload row; their
            views submit it and offer at most its replicas, and they always
            train at its batch size, whatever batch the policy picks
            (default: NCF, as in the paper's simulator; ``()``: none).
    """

    # Pollux's simulator charges 30 s per (re)start.
    restart_delay: float = domain_field(DEFAULT_RESTART_DELAY, _NON_NEGATIVE)
    interference: float = domain_field(0.0, Real(ge=0, lt=1))
    max_replicas: int = domain_field(DEFAULT_MAX_REPLICAS, Integer(ge=1))
    report_noise: float = domain_field(0.0, _NON_NEGATIVE)
    seed: int = domain_field(0, Integer(ge=0))
    emit_reports: bool = domain_field(False, Boolean())
    completion_delay: float | Mapping[str, float] = domain_field(0.0, Keyed(_NON_NEGATIVE))
    wake_every: float | None = domain_field(None, Real(gt=0, unit="seconds", none=True))
    start_delay: float | Mapping[str, float] | None = domain_field(None, Keyed(_NON_NEGATIVE, none=True))
    split_single: bool = domain_field(False, Boolean())
    fixed_applications: tuple[str, ...] = PAPER_FIXED_APPLICATIONS

    def __post_init__(self) -> None:
        apps = self.fixed_applications
        if isinstance(apps, str) or not isinstance(apps, (tuple, list, frozenset, set)) or not all(
            isinstance(a, str) for a in apps
        ):
            raise InvalidProblem(f"fixed_applications must be a tuple of application names, got {apps!r}")
        object.__setattr__(self, "fixed_applications", tuple(apps))
        check_fields(self)


def _limits(p: Profile) -> BatchLimits:
    """The batch limits of a job of profile ``p`` (those its goodput model uses)."""
    return BatchLimits(p.init_batch_size, p.max_batch_size, p.min_local_bsz, p.max_local_bsz)


def _per_app(value: float | Mapping[str, float], application: str) -> float:
    """A setting given for every job or per application (0 for one not named)."""
    return float(value.get(application, 0.0)) if isinstance(value, Mapping) else float(value)


@dataclass(eq=False)
class SimJob:
    """Mutable state of one simulated job (internal to the backend)."""

    spec: WorkloadJob
    profile: Profile
    #: (replicas, batch size) of a job that is not elastic (``SimConfig.fixed_applications``).
    pinned: tuple[int, int] | None = None
    placement: dict[str, int] = field(default_factory=dict)
    local_bsz: int = 0
    accum_steps: int = 0
    rescale_left: float = 0.0
    epoch: int = 0
    progress: float = 0.0
    attained: float = 0.0
    restarts: int = 0
    started: bool = False
    submitted: bool = False
    completion_time: float | None = None
    agent: JobAgent | None = None  # what the job measured and its fitted model
    last_goodput: float = 0.0
    last_throughput: float = 0.0

    @property
    def replicas(self) -> int:
        return sum(self.placement.values())

    @property
    def batch_size(self) -> int:
        return self.replicas * self.local_bsz * (self.accum_steps + 1)

    @property
    def fixed(self) -> bool:
        """Not elastic: runs at its ``pinned`` configuration."""
        return self.pinned is not None

    @property
    def submitted_config(self) -> tuple[int, int]:
        """(replicas, batch size) the job runs as submitted: ``pinned`` if fixed, else its workload row's."""
        return self.pinned if self.pinned is not None else (self.spec.replicas, self.spec.batch_size)

    def hard_max_replicas(self, cap: int) -> int:
        """Most replicas the job may take: bounded by ``cap`` and by its largest
        batch in smallest micro-batches; a ``fixed`` job by its pinned replicas."""
        p = self.profile
        most = max(1, min(cap, p.max_batch_size // p.min_local_bsz))
        return min(most, max(1, self.submitted_config[0])) if self.fixed else most


class Oracle:
    """True remaining work and step times, for Optimus+Oracle only.

    The oracle answers from the hidden profiles; no other policy gets one.
    """

    def __init__(self, backend: "SimBackend") -> None:
        self._backend = backend

    def remaining_steps(self, job_id: str, batch_size: int) -> float:
        """Optimizer steps at a fixed ``batch_size`` from the current epoch to completion."""
        job = self._backend._jobs[job_id]
        p = job.profile
        b = min(max(batch_size, p.init_batch_size), p.max_batch_size)
        return max(p.iterations(b, p.max_epochs) - p.iterations(b, job.epoch), 1.0)

    def step_time(self, job_id: str, placement: Sequence[int], batch_size: int) -> float:
        """True seconds per optimizer step of ``batch_size`` on ``placement`` (replicas per node)."""
        p = self._backend._jobs[job_id].profile
        k = sum(placement)
        atomic, accum = split_batch(batch_size, k, p.max_local_bsz, p.min_local_bsz)
        step, sync = p.step_sync(tuple(placement), atomic)
        return step + accum * (step - sync)

    def max_local_bsz(self, job_id: str) -> int:
        return self._backend._jobs[job_id].profile.max_local_bsz

    def min_local_bsz(self, job_id: str) -> int:
        return self._backend._jobs[job_id].profile.min_local_bsz


class SimBackend:
    """A :class:`~pollux_opt.scheduling.loop.Backend` over simulated jobs.

    Args:
        jobs: the workload.
        profiles: application name -> true profile.
        cluster: the simulated cluster (node ids are the placement keys).
        events: the run's event log (submit, start, rescale, complete events).
        config: simulation settings.

    Raises:
        InvalidProblem: a job names an application without a profile.
    """

    def __init__(
        self,
        jobs: Sequence[WorkloadJob],
        profiles: Mapping[str, Profile],
        cluster: Cluster,
        events: EventLog | None = None,
        config: SimConfig | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.cluster = cluster
        self.events = events
        self._now = 0.0
        self._rng = np.random.default_rng(self.config.seed)
        self._jobs: dict[str, SimJob] = {}
        # Measurement set -> fitted ThroughputParams, shared by the jobs' agents:
        # the fit is a pure function of the measurements, and jobs of one
        # application measured at the same configurations report the same
        # (noise-free) times, so each distinct set is fitted once.
        self._fits: dict[tuple, object] = {}
        pinned = {a: pinned_config(profiles[a]) for a in self.config.fixed_applications if a in profiles}
        for spec in sorted(jobs, key=lambda j: (j.arrival_s, j.id)):
            if spec.kind not in profiles:
                raise InvalidProblem(
                    f"job {spec.id!r}: no profile for application {spec.kind!r}; "
                    f"have {sorted(profiles)}"
                )
            if spec.id in self._jobs:
                raise InvalidProblem(f"duplicate job name {spec.id!r}")
            p = profiles[spec.kind]
            agent = JobAgent(_limits(p), refit_growth=REFIT_GROWTH, fit_cache=self._fits, name=spec.id)
            self._jobs[spec.id] = SimJob(spec, p, pinned=pinned.get(spec.kind), agent=agent)
        self._order = {nid: i for i, nid in enumerate(cluster.node_ids)}
        self.oracle = Oracle(self)
        self._admit()

    # ---------------------------------------------------------------- protocol
    def now(self) -> float:
        return self._now

    def finished(self) -> bool:
        return all(j.completion_time is not None for j in self._jobs.values())

    def views(self) -> list[JobView]:
        out = []
        cfg = self.config
        for job in self._jobs.values():
            if not job.submitted or job.completion_time is not None:
                continue
            out.append(
                JobView(
                    job_id=job.spec.id,
                    submit_time=job.spec.arrival_s,
                    state="running" if job.placement else "pending",
                    placement=dict(job.placement),
                    restarts=job.restarts,
                    age=self._now - job.spec.arrival_s,
                    min_replicas=0,
                    max_replicas=job.hard_max_replicas(cfg.max_replicas),
                    submitted_replicas=job.submitted_config[0],
                    submitted_batch_size=job.submitted_config[1],
                    goodput_model=self._model(job),
                    restart_delay=cfg.restart_delay,
                    progress=job.progress,
                    attained_service=job.attained,
                    # what the policy's exploration cap is a multiple of
                    max_profiled_replicas=job.agent.most_replicas,
                )
            )
        return out

    def apply(self, decision: Decision) -> None:
        for job in self._jobs.values():
            if not job.submitted or job.completion_time is not None:
                continue
            jid = job.spec.id
            new = {n: int(k) for n, k in decision.placement.get(jid, {}).items() if k}
            for n in new:
                if n not in self._order:
                    raise InvalidProblem(f"decision places job {jid!r} on unknown node {n!r}")
            if new != job.placement:
                self._reallocate(job, new)
            if job.placement:
                self._set_batch(job, decision.batch.get(jid))
        load: dict[str, int] = {}
        for job in self._jobs.values():
            for n, k in job.placement.items():
                load[n] = load.get(n, 0) + k
        caps = {n.id: n.cpus for n in self.cluster.nodes}
        for n, k in load.items():
            if k > caps[n]:
                raise InvalidProblem(f"decision overloads node {n!r}: {k} replicas > {caps[n]}")

    def advance(self, seconds: float) -> None:
        check("seconds", seconds, _POSITIVE)
        end = self._now + seconds
        while self._now < end:
            dt = end - self._now if self.config.wake_every is None else min(self.config.wake_every, end - self._now)
            slow = self._slowdowns()
            reached = False
            for job in self._jobs.values():
                if job.placement and job.completion_time is None:
                    self._step(job, dt, slow.get(job.spec.id, 0.0))
                    reached = reached or job.completion_time is not None
            self._now = end if end - self._now <= dt else self._now + dt
            arrived = self._admit()
            if self.config.wake_every is not None and (reached or arrived):
                return  # the real backend starts the next round now

    # ----------------------------------------------------------------- results
    def jcts(self) -> dict[str, float]:
        """Job id -> completion time minus submission time, seconds (completed jobs)."""
        return {
            j.spec.id: j.completion_time - j.spec.arrival_s
            for j in self._jobs.values() if j.completion_time is not None
        }

    def job_records(self) -> list[dict]:
        """One row per job: name, application, submit, completion, jct, restarts, attained."""
        return [
            {
                "job_id": j.spec.id, "application": j.spec.kind, "submit_time": j.spec.arrival_s,
                "completion_time": j.completion_time,
                "jct": None if j.completion_time is None else j.completion_time - j.spec.arrival_s,
                "restarts": j.restarts, "attained_service": j.attained,
                "num_replicas": j.spec.replicas, "batch_size": j.spec.batch_size,
            }
            for j in self._jobs.values()
        ]

    # --------------------------------------------------------------- internals
    def _emit(self, etype: str, t: float, job_id: str | None, **fields) -> None:
        if self.events is not None:
            self.events.emit(etype, t, job_id, **fields)

    def _admit(self) -> bool:
        """Submit the jobs that have arrived by now; True if there were any."""
        arrived = False
        for job in self._jobs.values():
            if not job.submitted and job.spec.arrival_s <= self._now:
                job.submitted = arrived = True
                self._emit(
                    "submit", job.spec.arrival_s, job.spec.id,
                    submitted_replicas=job.submitted_config[0],
                    submitted_batch_size=job.submitted_config[1], application=job.spec.kind,
                    max_replicas=job.hard_max_replicas(self.config.max_replicas),
                )
        return arrived

    def _sorted(self, placement: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(placement[n] for n in sorted(placement, key=self._order.__getitem__))

    def _reallocate(self, job: SimJob, new: dict[str, int]) -> None:
        old = job.placement
        job.placement = new
        if not new:
            job.rescale_left = 0.0
            job.local_bsz = job.accum_steps = 0
            return
        job.rescale_left = self.config.restart_delay
        if not job.started:
            if self.config.start_delay is not None:
                job.rescale_left = _per_app(self.config.start_delay, job.spec.kind)
            job.started = True
            self._emit("start", self._now, job.spec.id, placement=new)
        else:
            job.restarts += 1
            self._emit("rescale_begin", self._now, job.spec.id, old_placement=old, placement=new)

    def _set_batch(self, job: SimJob, config: BatchConfig | None) -> None:
        p, limits = job.profile, job.agent.limits
        k = job.replicas
        # With split_single, as the real executor runs it (runtime.adapt.executable).
        split = self.config.split_single
        if config is not None and config.batch_size > 0 and not job.fixed:
            run = decided_batch(config, k, limits, split_single=split)  # the rule the real backend applies
            job.local_bsz, job.accum_steps = run.local_bsz, run.accum_steps
            return
        if job.fixed:  # not elastic: the pinned batch, whatever the policy chose
            batch = min(job.submitted_config[1], p.max_batch_size)
            local, accum = split_batch(batch, k, p.max_local_bsz, p.min_local_bsz)
        else:
            model = self._model(job)
            if model is not None:
                choice = model.optimize(len(job.placement), k)
                local, accum = int(choice.local_bsz), int(choice.accum_steps)
            else:
                local, accum = 0, 0
            if local <= 0:  # no model yet, or infeasible: the initial batch, as the artifact does
                local, accum = split_batch(
                    max(p.init_batch_size, p.min_local_bsz * k), k, p.max_local_bsz, p.min_local_bsz
                )
        run = runnable(local, accum, k, limits, split_single=split)  # never beyond the largest batch
        job.local_bsz, job.accum_steps = run.local_bsz, run.accum_steps

    def _slowdowns(self) -> dict[str, float]:
        if self.config.interference <= 0:
            return {}
        multi = [j for j in self._jobs.values() if len(j.placement) > 1]
        count: dict[str, int] = {}
        for j in multi:
            for n in j.placement:
                count[n] = count.get(n, 0) + 1
        return {
            j.spec.id: self.config.interference
            for j in multi if any(count[n] > 1 for n in j.placement)
        }

    def _noise(self) -> float:
        s = self.config.report_noise
        return float(np.exp(self._rng.normal(0.0, s))) if s > 0 else 1.0

    def _report(self, job: SimJob, placement: tuple[int, ...], step: float, sync: float, sqr: float, var: float) -> None:
        """What the job tells the scheduler: this configuration's times and its gradient stats."""
        job.agent.update_stats((sqr * self._noise(), var * self._noise()))
        # The profile's times are those of one micro-batch step: accum_steps 0.
        key = ConfigKey(len(placement), sum(placement), job.local_bsz, 0)
        if key not in job.agent:  # a configuration's first report stands
            noise = self._noise()
            job.agent.add_measurement(key, step * noise, min(sync * self._noise(), step * noise))

    def _model(self, job: SimJob) -> GoodputModel | None:
        """The job's goodput model from what it reported (see :class:`JobAgent`)."""
        return job.agent.model()

    def _step(self, job: SimJob, seconds: float, slowdown: float) -> None:
        """Advance one running job by ``seconds`` of its true behaviour."""
        p = job.profile
        now = self._now
        k = job.replicas
        delay = min(job.rescale_left, seconds)
        if delay > 0:
            job.rescale_left -= delay
            job.attained += delay * k
            now += delay
            seconds -= delay
            if job.rescale_left <= 0 and job.restarts > 0:
                self._emit("rescale_end", now, job.spec.id, placement=job.placement,
                           duration_s=self.config.restart_delay)
        placement = self._sorted(job.placement)
        while seconds > 0 and job.completion_time is None:
            batch = job.batch_size
            step, sync = p.step_sync(placement, job.local_bsz)
            sqr, var = p.grad_stats(batch, job.epoch)
            scale = batch / p.init_batch_size
            gain = (var + sqr) / (var / scale + sqr)
            self._report(job, placement, step, sync, sqr, var)
            total = step + (step - sync) * job.accum_steps
            goodput = gain / total * (1.0 - slowdown)
            job.last_goodput = goodput
            job.last_throughput = batch / total * (1.0 - slowdown)
            target = p.progress_at(job.epoch + 1)
            if job.progress + goodput * seconds < target:
                job.progress += goodput * seconds
                job.attained += seconds * k
                now += seconds
                seconds = 0.0
            else:
                delta = max(target - job.progress, 0.0) / goodput
                job.epoch += 1
                job.progress = target
                job.attained += delta * k
                now += delta
                seconds -= delta
                if job.epoch >= p.max_epochs:
                    verify = _per_app(self.config.completion_delay, job.spec.kind)
                    job.completion_time = now + verify
                    self._emit("complete", job.completion_time, job.spec.id, verified=False,
                               metric="epochs", value=job.epoch, restarts=job.restarts,
                               progress=job.progress, model=goodput_model_to_json(self._model(job)),
                               verify_s=verify)
                    job.placement = {}
        if self.config.emit_reports and job.completion_time is None:
            self._emit(
                "report", now, job.spec.id, throughput=job.last_throughput, goodput=job.last_goodput,
                progress=job.progress, replicas=k, batch_size=job.batch_size,
            )
