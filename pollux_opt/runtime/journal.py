"""What an elastic job writes about itself in its work directory, besides its
checkpoints and logs: ``job.json`` (spec, options, id; written once),
``state.json`` (state, restart and rescale times; replaced atomically),
``events.jsonl`` (one event per line) and ``steps.csv`` (one row per optimizer
step of rank 0).

A crash can tear only the last line of ``events.jsonl`` or ``steps.csv``
(each line is one write); readers skip a torn line.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

from pollux_opt.records.events import jsonable
from pollux_opt.runtime.checkpoint import atomic_write_json
from pollux_opt.runtime.report import Event

__all__ = ["EVENTS_FILE", "JOB_FILE", "STATE_FILE", "STEPS_FILE", "STEP_COLUMNS", "JobJournal"]

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


class JobJournal:
    """Reads and writes the journal files of the job in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)

    # ----------------------------------------------------------------- job.json
    def read_job(self) -> dict | None:
        """The saved ``{"job_id", "spec", "options", "created"}``, or None for a new job."""
        path = self.workdir / JOB_FILE
        return json.loads(path.read_text()) if path.exists() else None

    def write_job(self, job_id: str, spec_json: str, options: Any) -> None:
        atomic_write_json(self.workdir / JOB_FILE, {
            "job_id": job_id, "spec": spec_json, "options": jsonable(options.__dict__), "created": time.time(),
        })

    # --------------------------------------------------------------- state.json
    def read_state(self) -> dict:
        """The saved state, or ``{}`` when there is none or it is unreadable."""
        path = self.workdir / STATE_FILE
        if not path.exists():
            return {}
        try:
            return json.loads(path.read_text())
        except ValueError:
            logger.warning("%s is unreadable; starting from the checkpoints alone", path)
            return {}

    def write_state(self, data: dict) -> None:
        atomic_write_json(self.workdir / STATE_FILE, jsonable(data))

    # ------------------------------------------------------------- events.jsonl
    def read_events(self) -> list[Event]:
        path = self.workdir / EVENTS_FILE
        events = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    data = json.loads(line)
                    events.append(Event(data["time"], data["kind"], data.get("details", {})))
                except (ValueError, KeyError):
                    continue  # a torn last line from a crash
        return events

    def append_event(self, event: Event) -> None:
        """Append one event: one write per line, flushed and fsynced."""
        with open(self.workdir / EVENTS_FILE, "a") as fh:
            fh.write(json.dumps({"time": event.time, "kind": event.kind, "details": event.details}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    # ---------------------------------------------------------------- steps.csv
    def append_steps(self, rows: Sequence[Sequence]) -> None:
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

    def step_log(self):
        """``steps.csv`` as a pandas DataFrame (empty, with the columns, before any step)."""
        import pandas as pd

        path = self.workdir / STEPS_FILE
        if not path.exists():
            return pd.DataFrame(columns=list(STEP_COLUMNS))
        return pd.read_csv(path, on_bad_lines="skip")
