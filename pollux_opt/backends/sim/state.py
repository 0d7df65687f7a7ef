"""Settings and per-job state of a simulation: :class:`SimConfig` (with Sia's
calibration, :class:`SiaSimSettings`), :class:`SimJob`, :class:`TypedJobState`
and the :class:`Oracle` that reads the jobs' truth for Optimus+Oracle.

:class:`SimJob` is the mutable state of one simulated job (its placement,
batch, progress and the agent that fits its goodput model);
:class:`~pollux_opt.backends.sim.backend.SimBackend` steps it on the truth of
its :class:`~pollux_opt.backends.sim.traces.Profile` per node type.  On a
cluster of several node types, :class:`TypedJobState` holds a job's per-type
models; a placement over nodes of several types (only a type-unaware policy
makes one) runs at the pace of its slowest type (:func:`mixed_step_sync`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from solvers import InvalidProblem

from pollux_opt.model import BatchLimits, GoodputModel
from pollux_opt.model.domains import Boolean, Integer, Keyed, Real, check, check_fields, domain_field
from pollux_opt.model.options import DEFAULT_RESTART_DELAY
from pollux_opt.agent.agent import REFIT_GROWTH, JobAgent
from pollux_opt.agent.batch import split_batch
from pollux_opt.agent.measurements import ConfigKey
from pollux_opt.model.projection import project_params, projection_plan
from pollux_opt.backends.sim.traces import Profile
from pollux_opt.workloads.job import WorkloadJob

__all__ = [
    "DEFAULT_MAX_REPLICAS",
    "Oracle",
    "PAPER_FIXED_APPLICATIONS",
    "SIA_CALIBRATION",
    "SIA_DEFAULT_RESTART_DELAY",
    "SIA_RESTART_DELAY",
    "SIM_DEFAULT_CPUS_PER_NODE",
    "SIM_DEFAULT_INTERVAL_S",
    "SIM_DEFAULT_NODES",
    "SimConfig",
    "SimJob",
    "SiaSimSettings",
    "TypedJobState",
    "batch_limits",
    "mixed_step_sync",
    "per_app",
    "per_type_profiles",
    "pooled_limits",
]

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
#: pinned configuration (:func:`~pollux_opt.workloads.adaptdl.pinned_config`:
#: one replica at the tuned batch size) under every policy, whatever its
#: workload row says: its view submits it and offers at most its replicas; the
#: AdaptDL workloads' NCF rows hold that configuration already.  Our Optimus+Oracle caps replicas
#: by the tuned batch alone, as the artifact does for other jobs; it gave NCF
#: one CPU in all eight AdaptDL workloads either way (identical JCTs).
PAPER_FIXED_APPLICATIONS = ("ncf",)
#: Seconds a simulated job waits (restart, start, completion), and report noise.
_NON_NEGATIVE = Real(ge=0)

#: Slowdown of real runs over Sia's simulator (Jayaram Subramanya et al., SOSP 2023),
#: per application (artifact siasosp23/artifacts, ``sia-simulator/simulator_config.py``,
#: ``SLOWDOWNS``, "fitted to real-world data"): it multiplies a job's goodput by ``1 / slowdown``.
SIA_CALIBRATION: Mapping[str, float] = {
    "cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5,
}
#: Checkpoint-restore delay per application, seconds (artifact
#: ``sia-simulator/applications.py``, ``Application.rescale_time``).
SIA_RESTART_DELAY: Mapping[str, float] = {
    "cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0, "yolov3": 80.0, "imagenet": 250.0, "ncf": 15.0,
}
#: Restart delay of an application not in :data:`SIA_RESTART_DELAY`, seconds (same source).
SIA_DEFAULT_RESTART_DELAY = 30.0
#: A calibration factor or a delay in seconds.
_POSITIVE = Real(gt=0)


@dataclass(frozen=True)
class SiaSimSettings:
    """Sia's simulator calibration, offered so that a run can be compared like for
    like with Sia's published figures; off by default (then every factor is 1 and
    restart delays are the simulator's own).

    Attributes:
        enabled: apply Sia's calibration.
        calibration: per-application slowdown (goodput is divided by it).
        restart_delay: per-application checkpoint-restore delay, seconds.
        default_restart_delay: delay of other applications, seconds.
    """

    enabled: bool = domain_field(False, Boolean())
    calibration: Mapping[str, float] = field(default_factory=lambda: dict(SIA_CALIBRATION))
    restart_delay: Mapping[str, float] = field(default_factory=lambda: dict(SIA_RESTART_DELAY))
    default_restart_delay: float = SIA_DEFAULT_RESTART_DELAY

    def __post_init__(self) -> None:
        check_fields(self, prefix="sia settings ")
        for what, table in (("calibration", self.calibration), ("restart_delay", self.restart_delay)):
            for app, v in table.items():
                check(f"sia settings {what}[{app!r}]", v, _POSITIVE)

    def goodput_factor(self, app: str) -> float:
        """``1 / slowdown`` of ``app`` when enabled (1 for unlisted applications), else 1."""
        return 1.0 / float(self.calibration.get(app, 1.0)) if self.enabled else 1.0

    def restart_delay_of(self, app: str, own: float) -> float:
        """Sia's restart delay of ``app`` in seconds when enabled, else ``own`` (the simulator's)."""
        return float(self.restart_delay.get(app, self.default_restart_delay)) if self.enabled else own


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
            (:func:`pollux_opt.agent.batch.choose_batch`); False: as configured.
        fixed_applications: applications whose jobs are not elastic (see
            :data:`PAPER_FIXED_APPLICATIONS`, the default; ``()``: none).
        weak_scaling: every job keeps its submitted per-replica batch, its
            total batch growing with its replicas (as the throughput-driven
            autoscaling of Or et al., MLSys 2020, trains), instead of choosing
            its batch by goodput; the policy sees jobs co-adapting as usual.
        sia: Sia's simulator calibration (:class:`SiaSimSettings`), off by default.
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
    weak_scaling: bool = domain_field(False, Boolean())
    sia: SiaSimSettings = field(default_factory=SiaSimSettings)

    def __post_init__(self) -> None:
        apps = self.fixed_applications
        if isinstance(apps, str) or not isinstance(apps, (tuple, list, frozenset, set)) or not all(
            isinstance(a, str) for a in apps
        ):
            raise InvalidProblem(f"fixed_applications must be a tuple of application names, got {apps!r}")
        object.__setattr__(self, "fixed_applications", tuple(apps))
        if not isinstance(self.sia, SiaSimSettings):
            raise InvalidProblem(f"sia must be a SiaSimSettings, got {self.sia!r}")
        check_fields(self)


def batch_limits(p: Profile) -> BatchLimits:
    """The batch limits of a job of profile ``p`` (those its goodput model uses; on
    a typed cluster, ``p`` is one type's profile and the limits are that type's)."""
    return BatchLimits(p.init_batch_size, p.max_batch_size, p.min_local_bsz, p.max_local_bsz)


def per_app(value: float | Mapping[str, float], application: str) -> float:
    """A setting given for every job or per application (0 for one not named)."""
    return float(value.get(application, 0.0)) if isinstance(value, Mapping) else float(value)


@dataclass(eq=False)
class SimJob:
    """Mutable state of one simulated job (internal to the backend)."""

    spec: WorkloadJob
    #: The truth on each node type of the cluster (types differ in step times and
    #: batch caps only); the same profile on every type for a plain profile.
    profiles: Mapping[str, Profile]
    #: (replicas, batch size) of a job that is not elastic (``SimConfig.fixed_applications``).
    pinned: tuple[int, int] | None = None
    placement: dict[str, int] = field(default_factory=dict)
    local_bsz: int = 0
    accum_steps: int = 0
    rescale_left: float = 0.0
    steps: float = 0.0  # optimizer steps trained
    epoch: int = 0
    progress: float = 0.0
    attained: float = 0.0
    restarts: int = 0
    started: bool = False
    submitted: bool = False
    completion_time: float | None = None
    agent: JobAgent | None = None  # what the job measured and its fitted model
    typed: TypedJobState | None = None  # per-type agents on a typed cluster
    last_goodput: float = 0.0
    last_throughput: float = 0.0

    @property
    def profile(self) -> Profile:
        """The first type's profile: the reference for statistics, progress, batch sizes and the oracle."""
        return next(iter(self.profiles.values()))

    @property
    def replicas(self) -> int:
        return sum(self.placement.values())

    @property
    def batch_size(self) -> int:
        return self.replicas * self.local_bsz * (self.accum_steps + 1)

    @property
    def submitted_config(self) -> tuple[int, int]:
        """(replicas, batch size) the job runs as submitted: ``pinned`` if fixed, else its workload row's."""
        return self.pinned if self.pinned is not None else (self.spec.replicas, self.spec.batch_size)

    def hard_max_replicas(self, cap: int) -> int:
        """Most replicas the job may take: bounded by ``cap`` and by its largest
        batch in smallest micro-batches; a job that is not elastic by its pinned replicas."""
        p = self.profile
        most = max(1, min(cap, p.max_batch_size // p.min_local_bsz))
        return most if self.pinned is None else min(most, max(1, self.pinned[0]))


def per_type_profiles(app: str, profile: Profile | Mapping[str, Profile], types: tuple[str, ...]) -> dict:
    """``{node type: truth}`` of one application on a cluster's ``types``: a
    per-type profile's ``{type: Profile}``, or one profile for every type.

    Raises:
        InvalidProblem: a per-type profile without one of ``types``.
    """
    if not isinstance(profile, Mapping):
        return {t: profile for t in types}
    missing = [t for t in types if t not in profile]
    if missing:
        raise InvalidProblem(f"profile of {app!r} has no node type {missing[0]!r} (its types: {list(profile)})")
    return {t: profile[t] for t in types}


def pooled_limits(profiles: Mapping[str, object]) -> BatchLimits:
    """The limits a type-blind scheduler can use on every type: the smallest local-batch cap."""
    first = next(iter(profiles.values()))
    cap = min(p.max_local_bsz for p in profiles.values())
    return BatchLimits(first.init_batch_size, first.max_batch_size, first.min_local_bsz, max(cap, first.min_local_bsz))


def mixed_step_sync(profiles: Mapping[str, object], types: tuple[str, ...], placement: tuple[int, ...],
                    local_bsz: int) -> tuple[float, float]:
    """(step, sync) seconds of ``placement`` over nodes of ``types``: the slowest type's
    (a data-parallel step waits for its slowest replica)."""
    return max((profiles[t].step_sync(placement, local_bsz) for t in dict.fromkeys(types)), key=lambda s: s[0])


@dataclass(eq=False)
class TypedJobState:
    """Per-type agents of one simulated job on a cluster of several node types
    (its truth: :attr:`SimJob.profiles`).  What the job reports:

    - on arrival, a one-replica profile on every type (Sia, SOSP 2023,
      "bootstrapping throughput models": each new job is profiled on one GPU of
      every type before it is scheduled; here the profiling costs no time);
    - while it runs, the step times of each configuration it runs, to the agent
      of the type it runs on, and its gradient statistics to every type's agent
      (statistical efficiency does not depend on the device).

    A type's goodput model (:meth:`models`) is its own fit once the job has run
    there (any measurement besides the arrival profile), before that a
    projection from another type (:func:`pollux_opt.model.projection.projection_plan`,
    the rule the real runtime's reports use too).
    """

    agents: dict[str, JobAgent]
    one_replica: dict[str, float] = field(default_factory=dict)
    _projected: dict[str, tuple[GoodputModel, float, GoodputModel]] = field(default_factory=dict)

    @classmethod
    def create(cls, profiles: Mapping[str, object], fit_cache: dict, name: str) -> "TypedJobState":
        agents = {t: JobAgent(batch_limits(p), refit_growth=REFIT_GROWTH, fit_cache=fit_cache, name=f"{name}@{t}")
                  for t, p in profiles.items()}
        return cls(agents)

    def profile_one_replica(self, profiles: Mapping[str, Profile]) -> None:
        """Sia's arrival profile: one replica of every type at the initial batch (within the type's cap)."""
        for t, p in profiles.items():
            m = max(min(p.init_batch_size, p.max_local_bsz), p.min_local_bsz)
            step, sync = p.step_sync((1,), m)
            self.agents[t].add_measurement(ConfigKey(1, 1, m, 0), step, min(sync, step))
            self.one_replica[t] = m / step

    def report(self, type_name: str | None, key: ConfigKey, step: float, sync: float) -> None:
        """A configuration's times, to the agent of the type it ran on (None: mixed types, kept by no type)."""
        if type_name is not None and key not in self.agents[type_name]:
            self.agents[type_name].add_measurement(key, step, sync)

    def update_stats(self, stats: tuple[float, float]) -> None:
        for agent in self.agents.values():
            agent.update_stats(stats)

    def models(self) -> dict[str, GoodputModel]:
        """The job's goodput model per type (own fit, or projected; see the class docstring)."""
        own = {t: agent.model() for t, agent in self.agents.items()}
        replicas = {t: a.measurements.num_replicas.tolist() for t, a in self.agents.items()}
        plan = projection_plan(tuple(self.agents), replicas, {t for t, m in own.items() if m is not None},
                               self.one_replica)
        return {t: own[t] if src == t else self._project(t, own[src], ratio) for t, (src, ratio) in plan.items()}

    def _project(self, t: str, source: GoodputModel, ratio: float) -> GoodputModel:
        """``source`` carried over to type ``t`` at ``ratio`` (cached while the source model stands)."""
        cached = self._projected.get(t)
        if cached is not None and cached[0] == source and cached[1] == ratio:
            return cached[2]
        model = GoodputModel(project_params(source.throughput_params, ratio), source.grad_stats,
                             self.agents[t].limits)
        self._projected[t] = (source, ratio, model)
        return model

    @property
    def most_replicas(self) -> int:
        return max(a.most_replicas for a in self.agents.values())


class Oracle:
    """True remaining work and step times from the hidden profiles, for Optimus+Oracle
    only (no other policy gets one).

    Args:
        jobs: the simulator's jobs by id (read live: each job's current epoch).
    """

    def __init__(self, jobs: Mapping[str, SimJob]) -> None:
        self._jobs = jobs

    def remaining_steps(self, job_id: str, batch_size: int) -> float:
        """Optimizer steps at a fixed ``batch_size`` from the current epoch to completion."""
        job = self._jobs[job_id]
        p = job.profile
        b = min(max(batch_size, p.init_batch_size), p.max_batch_size)
        return max(p.iterations(b, p.max_epochs) - p.iterations(b, job.epoch), 1.0)

    def step_time(self, job_id: str, placement: Sequence[int], batch_size: int) -> float:
        """True seconds per optimizer step of ``batch_size`` on ``placement`` (replicas per node)."""
        p = self._jobs[job_id].profile
        local, accum = split_batch(batch_size, sum(placement), batch_limits(p))
        step, sync = p.step_sync(tuple(placement), local)
        return step + accum * (step - sync)

    def max_local_bsz(self, job_id: str) -> int:
        return self._jobs[job_id].profile.max_local_bsz

    def min_local_bsz(self, job_id: str) -> int:
        return self._jobs[job_id].profile.min_local_bsz
