"""The scheduling policies and their one registry.

Each policy maps the active jobs' :class:`~pollux_opt.scheduling.loop.JobView` s
to a :class:`~pollux_opt.scheduling.loop.Decision`; none of them touches a job,
so the real executor and the simulator run them unchanged.  :data:`POLICIES`
lists every policy with a short description and what it needs from its backend
beyond the views (:class:`Requirement`): Optimus+Oracle needs the simulator's
step oracle, so only the simulator can run it.

Adding a policy is one small class with a ``name``, a ``fixed_batch`` flag
(do its jobs train at their submitted batch size, or choose their own?) and a
``decide`` method, and one :class:`PolicyInfo` line here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from solvers import InvalidProblem

from pollux_opt.scheduling.loop import Policy
from pollux_opt.scheduling.policies.fair_jct import FairJctOraclePolicy, FairJctPolicy
from pollux_opt.scheduling.policies.fixed import FixedPolicy
from pollux_opt.scheduling.policies.goodput import DynamicPolicy, PolluxPolicy, PolluxUnawarePolicy
from pollux_opt.scheduling.policies.optimus import OptimusPolicy, StepOracle
from pollux_opt.scheduling.policies.sia import SiaPolicy
from pollux_opt.scheduling.policies.tiresias import TiresiasPolicy

__all__ = [
    "POLICIES",
    "DynamicPolicy",
    "FairJctOraclePolicy",
    "FairJctPolicy",
    "FixedPolicy",
    "OptimusPolicy",
    "PolicyInfo",
    "PolluxPolicy",
    "PolluxUnawarePolicy",
    "Requirement",
    "SiaPolicy",
    "StepOracle",
    "TiresiasPolicy",
    "make_policy",
    "policy_names",
    "registered_policies",
]


class Requirement(str, enum.Enum):
    """What a policy needs from its backend beyond the job views; the value is
    the keyword argument the policy takes it as."""

    #: A :class:`StepOracle`: each job's true remaining steps and step times.
    ORACLE = "oracle"


#: Why each requirement limits where a policy runs (the text of the error a
#: backend without it gets).
REQUIREMENT_REASONS: Mapping[Requirement, str] = MappingProxyType({
    Requirement.ORACLE: "the simulator's step oracle (each job's true remaining steps and step times, "
                        "which a run of real jobs cannot know): run it with `pollux-opt simulate`",
})


@dataclass(frozen=True)
class PolicyInfo:
    """One registered policy.

    Attributes:
        name: the registry name (the policy's ``name``).
        factory: builds the policy from keyword options (a dataclass).
        description: one line for listings.
        needs: what the backend must provide (see :class:`Requirement`).
    """

    name: str
    factory: Callable[..., Policy]
    description: str
    needs: tuple[Requirement, ...] = ()


#: The registered policies, name -> :class:`PolicyInfo`, in listing order.
POLICIES: Mapping[str, PolicyInfo] = MappingProxyType({
    info.name: info for info in (
        PolicyInfo("fixed", FixedPolicy,
                   "each job's submitted CPUs and batch size, first-in first-out gang scheduling"),
        PolicyInfo("dynamic", DynamicPolicy,
                   "throughput-only elastic allocation at each job's submitted batch size"),
        PolicyInfo("pollux", PolluxPolicy,
                   "goodput-optimal allocation and batch sizes (Pollux, OSDI 2021); "
                   "heterogeneity-aware on clusters of several node types"),
        PolicyInfo("pollux-unaware", PolluxUnawarePolicy,
                   "Pollux that sees every node as one type (Sia's baseline on heterogeneous clusters)"),
        PolicyInfo("sia", SiaPolicy,
                   "heterogeneity-aware goodput-optimised allocation over Sia's configurations "
                   "(Sia, SOSP 2023)"),
        PolicyInfo("fair-jct", FairJctPolicy,
                   "goodput allocation for mean JCT: flow-time weights of the jobs' speedup curves in the "
                   "order of their estimated remaining time (heSRPT, SmartFill), under a finish-time fairness "
                   "bound"),
        PolicyInfo("tiresias", TiresiasPolicy,
                   "discretized 2D least-attained-service with the submitted configuration (Tiresias, NSDI 2019)"),
        PolicyInfo("optimus", OptimusPolicy,
                   "Optimus+Oracle: greedy marginal-gain allocation with true remaining work and step times "
                   "(Optimus, EuroSys 2018)", needs=(Requirement.ORACLE,)),
        PolicyInfo("fair-jct-oracle", FairJctOraclePolicy,
                   "fair-jct told the true remaining work: an upper bound for its estimator, "
                   "simulation only", needs=(Requirement.ORACLE,)),
    )
})


def registered_policies() -> dict[str, PolicyInfo]:
    """Every registered policy, name -> :class:`PolicyInfo`, in listing order."""
    return dict(POLICIES)


def policy_names(provides: Iterable[Requirement] = ()) -> tuple[str, ...]:
    """Names of the policies a backend providing ``provides`` can run (listing
    order); with nothing provided, those that run on real jobs."""
    have = set(provides)
    return tuple(name for name, info in POLICIES.items() if set(info.needs) <= have)


def _info(name: str) -> PolicyInfo:
    if name not in POLICIES:
        raise InvalidProblem(f"unknown policy {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[name]


def make_policy(name: str, *, provides: Mapping[Requirement, Any] | None = None, **options: Any) -> Policy:
    """A new instance of the registered policy ``name``.

    Args:
        name: a key of :data:`POLICIES`.
        provides: what the backend offers beyond the views (e.g. the simulator's
            oracle); each policy gets only what it needs, as the keyword of its requirement.
        **options: the policy's own options (its dataclass fields).

    Raises:
        InvalidProblem: an unknown name or option, or a requirement not provided
            (naming why the policy needs it).
    """
    info = _info(name)
    known = {f.name for f in fields(info.factory) if f.init and not f.name.startswith("_")}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InvalidProblem(f"policy {name!r} has no option(s) {unknown}; its options are {sorted(known)}")
    kwargs = dict(options)
    for need in info.needs:
        if need.value in kwargs:
            continue
        if provides is None or need not in provides:
            raise InvalidProblem(f"policy {name!r} needs {REQUIREMENT_REASONS[need]}")
        kwargs[need.value] = provides[need]
    return info.factory(**kwargs)
