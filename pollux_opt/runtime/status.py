"""What an elastic job knows about itself (:class:`JobStatus`): written by its
supervisor thread, read by the scheduler's thread as :class:`JobReport`
snapshots, and recorded in its work directory, from which (and from the
newest checkpoint) a re-opened job is restored.

Besides its checkpoints and logs, a job writes ``job.json`` (spec, options,
id; written once), ``state.json`` (state, restart and rescale times; replaced
atomically), ``events.jsonl`` (one event per line) and ``steps.csv`` (one row
per optimizer step of rank 0).  A crash can tear only the last line of
``events.jsonl`` or ``steps.csv`` (each line is one write); a restored job
drops it before appending.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.lifecycle import JobState, Lifecycle
from pollux_opt.model import BatchConfig
from pollux_opt.agent.agent import JobAgent, params_from_dict, params_to_dict
from pollux_opt.agent.batch import choose_batch
from pollux_opt.agent.measurements import profile_from_json
from pollux_opt.records.events import jsonable
from pollux_opt.runtime.allocation import WorkerAllocation
from pollux_opt.records.files import drop_torn_line
from pollux_opt.runtime.checkpoint import CheckpointInfo, atomic_write_json, checkpoint_dir, list_checkpoints
from pollux_opt.runtime.report import Event, JobReport, RuntimeOptions
from pollux_opt.runtime.spec import JobSpec

__all__ = ["EVENTS_FILE", "JOB_FILE", "STATE_FILE", "STEPS_FILE", "STEP_COLUMNS", "JobStatus", "read_job",
           "step_log", "write_job"]

logger = logging.getLogger("pollux_opt.runtime")

JOB_FILE = "job.json"
STATE_FILE = "state.json"
EVENTS_FILE = "events.jsonl"
STEPS_FILE = "steps.csv"

#: Columns of ``steps.csv``: one row per optimizer step on rank 0 (times in
#: seconds; see :class:`~pollux_opt.runtime.trainer.Trainer`).
STEP_COLUMNS = (
    "generation", "step", "time", "num_replicas", "local_bsz", "accum_steps", "step_time",
    "compute_time", "sync_time", "loss", "grad_sqr_est", "grad_var_est", "gain", "lr_factor", "progress",
)


def read_job(workdir: Path) -> dict | None:
    """The saved ``{"job_id", "spec", "options", "created"}``, or None for a new job."""
    path = Path(workdir) / JOB_FILE
    return json.loads(path.read_text()) if path.exists() else None


def write_job(workdir: Path, job_id: str, spec_json: str, options: RuntimeOptions) -> None:
    atomic_write_json(Path(workdir) / JOB_FILE, {
        "job_id": job_id, "spec": spec_json, "options": jsonable(options.__dict__), "created": time.time(),
    })


def step_log(workdir: Path):
    """``steps.csv`` as a pandas DataFrame (empty, with the columns, before any step)."""
    import pandas as pd

    path = Path(workdir) / STEPS_FILE
    if not path.exists():
        return pd.DataFrame(columns=list(STEP_COLUMNS))
    return pd.read_csv(path, on_bad_lines="skip")


class JobStatus:
    """The state of one job that other threads may read, guarded by ``lock``,
    and its records in its work directory ``workdir``.

    ``lifecycle`` (:class:`~pollux_opt.lifecycle.Lifecycle`) owns the job's
    state.  ``changed`` is notified (lock held) whenever a report, state, event
    or handled command changes what :meth:`ElasticJob.wait` checks, so that a
    waiter checks then rather than on a timer.  The :class:`JobAgent` (the
    job's measurements and fitted model) is written by the supervisor thread
    only.
    """

    def __init__(self, job_id: str, spec: JobSpec, options: RuntimeOptions, workdir: Path) -> None:
        self.job_id, self.spec, self.options = job_id, spec, options
        self.workdir = Path(workdir)
        self.limits = spec.limits()
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.lifecycle = Lifecycle(job_id)
        self.events: list[Event] = []
        self.error: str | None = None
        self.final_metric: float | None = None
        self.rescale_times: list[float] = []  # seconds
        self.start_times: list[float] = []  # seconds
        self.restarts = 0
        self.first_start: float | None = None  # Unix seconds
        self.step = 0
        self.progress = 0.0
        self.samples = 0
        self.metric: float | None = None
        self.train_size: int | None = None  # reported by the workers
        self.alloc: WorkerAllocation | None = None
        self.config: BatchConfig | None = None  # the batch configuration running (or last run)
        self.worker_pids: tuple[int, ...] = ()
        self.agent = JobAgent(self.limits, fixed_batch=options.fixed_batch_size is not None, name=job_id)
        #: On a cluster of several node types: one agent per type the job ran on,
        #: fed the steps run there (``agent`` pools every type).
        self.type_agents: dict[str, JobAgent] = {}
        self.submitted = 0  # commands put on the supervisor's queue
        self.handled = 0  # commands the supervisor has taken off it

    # ------------------------------------------------------------------ restore
    def restore(self) -> CheckpointInfo | None:
        """Take ``state.json`` (as :meth:`persistent` wrote it), the event log and
        the newest checkpoint's metadata; returns that checkpoint (None: none).

        A job saved with workers lost them with its previous supervisor: it is
        restored ``queued`` (the supervisor makes it verify instead when its
        newest checkpoint is an unchecked final one)."""
        saved = self._read_state()
        if saved:
            value, known = saved.get("state", JobState.QUEUED.value), [s.value for s in JobState]
            if value not in known:
                raise InvalidProblem(f"state.json of job {self.job_id!r}: state must be one of "
                                     f"{', '.join(known)}, got {value!r}")
            state = JobState(value)
            self.lifecycle = Lifecycle(self.job_id, JobState.QUEUED if state.holds_workers else state)
            self.error = saved.get("error")
            self.final_metric = saved.get("final_metric")
            self.rescale_times = list(saved.get("rescale_times", []))
            self.start_times = list(saved.get("start_times", []))
            self.restarts = int(saved.get("num_restarts", 0))
            self.first_start = saved.get("first_start")
        for name in (EVENTS_FILE, STEPS_FILE):
            drop_torn_line(self.workdir / name)  # so that appending never continues a torn line
        self.events = self._read_events()
        infos = list_checkpoints(checkpoint_dir(self.workdir))
        if infos:
            self.absorb_meta(infos[0].meta)
        return infos[0] if infos else None

    def _read_state(self) -> dict:
        """The saved state, or ``{}`` when there is none or it is unreadable."""
        path = self.workdir / STATE_FILE
        if not path.exists():
            return {}
        try:
            return json.loads(path.read_text())
        except ValueError:
            logger.warning("%s is unreadable; starting from the checkpoints alone", path)
            return {}

    def _read_events(self) -> list[Event]:
        path = self.workdir / EVENTS_FILE
        events = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    data = json.loads(line)
                    events.append(Event(data["time"], data["kind"], data.get("details", {})))
                except (ValueError, KeyError):
                    continue  # not an event of this log
        return events

    def absorb_meta(self, meta: dict) -> None:
        """Take the training state recorded in a checkpoint's metadata."""
        self.step = int(meta.get("step", 0))
        self.progress = float(meta.get("progress", 0.0))
        self.samples = int(meta.get("samples", 0))
        self.metric = meta.get("metric")
        raw = meta.get("stats")
        stats = (None if raw is None else (float(raw[0]), float(raw[1])), int(meta.get("stats_steps", 0)))
        self.agent.restore(profile_from_json(meta.get("profile")), params_from_dict(meta.get("params")), *stats)
        for t, profile in (meta.get("type_profiles") or {}).items():
            self.type_agent(str(t)).restore(profile_from_json(profile), None, *stats)
        config = meta.get("config")
        if config:
            self.config = BatchConfig(int(config[0]), int(config[1]))

    def type_agent(self, node_type: str) -> JobAgent:
        """The agent of ``node_type`` (created empty, with the job's gradient statistics)."""
        agent = self.type_agents.get(node_type)
        if agent is None:
            agent = self.type_agents[node_type] = JobAgent(
                self.limits, fixed_batch=self.options.fixed_batch_size is not None, name=f"{self.job_id}@{node_type}")
            agent.update_stats(self.agent.reported_stats, self.agent.stats_steps)
        return agent

    def take_measurements(self, info: dict) -> None:
        """Take rank 0's gradient statistics (shared by every type) and profiles:
        the pooled one, and each node type's (``info["type_profiles"]``)."""
        stats, steps = info["stats"], info["stats_steps"]
        self.agent.update_stats(stats, steps)
        self.agent.update_profile(info["profile"])
        for t, profile in (info.get("type_profiles") or {}).items():
            agent = self.type_agent(t)
            agent.update_profile(profile)
        for agent in self.type_agents.values():
            agent.update_stats(stats, steps)

    def take_metrics(self, info: dict) -> None:
        """Take rank 0's ``METRICS`` report: its position, its measurements and
        its rows of ``steps.csv``."""
        with self.lock:
            self.take_position(info)
            self.take_measurements(info)
            self.changed.notify_all()
        self._append_steps(info["rows"])

    def _append_steps(self, rows: Sequence[Sequence]) -> None:
        """Append rows of :data:`STEP_COLUMNS` (the header first, in a new file)."""
        if not rows:
            return
        path = self.workdir / STEPS_FILE
        new = not path.exists()
        with open(path, "a", newline="") as fh:
            writer = csv.writer(fh)
            if new:
                writer.writerow(STEP_COLUMNS)
            writer.writerows(rows)

    def refit(self):
        """Re-fit the pooled throughput model and each type's (where stale); returns the pooled parameters."""
        for agent in self.type_agents.values():
            agent.refit()
        return self.agent.refit()

    def take_position(self, info: dict) -> None:
        """Take the training position of a worker report (step, progress, samples, metric)."""
        self.step, self.progress, self.samples = info["step"], info["progress"], info["samples"]
        if info.get("metric") is not None:
            self.metric = info["metric"]

    def batch_for(self, alloc: WorkerAllocation, current: BatchConfig | None) -> BatchConfig:
        """The batch to run on ``alloc``: the user's pin, else the job's own choice
        (:func:`~pollux_opt.agent.batch.choose_batch` with its freshest model),
        keeping ``current`` unless a better one is clear."""
        if alloc.pin is not None:
            return alloc.pin
        return choose_batch(self.limits, alloc.num_nodes, alloc.num_replicas, self.agent.batch_model(),
                            fixed_batch_size=self.options.fixed_batch_size, current=current)

    # ------------------------------------------------------------------ output
    def enter(self, state: JobState, reason: str, *, verifying: bool = False) -> None:
        """Move to ``state``: the one place the state changes, checked against the table."""
        with self.lock:
            step = self.lifecycle.move(state, reason, verifying=verifying)
            self.changed.notify_all()
        logger.debug("job %s: %s -> %s (%s)", self.job_id, step.old.value, step.new.value, reason)

    def record(self, kind: str, details: dict) -> None:
        """Record an event (``events.jsonl``, and what :meth:`report` shows)."""
        event = Event(time.time(), kind, jsonable(details))
        with self.lock:
            self.events.append(event)
            self.changed.notify_all()
        logger.info("job %s: %s %s", self.job_id, kind, details)
        # One write per line, flushed and fsynced.
        with open(self.workdir / EVENTS_FILE, "a") as fh:
            fh.write(json.dumps({"time": event.time, "kind": event.kind, "details": event.details}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def fail(self, error: str, details: dict | None = None) -> None:
        """End the job as ``failed``, recording why (``error``, and ``details``)."""
        self.record("failed", dict(details or {}, error=error))
        with self.lock:
            self.error = error
            self.enter(JobState.FAILED, error)
        self.persist()

    def persist(self) -> None:
        """Write ``state.json`` (atomically)."""
        with self.lock:
            data = self.persistent()
        atomic_write_json(self.workdir / STATE_FILE, jsonable(data))

    def persistent(self) -> dict:
        """What ``state.json`` holds (JSON-safe after :func:`~pollux_opt.records.events.jsonable`)."""
        return {
            "job_id": self.job_id, "state": self.lifecycle.state.value,
            "verifying": self.lifecycle.verifying, "error": self.error,
            "final_metric": self.final_metric, "rescale_times": self.rescale_times,
            "start_times": self.start_times, "num_restarts": self.restarts,
            "first_start": self.first_start, "step": self.step, "progress": self.progress,
            "placement": None if self.alloc is None else dict(self.alloc.placement),
            "params": params_to_dict(self.agent.params), "time": time.time(),
            **({"type_params": {t: params_to_dict(a.params) for t, a in self.type_agents.items()}}
               if self.type_agents else {}),
        }

    def report(self) -> JobReport:
        """A consistent snapshot."""
        with self.lock:
            alloc = self.alloc if self.lifecycle.holds_cpus else None
            config = self.config or BatchConfig(0, 0)
            replicas = alloc.num_replicas if alloc else 0
            agent = self.agent
            return JobReport(
                job_id=self.job_id, kind=self.spec.name, state=self.lifecycle.state, step=self.step,
                progress=self.progress, samples=self.samples,
                epoch=self.samples / self.train_size if self.train_size else math.nan,
                metric_name=self.spec.metric, target=self.spec.target,
                higher_is_better=self.spec.higher_is_better, metric=self.metric,
                final_metric=self.final_metric, placement=dict(alloc.placement) if alloc else {},
                num_replicas=replicas, num_nodes=alloc.num_nodes if alloc else 0,
                local_bsz=config.local_bsz, accum_steps=config.accum_steps,
                batch_size=config.total_batch(replicas) if replicas else 0,
                fixed_batch_size=self.options.fixed_batch_size,
                measurements=agent.measurements, throughput_params=agent.params, grad_stats=agent.grad_stats,
                limits=self.limits,
                restart_delay=float(np.median(self.rescale_times)) if self.rescale_times else None,
                rescale_times=tuple(self.rescale_times), start_times=tuple(self.start_times),
                num_restarts=self.restarts,
                age=0.0 if self.first_start is None else time.time() - self.first_start,
                worker_pids=self.worker_pids if alloc else (), error=self.error, events=tuple(self.events),
                transitions=tuple(self.lifecycle.history),
                type_measurements={t: a.measurements for t, a in self.type_agents.items()},
                type_params={t: a.params for t, a in self.type_agents.items()},
                verifying=self.lifecycle.verifying,
            )
