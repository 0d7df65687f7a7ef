"""The unified event log: append-only JSONL, one fsynced line per event.

One schema serves real runs and the simulator, and :mod:`pollux_opt.records.metrics`
reads nothing else.  Every event is a JSON object with at least

    t        float, seconds since run start (wall clock or simulated)
    job_id   str, or null for cluster events (``run_start``, ``allocation``)
    type     one of :data:`EVENT_TYPES`

plus type-specific fields: the required ones are in :data:`EVENT_FIELDS`,
optional ones are listed below.  Placements are ``{node id: replicas}``.

Semantics the metrics rely on (a backend must follow them):

* CPUs held: each event in :data:`PLACEMENT_EVENTS` sets the job's held
  placement to its ``placement`` field (a ``start`` when the job is first
  started; ``rescale_begin`` when a move is ordered, including a stop, which
  moves to ``{}``, and a resume from ``{}``; ``rescale_end`` when it is done;
  ``restart_after_fault`` when the job re-forms after a fault).  A
  ``validation`` with ``target_reached: true``, ``cancel``, ``complete``,
  ``failed`` and ``cancelled`` release everything.
* Restarts: each ``rescale_begin`` and ``restart_after_fault`` with a
  non-empty placement is one restart (a stop is not; the resume after it is).
* Goodput: any job event may carry ``progress`` (M0-equivalent iterations
  done so far); the metrics take a job's goodput from the progress of its
  consecutive events (``report`` must carry it; ``checkpoint``, ``validation``
  and ``complete`` should).  ``report`` events also carry ``goodput``
  (measured, M0-equivalent samples per second) and ``goodput_base`` (the
  job's modelled goodput on one replica at M0) for reading the log.
* Completion: ``complete`` carries ``verified`` (the final metric was
  reproduced in a fresh process), ``value`` (that metric), ``progress``
  (M0-equivalent iterations done), ``model`` (see
  :func:`goodput_model_to_json`) and optionally ``startup_s`` and ``verify_s``
  (seconds the job spent starting and verifying), which the isolated-JCT
  estimate adds to its training time.
* ``submit`` carries the user's ``submitted_replicas``,
  ``submitted_batch_size`` and optionally ``max_replicas``.
* ``allocation`` carries ``objective``, ``solver_s`` (policy's wall time),
  ``overhead_s`` (the round's scheduler wall time outside the jobs' work) and
  ``interval_s``; ``run_start`` carries ``policy`` and ``cluster_cpus``.
* ``run_stop``: the scheduler stopped before every job had finished (a signal;
  ``reason`` names it), after checkpointing and stopping the jobs listed in
  ``stopped`` (resumable); the next ``run_start`` of the log resumes the run.

A scheduler killed in the middle of a write leaves at most one torn last
line; :func:`read_events` skips it (with a warning), and :class:`EventLog`
truncates it before appending again, so a resumed run keeps one consistent
history.  A line anywhere else that is not a JSON object (the file was
damaged or edited) makes the reader refuse the log, naming the file and line;
:func:`repair_log` (``pollux-opt run --repair-log``) moves such lines into
``<log>.rejected`` and keeps every readable event, in order.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from solvers import InvalidProblem

from pollux_opt.model.domains import Choice, Real, check
from pollux_opt.records.files import atomic_write_text, drop_torn_line

__all__ = [
    "EVENT_TYPES",
    "EVENT_FIELDS",
    "PLACEMENT_EVENTS",
    "EventLog",
    "NullLog",
    "read_events",
    "iter_events",
    "repair_log",
    "goodput_model_to_json",
    "goodput_model_from_json",
    "jsonable",
]

log = logging.getLogger(__name__)

#: Event types, in the order of a job's life.
EVENT_TYPES = (
    "run_start",        # cluster: the scheduler (re)started; fields: policy, resumed
    "run_stop",         # cluster: the scheduler stopped early, jobs checkpointed; fields: reason, stopped
    "nodes",            # cluster: nodes joined or left (Ray backend); fields: cluster, joined, left
    "scale",            # cluster: autoscaled nodes requested, up or released; fields: requested, ready, released, sizes
    "submit",           # job arrived; fields: submitted_replicas, submitted_batch_size, workload
    "start",            # job's first start; fields: placement (cpus, gpus: each replica's, where held)
    "allocation",       # cluster: a decision; fields: placement, objective, solver_s, overhead_s, status
    "rescale_begin",    # fields: old_placement, placement
    "rescale_end",      # fields: placement, duration_s
    "checkpoint",       # fields: step, progress
    "restart_after_fault",  # fields: placement, reason
    "report",           # fields: throughput, goodput, batch_size, noise_scale, progress, replicas
    "validation",       # fields: metric, value, step
    "complete",         # fields: metric, value, verified
    "failed",           # fields: reason
    "state",            # the runtime's job moved; fields: state, old, reason, at (Unix time of the move)
    "weight",           # a client set the job's priority; fields: weight, request
    "cancel",           # a client asked to cancel the job (its CPUs are freed); fields: reason, request
    "cancelled",        # the job checkpointed and ended on request (or its grace period ran out); fields: reason
)

#: Fields each event type must carry besides t, job_id and type.
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "run_start": ("policy",),
    "run_stop": ("reason",),
    "nodes": ("cluster", "joined", "left"),
    "scale": ("requested", "ready", "released", "sizes"),
    "submit": ("submitted_replicas", "submitted_batch_size"),
    "start": ("placement",),
    "allocation": ("placement", "objective", "solver_s"),
    "rescale_begin": ("placement",),
    "rescale_end": ("placement", "duration_s"),
    "checkpoint": (),
    "restart_after_fault": ("placement",),
    "report": ("throughput", "goodput", "progress", "replicas"),
    "validation": ("value",),
    "complete": ("verified",),
    "failed": ("reason",),
    "state": ("state", "old", "reason"),
    "weight": ("weight",),
    "cancel": ("reason",),
    "cancelled": ("reason",),
}

#: Events that set the job's held placement to their ``placement`` field.
PLACEMENT_EVENTS = frozenset({"start", "rescale_begin", "rescale_end", "restart_after_fault"})

#: Event types that are about the whole cluster (job_id null).
CLUSTER_EVENTS = frozenset({"run_start", "run_stop", "nodes", "scale", "allocation"})
#: An event's ``type`` and its time ``t`` (seconds since the run started).
_EVENT_TYPE = Choice(EVENT_TYPES)
_EVENT_TIME = Real(unit="seconds")


def jsonable(value: Any) -> Any:
    """``value`` made strict-JSON-safe: nan/inf floats become null (JSON has no
    nan), tuples become lists, dict keys strings, numpy scalars Python numbers.
    The one converter for the event log, job state files and summaries."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return jsonable(value.item())
    return value


def _check(event: dict) -> None:
    etype = check("type", event.get("type"), _EVENT_TYPE, prefix="event ")
    check("t", event.get("t"), _EVENT_TIME, prefix="event ")
    job_id = event.get("job_id")
    if etype in CLUSTER_EVENTS:
        if job_id is not None:
            raise InvalidProblem(f"{etype} is a cluster event: job_id must be null, got {job_id!r}")
    elif not isinstance(job_id, str) or not job_id:
        raise InvalidProblem(f"{etype} event needs a job_id string, got {job_id!r}")
    missing = [f for f in EVENT_FIELDS[etype] if f not in event]
    if missing:
        raise InvalidProblem(f"{etype} event misses field(s) {missing}")


class EventLog:
    """Append-only JSONL event log; each :meth:`emit` is one line, flushed and fsynced.

    Opening an existing file appends to it (a resumed run); a torn last line
    left by a kill is truncated first.  With ``ordered`` (the default, for
    real runs) an event is stamped never earlier than the one before it (in
    this file, across resumes): the log is one ordered history whichever part
    of a run emits an event (the scheduling loop, a backend translating its
    jobs' reports, a resumed run's start), and a time a moment before the last
    one written moves up to it.  A simulation writes each event at its exact
    simulated time, in the order its rounds produce them (``ordered=False``: a
    restart's end, computed ahead, may precede an arrival or a completion
    before it).  With ``durable=False`` lines are
    flushed but fsynced once, on :meth:`close`: for logs that are rerun from
    scratch rather than resumed (a simulation), where an fsync per event is
    most of the log's cost.  ``on_emit`` is called with each event once it is
    written (the service's index of the log).
    """

    def __init__(self, path: str | os.PathLike, *, durable: bool = True, ordered: bool = True,
                 on_emit: Callable[[dict], None] | None = None) -> None:
        self.path = Path(path)
        self.durable, self.ordered, self.on_emit = durable, ordered, on_emit
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._last_t = -math.inf
        self._repair()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _repair(self) -> None:
        """Truncate a torn last line; read the last event's time."""
        try:
            self._last_t = float(json.loads(drop_torn_line(self.path))["t"])
        except (ValueError, KeyError, TypeError):
            pass  # empty, or a line the reader rejects (a resumed run reads the log first)

    def emit(self, type: str, t: float, job_id: str | None = None, **fields: Any) -> dict:
        """Append one event and return it (as written: if ``ordered``, ``t`` no earlier than the last event's)."""
        event = {"t": float(t), "job_id": job_id, "type": type, **jsonable(fields)}
        _check(event)
        if self.ordered:
            event["t"] = self._last_t = max(event["t"], self._last_t)
        self._fh.write(json.dumps(event, separators=(",", ":"), allow_nan=False) + "\n")
        self._fh.flush()
        if self.durable:
            os.fsync(self._fh.fileno())
        if self.on_emit is not None:
            self.on_emit(event)
        return event

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullLog:
    """An event log that keeps nothing (a simulation without a run directory)."""

    def emit(self, *args: Any, **kwargs: Any) -> dict:
        return {}


#: Suffix of the file :func:`repair_log` moves unreadable lines into.
REJECTED_SUFFIX = ".rejected"
#: How to recover from an unreadable line, for the reader's error message.
_REPAIR_HINT = ("to keep every readable event and set the unreadable lines aside (into {name}{suffix}), "
                "rerun with --repair-log (pollux-opt run) or call pollux_opt.records.events.repair_log")


def _parse_line(line: str) -> dict | str:
    """The event on ``line``, or why it is not one."""
    try:
        event = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"is not JSON: {exc}"
    return event if isinstance(event, dict) else "is not a JSON object"


def iter_events(path: str | os.PathLike) -> Iterator[dict]:
    """Events of a log file in order; a torn (non-JSON) last line is skipped.

    Raises:
        InvalidProblem: another line is not a JSON object (naming the file, the
            line and how to recover: :func:`repair_log`).
    """
    path = Path(path)
    if not path.exists():
        raise InvalidProblem(f"event log {str(path)!r} does not exist")
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        event = _parse_line(line)
        if isinstance(event, dict):
            yield event
        elif i == len(lines) - 1 and event.startswith("is not JSON"):
            log.warning("event log %s: skipping torn last line", path)
        else:
            hint = _REPAIR_HINT.format(name=path.name, suffix=REJECTED_SUFFIX)
            raise InvalidProblem(f"event log {str(path)!r} line {i + 1} {event}; {hint}")


def repair_log(path: str | os.PathLike) -> int:
    """Move the lines of the log ``path`` that are not JSON objects into
    ``<path>.rejected`` (appended, each as ``<line number>: <line>``) and keep
    every other line, in order; returns how many were moved (0: nothing to do).

    Events on the moved lines are lost to the metrics (a lost ``complete`` is
    written again when the resumed run finds the job completed, at that time).
    """
    path = Path(path)
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept, rejected = [], []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        (kept if isinstance(_parse_line(line), dict) else rejected).append((i + 1, line))
    if not rejected:
        return 0
    with open(path.with_name(path.name + REJECTED_SUFFIX), "a", encoding="utf-8") as fh:
        fh.writelines(f"{number}: {line}\n" for number, line in rejected)
        fh.flush()
        os.fsync(fh.fileno())
    atomic_write_text(path, "".join(f"{line}\n" for _, line in kept))
    log.warning("event log %s: moved %d unreadable line(s) (%s) to %s%s", path, len(rejected),
                ", ".join(str(n) for n, _ in rejected), path.name, REJECTED_SUFFIX)
    return len(rejected)


def read_events(path: str | os.PathLike) -> list[dict]:
    """All events of a log file, in order (see :func:`iter_events`)."""
    return list(iter_events(path))


# ------------------------------------------------------------- goodput models in events
def goodput_model_to_json(model) -> dict | None:
    """A :class:`~pollux_opt.model.goodput.GoodputModel` as plain JSON (None stays None).

    Backends write a job's fitted model into its ``complete`` event (field
    ``model``) so that :mod:`pollux_opt.records.metrics` can estimate isolated JCTs
    from the event log alone.
    """
    if model is None:
        return None
    p, g, lim = model.throughput_params, model.grad_stats, model.limits
    return {
        "throughput_params": p.to_dict(),
        "grad_stats": {"grad_sqr": float(g.grad_sqr), "grad_var": float(g.grad_var),
                       "init_batch_size": int(g.init_batch_size)},
        "limits": {"init_batch_size": int(lim.init_batch_size), "max_batch_size": int(lim.max_batch_size),
                   "min_local_bsz": int(lim.min_local_bsz), "max_local_bsz": int(lim.max_local_bsz),
                   "max_accum_steps": int(lim.max_accum_steps)},
    }


def goodput_model_from_json(data: dict | None):
    """Inverse of :func:`goodput_model_to_json`."""
    from pollux_opt.model import BatchLimits, GoodputModel, GradientStats, ThroughputParams

    if not data:
        return None
    try:
        return GoodputModel(
            ThroughputParams(**data["throughput_params"]),
            GradientStats(**data["grad_stats"]),
            BatchLimits(**data["limits"]),
        )
    except (KeyError, TypeError) as exc:
        raise InvalidProblem(f"bad goodput model in event log: {exc}") from exc
