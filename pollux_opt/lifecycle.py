"""The life cycle of a training job: its states (:class:`JobState`), the one
table of their legal changes (:data:`TRANSITIONS`) and the record of one job's
changes (:class:`Lifecycle`).

Every layer speaks this one vocabulary: the runtime's supervisor moves a job
through it, the local, Ray and simulated backends report it, a policy sees it
(``JobView.state``), and the records read it from the event log.  It imports
no torch.

A job is ``queued`` until it holds workers (never started, or stopped with a
checkpoint and no workers), ``rescaling`` while a generation of workers forms
or the old one checkpoints and leaves, ``running`` while its workers train,
and ends ``succeeded``, ``failed`` or ``cancelled``; an ended job never
changes again.  Re-checking the final checkpoint in a fresh process (a job
that reached its target) is part of ``running``, holding no CPUs
(:attr:`Lifecycle.verifying`).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

__all__ = ["TRANSITIONS", "IllegalTransition", "JobState", "Lifecycle", "Transition", "check_transition"]


class JobState(str, enum.Enum):
    """Where a job is in its life cycle (the string values are what files and services show)."""

    #: Holding no workers: never started, or stopped with a checkpoint; resumes when started.
    QUEUED = "queued"
    #: Workers are training (or, holding no CPUs, the final checkpoint is re-checked).
    RUNNING = "running"
    #: Workers are checkpointing and leaving, or a new generation is forming and loading.
    RESCALING = "rescaling"
    #: The final metric, re-evaluated in a fresh process, reached the target.
    SUCCEEDED = "succeeded"
    #: Job code raised, or faults exceeded the restart limit.
    FAILED = "failed"
    #: Checkpointed and stopped for good on request.
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """An ended job: it holds nothing and never changes again."""
        return not TRANSITIONS[self]

    @property
    def holds_workers(self) -> bool:
        """A generation of workers exists (forming, training or leaving)."""
        return self in (JobState.RUNNING, JobState.RESCALING)


#: state -> the states a job may move to from it.  Every live state may fail
#: or be cancelled.  A start launches (``rescaling``), or verifies at once
#: (``running``) when the newest checkpoint is an unchecked final one.
#: ``rescaling`` re-launches (a worker lost while forming, a rescale asked for
#: while pausing), trains, or stops (``queued``).  ``running`` rescales (a
#: rescale, a fault, a failed verification), starts verifying (``running``),
#: stops (a request, the step limit, a failed verification that waits for the
#: scheduler) or succeeds (verified).
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = MappingProxyType({
    JobState.QUEUED: frozenset({JobState.RESCALING, JobState.RUNNING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RESCALING: frozenset({JobState.RESCALING, JobState.RUNNING, JobState.QUEUED, JobState.FAILED,
                                   JobState.CANCELLED}),
    JobState.RUNNING: frozenset({JobState.RUNNING, JobState.RESCALING, JobState.QUEUED, JobState.SUCCEEDED,
                                 JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
})


class IllegalTransition(RuntimeError):
    """A move :data:`TRANSITIONS` does not allow (a bug in the mover, never bad input)."""


def check_transition(job_id: str, old: JobState, new: JobState) -> None:
    """Raise :class:`IllegalTransition` unless ``old -> new`` is in :data:`TRANSITIONS`."""
    if new not in TRANSITIONS[old]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[old])) or "none"
        raise IllegalTransition(
            f"internal error: job {job_id!r} cannot move from {old.value!r} to {new.value!r} (allowed: {allowed})"
        )


@dataclass(frozen=True)
class Transition:
    """One recorded move: at ``time`` (Unix seconds) from ``old`` to ``new``,
    because of ``reason``; ``verifying``: the job checks its final checkpoint from then on."""

    time: float
    old: JobState
    new: JobState
    reason: str
    verifying: bool = False


class Lifecycle:
    """The state of one job and every move it made (not thread-safe: its owner locks).

    Args:
        job_id: the job, for error messages.
        state: the state it starts in (a job re-opened from disk: its saved one).
        clock: Unix seconds (tests inject a fake).

    Attributes:
        state: the current :class:`JobState`.
        verifying: the final checkpoint is being re-checked in a fresh process
            (state ``running``; the job holds no CPUs meanwhile).
        history: every :class:`Transition`, oldest first.
    """

    def __init__(self, job_id: str, state: JobState = JobState.QUEUED,
                 clock: Callable[[], float] = time.time) -> None:
        self.job_id, self.state, self._clock = job_id, JobState(state), clock
        self.verifying = False
        self.history: list[Transition] = []

    @property
    def holds_cpus(self) -> bool:
        """The job occupies CPUs: it has workers, and is not only verifying."""
        return self.state.holds_workers and not self.verifying

    def move(self, new: JobState, reason: str, *, verifying: bool = False) -> Transition:
        """Move to ``new`` (``verifying``: to verify the final checkpoint, only
        as ``running``) and record why; raises :class:`IllegalTransition` for a
        move the table does not allow, leaving the state as it was."""
        check_transition(self.job_id, self.state, new)
        if verifying and new is not JobState.RUNNING:
            raise IllegalTransition(
                f"internal error: job {self.job_id!r} can verify only as 'running', not {new.value!r}")
        step = Transition(self._clock(), self.state, new, reason, verifying)
        self.state, self.verifying = new, verifying
        self.history.append(step)
        return step
