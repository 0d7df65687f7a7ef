"""The simulation backend of the scheduler loop, on a simulated clock.

Each :class:`~pollux_opt.backends.sim.state.SimJob` follows the hidden truth of its
:class:`~pollux_opt.backends.sim.traces.Profile`
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
job's :class:`~pollux_opt.agent.agent.JobAgent`, the same agent a real job
runs.  It never sees the profile.  Only :class:`Oracle` (for Optimus+Oracle,
by construction) reads the truth.  The policy decides placements; each job
picks its batch for its allocation every round with its own model, as a real
job does (:func:`~pollux_opt.agent.batch.choose_batch`).
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.lifecycle import JobState
from pollux_opt.records.events import EventLog, NullLog, goodput_model_to_json
from pollux_opt.model import BatchLimits, Cluster
from pollux_opt.model.domains import Real, check
from pollux_opt.agent.batch import choose_batch
from pollux_opt.agent.agent import REFIT_GROWTH, JobAgent
from pollux_opt.agent.measurements import ConfigKey
from pollux_opt.scheduling.loop import Decision, JobView
from pollux_opt.backends.sim.state import (
    Oracle,
    SimConfig,
    SimJob,
    TypedJobState,
    batch_limits,
    mixed_step_sync,
    per_app,
    per_type_profiles,
    pooled_limits,
)
from pollux_opt.backends.sim.provision import NodeState, SimNodes
from pollux_opt.backends.sim.traces import Profile
from pollux_opt.workloads.adaptdl import pinned_config
from pollux_opt.workloads.job import WorkloadJob

__all__ = ["SimBackend"]

#: Seconds the simulated clock advances by.
_POSITIVE = Real(gt=0)


class SimBackend:
    """A :class:`~pollux_opt.scheduling.loop.Backend` over simulated jobs.

    Args:
        jobs: the workload.
        profiles: application name -> true profile: a
            :class:`~pollux_opt.backends.sim.traces.Profile` (every node type
            alike), or ``{type: Profile}`` naming each node type of ``cluster``.
        cluster: the simulated cluster (node ids are the placement keys; node types select the per-type truth).
        events: the run's event log (submit, start, rescale, complete events); None: none kept.
        config: simulation settings.
        fixed_batch: the jobs train at their submitted batch size (the
            policy's :attr:`~pollux_opt.scheduling.loop.Policy.fixed_batch`;
            set before the first round); false: they co-adapt it.
        nodes: an autoscaled cluster's nodes (``cluster`` is then the largest
            one; see :mod:`pollux_opt.backends.sim.provision`); None: every
            node of ``cluster`` is up throughout.

    Raises:
        InvalidProblem: a job names an application without a profile, or a
            typed profile lacks a node type of the cluster.
    """

    def __init__(
        self,
        jobs: Sequence[WorkloadJob],
        profiles: Mapping[str, Profile | Mapping[str, Profile]],
        cluster: Cluster,
        events: EventLog | None = None,
        config: SimConfig | None = None,
        *,
        fixed_batch: bool = False,
        nodes: SimNodes | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.nodes = nodes
        self.fixed_batch = bool(fixed_batch)
        self.cluster = cluster
        self.events = NullLog() if events is None else events
        self._now = 0.0
        self._rng = np.random.default_rng(self.config.seed)
        self._jobs: dict[str, SimJob] = {}
        # Measurement set -> fitted ThroughputParams, shared by the jobs' agents:
        # the fit is a pure function of the measurements, and jobs of one
        # application measured at the same configurations report the same
        # (noise-free) times, so each distinct set is fitted once.
        self._fits: dict[tuple, object] = {}
        typed = cluster.typed or any(isinstance(p, Mapping) for p in profiles.values())
        self._node_type = {n.id: n.type for n in cluster.nodes}
        per_type = {a: per_type_profiles(a, p, cluster.types) for a, p in profiles.items()}
        reference = {a: next(iter(t.values())) for a, t in per_type.items()}
        pinned = {a: pinned_config(reference[a]) for a in self.config.fixed_applications if a in profiles}
        for spec in sorted(jobs, key=lambda j: (j.arrival_s, j.id)):
            if spec.kind not in profiles:
                raise InvalidProblem(
                    f"job {spec.id!r}: no profile for application {spec.kind!r}; "
                    f"have {sorted(profiles)}"
                )
            if spec.id in self._jobs:
                raise InvalidProblem(f"duplicate job name {spec.id!r}")
            p = reference[spec.kind]
            limits = pooled_limits(per_type[spec.kind]) if typed else batch_limits(p)
            agent = JobAgent(limits, refit_growth=REFIT_GROWTH, fit_cache=self._fits, name=spec.id)
            job = SimJob(spec, per_type[spec.kind], pinned=pinned.get(spec.kind), agent=agent)
            if typed:
                job.typed = TypedJobState.create(per_type[spec.kind], self._fits, spec.id)
            self._jobs[spec.id] = job
        self._order = {nid: i for i, nid in enumerate(cluster.node_ids)}
        self.oracle = Oracle(self._jobs)
        self._admit()

    def _restart_delay(self, job: SimJob) -> float:
        """Seconds a restart of ``job`` costs: Sia's per-model delay when enabled, else the configured one."""
        return self.config.sia.restart_delay_of(job.spec.kind, self.config.restart_delay)

    def _run_type(self, job: SimJob) -> str | None:
        """The node type a typed job runs on (None: not running, or on several types)."""
        kinds = {self._node_type[n] for n in job.placement}
        return kinds.pop() if len(kinds) == 1 else None

    def _run_limits(self, job: SimJob) -> BatchLimits:
        """The batch limits of the type the job runs on; on several types (or none), the pooled ones."""
        run_type = None if job.typed is None else self._run_type(job)
        return job.agent.limits if run_type is None else job.typed.agents[run_type].limits

    # ---------------------------------------------------------------- protocol
    def now(self) -> float:
        return self._now

    def finished(self) -> bool:
        return all(j.completion_time is not None for j in self._jobs.values())

    def _active(self) -> list[SimJob]:
        """The jobs submitted and not complete."""
        return [j for j in self._jobs.values() if j.submitted and j.completion_time is None]

    def current_cluster(self) -> Cluster:
        """The nodes up now (all of ``cluster`` unless autoscaled)."""
        return self.cluster if self.nodes is None else self.nodes.current_cluster()

    def provisioned(self) -> dict[str, int]:
        """Nodes per type up or starting (every node of ``cluster`` unless autoscaled)."""
        if self.nodes is None:
            return {t: len(self.cluster.of_type(t)) for t in self.cluster.types}
        return self.nodes.provisioned()

    def provision(self, now: float, sizes: Mapping[str, int]) -> None:
        """Request or release nodes towards ``sizes`` per type (an autoscaled cluster only)."""
        if self.nodes is None:
            raise InvalidProblem("this simulation's cluster is fixed: give SimBackend nodes to autoscale it")
        self.nodes.provision(now, sizes, self._load())

    def _load(self) -> Counter:
        load = Counter()
        for job in self._jobs.values():
            load.update(job.placement)
        return load

    def _shown(self, placement: Mapping[str, int]) -> dict[str, int]:
        """A placement as the policy sees it: on the nodes up (a node being released is not offered)."""
        if self.nodes is None:
            return dict(placement)
        state = self.nodes.state
        return {n: k for n, k in placement.items() if state[n] is NodeState.UP}

    def views(self) -> list[JobView]:
        return [
            JobView(
                job_id=job.spec.id,
                submit_time=job.spec.arrival_s,
                state=JobState.RUNNING if self._shown(job.placement) else JobState.QUEUED,
                placement=self._shown(job.placement),
                restarts=job.restarts,
                age=self._now - job.spec.arrival_s,
                min_replicas=0,
                max_replicas=job.hard_max_replicas(self.config.max_replicas),
                submitted_replicas=job.submitted_config[0],
                submitted_batch_size=job.submitted_config[1],
                goodput_model=job.agent.model(),
                restart_delay=self._restart_delay(job),
                progress=job.progress,
                attained_service=job.attained,
                # what the policy's exploration cap is a multiple of
                max_profiled_replicas=(job.agent.most_replicas if job.typed is None
                                       else max(job.agent.most_replicas, job.typed.most_replicas)),
                weight=job.spec.weight,
                goodput_models=None if job.typed is None else job.typed.models(),
                fixed_batch_size=job.submitted_config[1] if self.fixed_batch else None,
                batch_size=job.batch_size,
            )
            for job in self._active()
        ]

    def apply(self, decision: Decision) -> None:
        up = set(self.current_cluster().node_ids)
        for job in self._active():
            jid = job.spec.id
            new = {n: int(k) for n, k in decision.placement.get(jid, {}).items() if k}
            for n in new:
                if n not in up:
                    what = "unknown" if n not in self._order else "a down"
                    raise InvalidProblem(f"decision places job {jid!r} on {what} node {n!r}")
            if new != job.placement:
                self._reallocate(job, new)
            if job.placement:
                self._choose_batch(job)
        load = self._load()
        for node in self.cluster.nodes:
            if load[node.id] > node.cpus:
                raise InvalidProblem(f"decision overloads node {node.id!r}: {load[node.id]} replicas > {node.cpus}")
        if self.nodes is not None:
            self.nodes.tick(self._now, load)  # the nodes its jobs have left go

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
            if self.nodes is not None:
                self.nodes.tick(self._now, self._load())
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
    def _admit(self) -> bool:
        """Submit the jobs that have arrived by now; True if there were any."""
        arrived = False
        for job in self._jobs.values():
            if not job.submitted and job.spec.arrival_s <= self._now:
                job.submitted = arrived = True
                if job.typed is not None:
                    job.typed.profile_one_replica(job.profiles)
                self.events.emit(
                    "submit", job.spec.arrival_s, job.spec.id,
                    submitted_replicas=job.submitted_config[0],
                    submitted_batch_size=job.submitted_config[1], application=job.spec.kind,
                    max_replicas=job.hard_max_replicas(self.config.max_replicas),
                )
        return arrived

    def _reallocate(self, job: SimJob, new: dict[str, int]) -> None:
        old = job.placement
        job.placement = new
        if not new:
            job.rescale_left = 0.0
            job.local_bsz = job.accum_steps = 0
            return
        job.rescale_left = self._restart_delay(job)
        if not job.started:
            if self.config.start_delay is not None:
                job.rescale_left = per_app(self.config.start_delay, job.spec.kind)
            job.started = True
            self.events.emit("start", self._now, job.spec.id, placement=new)
        else:
            job.restarts += 1
            self.events.emit("rescale_begin", self._now, job.spec.id, old_placement=old, placement=new)

    def _choose_batch(self, job: SimJob) -> None:
        """The job picks its batch for its allocation, as a real job does, with its
        own model (of the type it runs on); a job that is not elastic trains at
        its pinned batch, whatever the policy.  A batch switch costs a
        simulated job nothing, so it does not hold on to its current one (the
        real job's hysteresis guards against unmeasured warmup steps)."""
        limits = self._run_limits(job)
        if job.pinned is not None:
            fixed = min(job.pinned[1], job.profile.max_batch_size)
        elif self.config.weak_scaling:
            per_replica = max(1, job.submitted_config[1] // max(job.submitted_config[0], 1))
            fixed = min(per_replica * sum(job.placement.values()), job.profile.max_batch_size)
        else:
            fixed = job.spec.batch_size if self.fixed_batch else None
        model = job.agent.batch_model()
        if job.typed is not None and model is not None:
            model = job.typed.models().get(self._run_type(job), model)
        run = choose_batch(limits, len(job.placement), job.replicas, model, fixed_batch_size=fixed,
                           split_single=self.config.split_single)
        job.local_bsz, job.accum_steps = run.local_bsz, run.accum_steps

    def _slowdowns(self) -> dict[str, float]:
        if self.config.interference <= 0:
            return {}
        multi = [j for j in self._jobs.values() if len(j.placement) > 1]
        count = Counter(n for j in multi for n in j.placement)
        return {
            j.spec.id: self.config.interference
            for j in multi if any(count[n] > 1 for n in j.placement)
        }

    def _noise(self) -> float:
        s = self.config.report_noise
        return float(np.exp(self._rng.normal(0.0, s))) if s > 0 else 1.0

    def _report(self, job: SimJob, placement: tuple[int, ...], step: float, sync: float, sqr: float, var: float) -> None:
        """What the job tells the scheduler: this configuration's times and its gradient stats."""
        stats = (sqr * self._noise(), var * self._noise())
        job.agent.update_stats(stats, int(job.steps))
        # The profile's times are those of one micro-batch step: accum_steps 0.
        key = ConfigKey(len(placement), sum(placement), job.local_bsz, 0)
        if job.typed is not None:
            job.typed.update_stats(stats)
        if key not in job.agent or (job.typed is not None and self._run_type(job) is not None):
            noise = self._noise()
            times = (step * noise, min(sync * self._noise(), step * noise))
            if key not in job.agent:  # a configuration's first report stands
                job.agent.add_measurement(key, *times)
            if job.typed is not None:
                job.typed.report(self._run_type(job), key, *times)

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
                self.events.emit("rescale_end", now, job.spec.id, placement=job.placement,
                                 duration_s=self._restart_delay(job))
        nodes = sorted(job.placement, key=self._order.__getitem__)
        placement = tuple(job.placement[n] for n in nodes)
        types = tuple(self._node_type[n] for n in nodes)
        while seconds > 0 and job.completion_time is None:
            batch = job.batch_size
            step, sync = mixed_step_sync(job.profiles, types, placement, job.local_bsz)
            sqr, var = p.grad_stats(batch, job.epoch)
            scale = batch / p.init_batch_size
            gain = (var + sqr) / (var / scale + sqr)
            self._report(job, placement, step, sync, sqr, var)
            total = step + (step - sync) * job.accum_steps
            factor = (1.0 - slowdown) * self.config.sia.goodput_factor(job.spec.kind)
            goodput = gain / total * factor
            job.last_goodput = goodput
            job.last_throughput = batch / total * factor
            target = p.progress_at(job.epoch + 1)
            if job.progress + goodput * seconds < target:
                job.progress += goodput * seconds
                job.attained += seconds * k
                job.steps += seconds / total
                now += seconds
                seconds = 0.0
            else:
                delta = max(target - job.progress, 0.0) / goodput
                job.epoch += 1
                job.progress = target
                job.attained += delta * k
                job.steps += delta / total
                now += delta
                seconds -= delta
                if job.epoch >= p.max_epochs:
                    verify = per_app(self.config.completion_delay, job.spec.kind)
                    job.completion_time = now + verify
                    self.events.emit("complete", job.completion_time, job.spec.id, verified=False,
                                     metric="epochs", value=job.epoch, restarts=job.restarts,
                                     progress=job.progress, model=goodput_model_to_json(job.agent.model()),
                                     verify_s=verify)
                    job.placement = {}
        job.agent.stats_steps = int(job.steps)  # the steps its statistics span
        if self.config.emit_reports and job.completion_time is None:
            self.events.emit(
                "report", now, job.spec.id, throughput=job.last_throughput, goodput=job.last_goodput,
                progress=job.progress, replicas=k, batch_size=job.batch_size,
            )
