"""The phase of an elastic job: one enum, a declared table of the allowed
transitions, and what the supervisor does once the current transition ends.

:class:`Phase` refines the public :class:`~pollux_opt.runtime.report.JobState`
(``Phase.state``): the state ``rescaling`` is two phases, ``launching`` (a new
generation of workers is forming and loading the checkpoint) and ``pausing``
(the current generation finishes its step, checkpoints and leaves).  A job
holds workers exactly in the phases whose ``has_workers`` is true.

:data:`TRANSITIONS` lists, per phase, the phases the supervisor may move to;
:func:`check_transition` refuses any other move with :class:`IllegalTransition`
(a bug in the supervisor, never bad input).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pollux_opt.runtime.allocation import WorkerAllocation
from pollux_opt.runtime.report import JobState

__all__ = ["TRANSITIONS", "FollowUp", "IllegalTransition", "Phase", "check_transition"]


class Phase(str, enum.Enum):
    """Where a job is in its life cycle (see the module docstring).

    ``pending``: created, never started.  ``launching``: workers of a new
    generation are forming, building and loading.  ``running``: workers are
    training.  ``pausing``: workers are finishing their step, checkpointing and
    leaving.  ``verifying``: target reached, the final checkpoint is
    re-evaluated in a fresh process.  ``stopped``: checkpointed, holding no
    workers.  ``completed``: the verified final metric reached the target.
    ``failed``: job code raised, or faults exceeded the restart limit.
    """

    PENDING = "pending"
    LAUNCHING = "launching"
    RUNNING = "running"
    PAUSING = "pausing"
    VERIFYING = "verifying"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def state(self) -> JobState:
        """The public state this phase shows as."""
        return _STATE[self]

    @property
    def has_workers(self) -> bool:
        """True while a generation of workers exists (forming, training or leaving)."""
        return self in (Phase.LAUNCHING, Phase.RUNNING, Phase.PAUSING)

    @property
    def terminal(self) -> bool:
        return not TRANSITIONS[self]

    @classmethod
    def restored(cls, state: JobState) -> "Phase":
        """The phase of a job re-opened from its work directory in ``state``: one
        that was running went away with its previous controller and is stopped
        (the controller makes it ``verifying`` instead when its newest checkpoint
        is an unchecked final one)."""
        if state in (JobState.RUNNING, JobState.RESCALING, JobState.VERIFYING):
            return cls.STOPPED
        return cls(state.value)


_STATE = {
    Phase.PENDING: JobState.PENDING,
    Phase.LAUNCHING: JobState.RESCALING,
    Phase.RUNNING: JobState.RUNNING,
    Phase.PAUSING: JobState.RESCALING,
    Phase.VERIFYING: JobState.VERIFYING,
    Phase.STOPPED: JobState.STOPPED,
    Phase.COMPLETED: JobState.COMPLETED,
    Phase.FAILED: JobState.FAILED,
}

#: phase -> the phases the supervisor may move to from it.  Every live phase
#: may fail; LAUNCHING may re-launch (a worker lost while forming); RUNNING
#: and PAUSING may re-launch (a fault, a rescale, or a final checkpoint
#: missing at the target), verify (the target was reached) or stop (a request
#: or the step limit); VERIFYING may re-launch when the target is not confirmed.
#: A launch that finds an unchecked final checkpoint verifies it instead, so
#: PENDING, STOPPED and LAUNCHING may verify too.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PENDING: frozenset({Phase.LAUNCHING, Phase.VERIFYING, Phase.STOPPED, Phase.FAILED}),
    Phase.LAUNCHING: frozenset({Phase.RUNNING, Phase.LAUNCHING, Phase.VERIFYING, Phase.FAILED}),
    Phase.RUNNING: frozenset({Phase.PAUSING, Phase.LAUNCHING, Phase.VERIFYING, Phase.STOPPED, Phase.FAILED}),
    Phase.PAUSING: frozenset({Phase.LAUNCHING, Phase.VERIFYING, Phase.STOPPED, Phase.FAILED}),
    Phase.VERIFYING: frozenset({Phase.COMPLETED, Phase.LAUNCHING, Phase.STOPPED, Phase.FAILED}),
    Phase.STOPPED: frozenset({Phase.LAUNCHING, Phase.VERIFYING, Phase.FAILED}),
    Phase.COMPLETED: frozenset(),
    Phase.FAILED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """The supervisor tried a phase transition that :data:`TRANSITIONS` does not allow."""


def check_transition(job_id: str, old: Phase, new: Phase) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is in :data:`TRANSITIONS`."""
    if new not in TRANSITIONS[old]:
        allowed = ", ".join(sorted(p.value for p in TRANSITIONS[old])) or "none"
        raise IllegalTransition(
            f"internal error: job {job_id!r} cannot move from phase {old.value!r} to {new.value!r} "
            f"(allowed: {allowed})"
        )


@dataclass(frozen=True)
class FollowUp:
    """What the supervisor does once the current transition (launching, pausing
    or verifying) ends: launch ``alloc``, or stop when ``alloc`` is None.

    ``t0`` is when the oldest request it serves was made (``time.monotonic``
    seconds): a rescale time counts from then.
    """

    alloc: WorkerAllocation | None
    t0: float

    @property
    def stop(self) -> bool:
        return self.alloc is None
