"""Scheduling: one loop and one policy interface for every backend.

:func:`run_loop` (:mod:`~pollux_opt.scheduling.loop`) drives a
:class:`Backend` (real processes on this machine, a simulator, ...) with a
:class:`Policy`: every interval it reads the backend's :class:`JobView` s,
asks the policy for a :class:`Decision` (timing it) and applies it, and logs
everything to one event log.  :mod:`~pollux_opt.scheduling.policies` holds the
one registry of policies (``POLICIES``, :func:`make_policy`).
"""

from pollux_opt.scheduling.loop import Backend, Decision, DecisionStatus, JobView, Policy
from pollux_opt.scheduling.loop import run as run_loop
from pollux_opt.scheduling.policies import POLICIES, make_policy, policy_names, registered_policies

__all__ = [
    "POLICIES",
    "Backend",
    "Decision",
    "DecisionStatus",
    "JobView",
    "Policy",
    "make_policy",
    "policy_names",
    "registered_policies",
    "run_loop",
]
