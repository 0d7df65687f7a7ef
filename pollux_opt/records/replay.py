"""Replay of the event log: what it says about each job, event by event.

:func:`replay` folds a run's events (see :mod:`pollux_opt.records.events` for
their semantics) into one :class:`JobTrack` per job: when it was submitted and
ended, how it ended, the placement (and pinned CPUs) it holds, its restarts,
the CPU-seconds it has held and the replica count over time, its latest metric
and checkpoint, and the fields of its ``submit`` and ``complete`` events.

The metrics (:mod:`pollux_opt.records.metrics`) read their per-job numbers
from it, and the real backend rebuilds a resumed run's job state from it
(its per-job state extends :class:`JobTrack`), so both read the log the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, MutableMapping, TypeVar

from pollux_opt.lifecycle import JobState
from pollux_opt.records.events import PLACEMENT_EVENTS

__all__ = ["JobTrack", "clean_placement", "replay", "time_ordered"]

#: Placement events that count as a restart when they leave the job holding CPUs
#: (a stop, a move to ``{}``, is not one; the resume after it is).
RESTART_EVENTS = frozenset({"rescale_begin", "restart_after_fault"})


def clean_placement(placement: Mapping[str, int] | None) -> dict[str, int]:
    """``{node id: replicas}`` with string ids, integer counts and no empty nodes."""
    return {str(n): int(k) for n, k in (placement or {}).items() if int(k) > 0}


@dataclass(kw_only=True)
class JobTrack:
    """One job as its events describe it (times in seconds since the run's start).

    Attributes:
        id: the job's id.
        submit: time of its first ``submit`` event (nan before it).
        end: time of its ``complete``, ``failed`` or ``cancelled`` event (nan before it).
        state: its :class:`~pollux_opt.lifecycle.JobState` as its events tell
            it: ``queued`` while it holds no CPUs, ``rescaling`` from a move
            onto CPUs until its end, ``running`` while it trains (or while its
            final checkpoint is re-checked), the runtime's own state from each
            ``state`` event, and
            ``succeeded``, ``failed`` or ``cancelled`` on its ``complete``,
            ``failed`` or ``cancelled`` event.
        weight: its priority (its ``submit`` event's, then each ``weight`` event's).
        cancelling: a ``cancel`` event asked it to checkpoint and end (it holds nothing from then on).
        state_time: ``at`` of its newest ``state`` event: the Unix time of the
            newest runtime state change translated into the log (-inf before one).
        verified, final_metric,
            ``progress`` (M0-equivalent iterations), ``model`` (goodput-model
            JSON), ``startup_s``, ``verify_s`` (seconds, 0 if not recorded):
            fields of its ``complete`` event.
        submitted_replicas, submitted_batch_size, max_replicas: fields of its ``submit`` event.
        started: a placement event has been seen.
        placement: ``{node id: replicas}`` it holds now; ``cpus``: the CPUs
            those replicas are pinned to (real runs; None if not pinned).
        restarts: placement events in :data:`RESTART_EVENTS` with a non-empty placement.
        held_since: time the CPU-seconds were last brought up to date.
        cpu_seconds: replicas held x seconds, up to ``held_since``.
        replicas: ``(time, replicas held from then on)``, one entry per change.
        target_t: time its ``validation`` with ``target_reached`` (nan before it).
        last_metric: ``value`` of its latest ``validation`` event.
        last_ckpt_step: newest ``checkpoint`` step (-1 before one).
        src_time: newest ``src_time`` of its events: the Unix time of the newest
            runtime event translated into the log (real runs; -inf before one).
        durations: the ``duration_s`` of its events (measured rescale and
            restart times, seconds), in log order.
    """

    id: str
    submit: float = math.nan
    end: float = math.nan
    state: JobState = JobState.QUEUED
    weight: float = 1.0
    cancelling: bool = False
    state_time: float = -math.inf
    verified: bool = False
    final_metric: float | None = None
    progress: float = math.nan
    model: dict | None = None
    startup_s: float = 0.0
    verify_s: float = 0.0
    submitted_replicas: int | None = None
    submitted_batch_size: int | None = None
    max_replicas: int | None = None
    started: bool = False
    placement: dict[str, int] = field(default_factory=dict)
    cpus: tuple[int, ...] | None = None
    restarts: int = 0
    held_since: float = 0.0
    cpu_seconds: float = 0.0
    replicas: list[tuple[float, int]] = field(default_factory=list)
    target_t: float = math.nan
    last_metric: float | None = None
    last_ckpt_step: int = -1
    src_time: float = -math.inf
    durations: list[float] = field(default_factory=list)

    @property
    def submitted(self) -> bool:
        return not math.isnan(self.submit)

    @property
    def completed(self) -> bool:
        return self.state is JobState.SUCCEEDED

    @property
    def failed(self) -> bool:
        return self.state is JobState.FAILED

    @property
    def cancelled(self) -> bool:
        return self.state is JobState.CANCELLED

    @property
    def finished(self) -> bool:
        """Ended: it holds nothing and never will again."""
        return self.state.terminal

    @property
    def held(self) -> int:
        """Replicas (CPUs) it holds now."""
        return sum(self.placement.values())

    def account(self, t: float) -> None:
        """Bring ``cpu_seconds`` up to time ``t`` (the placement held since ``held_since``)."""
        self.cpu_seconds += self.held * max(t - self.held_since, 0.0)
        self.held_since = t

    def hold(self, t: float, placement: Mapping[str, int] | None, cpus=None) -> None:
        """From time ``t`` on, hold ``placement`` (pinned to ``cpus``; ``{}``: nothing)."""
        self.account(t)
        self.placement = clean_placement(placement)
        self.cpus = tuple(cpus) if cpus else None
        self.replicas.append((t, self.held))

    def submit_at(self, t: float) -> None:
        """The job arrived at time ``t`` (holding nothing)."""
        self.submit = self.held_since = t
        self.replicas.append((t, 0))

    def apply(self, event: Mapping) -> None:
        """Fold one of the job's events into the track."""
        t, etype = float(event["t"]), event["type"]
        if etype == "submit":
            if not self.submitted:
                self.submit_at(t)
                self.submitted_replicas = event.get("submitted_replicas")
                self.submitted_batch_size = event.get("submitted_batch_size")
                self.max_replicas = event.get("max_replicas")
                self.weight = float(event.get("weight") or 1.0)
        elif etype == "weight":
            self.weight = float(event["weight"])
        elif etype == "cancel":
            self.cancelling = True
            self.hold(t, {})
        elif etype == "state":
            self.state_time = max(self.state_time, float(event.get("at") or -math.inf))
            if not self.finished:
                self.state = JobState(event["state"])
        elif etype in PLACEMENT_EVENTS:
            self.hold(t, event.get("placement"), event.get("cpus"))
            # Ordered onto CPUs, its workers form (rescaling) until a move's end says they train.
            moving = JobState.RUNNING if etype == "rescale_end" else JobState.RESCALING
            self.state = moving if self.held else JobState.QUEUED
            self.started = True
            if etype in RESTART_EVENTS and self.held:
                self.restarts += 1
        elif etype == "validation":
            self.last_metric = event.get("value")
            if event.get("target_reached"):
                self.hold(t, {})
                self.target_t = t
        elif etype == "checkpoint" and event.get("step") is not None:
            self.last_ckpt_step = max(self.last_ckpt_step, int(event["step"]))
        elif etype in ("complete", "failed", "cancelled"):
            self.hold(t, {})
            self.end = t
            if etype == "complete":
                self._complete(event)
            else:
                self.state = JobState.FAILED if etype == "failed" else JobState.CANCELLED
        if event.get("src_time") is not None:
            self.src_time = max(self.src_time, float(event["src_time"]))
        if event.get("duration_s") is not None:
            self.durations.append(float(event["duration_s"]))

    def _complete(self, event: Mapping) -> None:
        self.state = JobState.SUCCEEDED
        self.verified = bool(event.get("verified"))
        self.final_metric = event.get("value")
        self.model = event.get("model")
        progress, startup, verify = (event.get(k) for k in ("progress", "startup_s", "verify_s"))
        self.progress = math.nan if progress is None else float(progress)
        self.startup_s = 0.0 if startup is None else float(startup)
        self.verify_s = 0.0 if verify is None else float(verify)


T = TypeVar("T", bound=JobTrack)


def time_ordered(events: Iterable[Mapping]) -> list:
    """``events`` sorted by their time ``t`` (s); stable, so events with equal times keep their log order."""
    return sorted(events, key=lambda e: float(e["t"]))


def replay(events: Iterable[Mapping], tracks: MutableMapping[str, T] | None = None) -> MutableMapping[str, T]:
    """Fold ``events`` (in the order given) into per-job tracks.

    Args:
        events: the run's events (cluster events, ``job_id`` null, are skipped).
        tracks: job id -> track to fold into (only these jobs' events are
            read); None: a new :class:`JobTrack` for every job id in the log.

    Returns:
        ``tracks`` (or the new dict), job id -> track.
    """
    known = tracks is not None
    out: MutableMapping = tracks if known else {}
    for e in events:
        jid = e.get("job_id")
        if jid is None:
            continue
        track = out.get(jid)
        if track is None:
            if known:
                continue
            track = out[jid] = JobTrack(id=jid)
        track.apply(e)
    return out
