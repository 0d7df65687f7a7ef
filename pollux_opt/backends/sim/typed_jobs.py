"""A simulated job on a cluster of several node types: its per-type truth and per-type models.

The truth is one :class:`~pollux_opt.backends.sim.traces.Profile` per type
(:class:`~pollux_opt.backends.sim.typed_profiles.TypedProfile`: per-type step
times and batch caps over shared gradient statistics).  What the job reports:

- on arrival, a one-replica profile on every type (Sia, SOSP 2023,
  "bootstrapping throughput models": each new job is profiled on one GPU of
  every type before it is scheduled; here the profiling costs no time);
- while it runs, the step times of each configuration it runs, to the agent
  of the type it runs on, and its gradient statistics to every type's agent
  (statistical efficiency does not depend on the device).

A type's goodput model (:meth:`TypedJobState.models`) is its own fit once the
job has run there (any measurement besides the arrival profile: the first
measurement on a type replaces the projection, and the fit's optimistic
priors let the scheduler explore there as on any type); before that, the
model of the type measured at the most replica counts beyond one
(:func:`pollux_opt.model.hetero.projection_source`) with every time scaled by
the one-replica speed ratio (:func:`pollux_opt.model.hetero.project_params`);
with no such type, its own fit of the one-replica profile.

A placement over nodes of several types (only a heterogeneity-unaware
policy makes one) runs at the pace of its slowest type (:func:`mixed_step_sync`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from solvers import InvalidProblem

from pollux_opt.backends.sim.typed_profiles import TypedProfile
from pollux_opt.model import BatchLimits, GoodputModel
from pollux_opt.model.hetero import project_params, projection_plan
from pollux_opt.agent.agent import REFIT_GROWTH, JobAgent
from pollux_opt.agent.measurements import ConfigKey

__all__ = ["TypedJobState", "mixed_step_sync", "per_type_profiles", "pooled_limits", "type_limits"]


def per_type_profiles(app: str, profile, types: tuple[str, ...]) -> dict[str, object]:
    """``{node type: truth}`` of one application on a cluster's ``types``: a
    :class:`~pollux_opt.backends.sim.typed_profiles.TypedProfile`'s per-type
    profiles, or one profile for every type.

    Raises:
        InvalidProblem: a typed profile without one of ``types``.
    """
    if not isinstance(profile, TypedProfile):
        return {t: profile for t in types}
    missing = [t for t in types if t not in profile.by_type]
    if missing:
        raise InvalidProblem(f"profile of {app!r} has no node type {missing[0]!r} (its types: {list(profile.types)})")
    return {t: profile[t] for t in types}


def type_limits(profile) -> BatchLimits:
    """The batch limits of a job of ``profile`` on one type (that type's local-batch cap)."""
    return BatchLimits(profile.init_batch_size, profile.max_batch_size, profile.min_local_bsz, profile.max_local_bsz)


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
    """Per-type truth and agents of one simulated job (internal to the simulator)."""

    profiles: Mapping[str, object]
    agents: dict[str, JobAgent]
    one_replica: dict[str, float] = field(default_factory=dict)
    _projected: dict[str, tuple[GoodputModel, float, GoodputModel]] = field(default_factory=dict)

    @classmethod
    def create(cls, profiles: Mapping[str, object], fit_cache: dict, name: str) -> "TypedJobState":
        agents = {t: JobAgent(type_limits(p), refit_growth=REFIT_GROWTH, fit_cache=fit_cache, name=f"{name}@{t}")
                  for t, p in profiles.items()}
        return cls(dict(profiles), agents)

    def profile_one_replica(self) -> None:
        """Sia's arrival profile: one replica of every type at the initial batch (within the type's cap)."""
        for t, p in self.profiles.items():
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
        """The job's goodput model per type (own fit, or projected; see the module
        docstring): :func:`pollux_opt.model.hetero.projection_plan`, the rule the
        real runtime's reports use too."""
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
