"""What a real executor run recorded (the files :mod:`pollux_opt.backends.sim.export`
lists), read back: :func:`read_job` turns one job's files into a :class:`JobData`,
:func:`workload_of_run` the run's jobs into a simulator workload.  A file that is
not what the runtime writes is an :class:`~solvers.InvalidProblem` naming it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pandas as pd

from solvers import InvalidProblem

from pollux_opt.model.validate import read_json
from pollux_opt.records.files import safe_name
from pollux_opt.records.tables import read_table
from pollux_opt.workloads.job import WorkloadJob

__all__ = ["DEFAULT_WARMUP_STEPS", "JobData", "find_run_dirs", "read_job", "read_jsonl", "workload_of_run"]

logger = logging.getLogger(__name__)

#: Default steps left out after each (re)start or batch change when job.json
#: has no ``warmup_steps`` option (the default of ``RuntimeOptions``).
DEFAULT_WARMUP_STEPS = 2

#: Job events that start a new generation of workers (and carry its placement).
_LAUNCH_EVENTS = ("started", "rescaled", "restarted")

#: Columns of a runtime's steps.csv read here (the first five integers).
_STEP_COLUMNS = ["step", "generation", "num_replicas", "local_bsz", "accum_steps", "step_time", "sync_time",
                 "progress", "grad_sqr_est", "grad_var_est"]


@dataclass
class JobData:
    """One job's records: its steps (trace-convention times, each generation's placement), its
    validations, and its measured rescale or restart (``launch``), start and verification seconds."""

    key: str
    app: str
    init_batch_size: int
    max_batch_size: int
    steps: pd.DataFrame  # with num_nodes, placement, trace_step, trace_sync, warm columns
    completed: bool
    final_progress: float
    validation: pd.DataFrame  # progress, value
    launch_seconds: list[float]
    start_seconds: list[float]
    verify_seconds: list[float]


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a crash: skip it, keep the rest
            logger.warning("skipping an unreadable line of %s", path)
    return out


def find_run_dirs(paths: Iterable) -> list[Path]:
    """Run directories (holding ``jobs/``) among ``paths`` or directly under them.

    A demo output folder (``fixed/``, ``dynamic/``, ``pollux/`` run dirs) is
    expanded to its runs.

    Raises:
        InvalidProblem: a path is missing or holds no run directory.
    """
    runs: list[Path] = []
    for p in paths:
        path = Path(p)
        if not path.is_dir():
            raise InvalidProblem(f"run dir {str(p)!r} does not exist")
        if (path / "jobs").is_dir():
            runs.append(path)
            continue
        subs = sorted(d for d in path.iterdir() if (d / "jobs").is_dir())
        if not subs:
            raise InvalidProblem(f"run dir {str(p)!r} holds no jobs/ folder (nor run dirs that do)")
        runs.extend(subs)
    return runs


def _placements_by_generation(events: list[dict], steps: pd.DataFrame) -> dict[int, dict[str, int]]:
    """``{generation: {node: replicas}}`` from the job's launch events (see module docstring)."""
    launches = [
        (int(e["details"].get("step", 0) or 0), e["details"]["placement"])
        for e in events
        if e.get("kind") in _LAUNCH_EVENTS and isinstance(e.get("details", {}).get("placement"), dict)
    ]
    out = {}
    for gen, rows in steps.groupby("generation"):
        first = int(rows.step.min())
        k = int(rows.num_replicas.iloc[0])
        fits = [pl for s, pl in launches if s < first and sum(pl.values()) == k]
        if not fits:
            fits = [pl for _, pl in launches if sum(pl.values()) == k]
        out[int(gen)] = {str(n): int(c) for n, c in fits[-1].items()} if fits else {"0": k}
    return out


def _job_meta(path: Path) -> tuple[dict, dict]:
    """``(job.json, its spec)``, or :class:`InvalidProblem` naming the file."""
    meta = read_json(path, "job file")
    try:
        spec = json.loads(meta["spec"]) if isinstance(meta["spec"], str) else meta["spec"]
        int(spec["init_batch_size"]), int(spec["max_batch_size"]), dict(meta.get("options") or {})
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise InvalidProblem(f"job file {str(path)!r} is not a runtime's job.json: {type(exc).__name__}: "
                             f"{str(exc)[:200]}") from None
    return meta, spec


def _launch_seconds(events: list[dict], kinds: tuple[str, ...]) -> list[float]:
    """The measured seconds of the job's launch events of ``kinds``."""
    return [float(e["details"]["seconds"]) for e in events
            if e.get("kind") in kinds and "seconds" in e.get("details", {})]


def read_job(run: Path, job_dir: Path, run_events: list[dict]) -> JobData | None:
    steps_path = job_dir / "steps.csv"
    job_path = job_dir / "job.json"
    if not (steps_path.is_file() and job_path.is_file()):
        logger.warning("skipping %s: no steps.csv or job.json", job_dir)
        return None
    meta, spec = _job_meta(job_path)
    app = safe_name(f"spec.name in {str(job_path)!r}", spec.get("name"))  # the profile folder's name
    steps = read_table(steps_path, "steps table", columns=_STEP_COLUMNS, integer=_STEP_COLUMNS[:5], allow_empty=True)
    if steps.empty:
        logger.warning("skipping %s: steps.csv has no rows", job_dir)
        return None
    # A resumed generation may repeat steps recorded before a fault: keep the last record.
    steps = steps.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)
    events = read_jsonl(job_dir / "events.jsonl")
    placements = _placements_by_generation(events, steps)
    steps["num_nodes"] = steps.generation.map(lambda g: len(placements[int(g)]))
    steps["placement"] = steps.generation.map(
        lambda g: "".join(str(c) for c in placements[int(g)].values()) if max(placements[int(g)].values()) <= 9 else ""
    )
    micro = steps.accum_steps + 1
    compute = ((steps.step_time - steps.sync_time) / micro).clip(lower=0.0)
    steps["trace_sync"] = steps.sync_time.clip(lower=0.0)
    steps["trace_step"] = compute + steps.trace_sync
    warmup = int((meta.get("options") or {}).get("warmup_steps", DEFAULT_WARMUP_STEPS))
    config = steps[["generation", "num_replicas", "local_bsz", "accum_steps"]].astype(str).agg(",".join, axis=1)
    run_id = (config != config.shift()).cumsum()
    steps["warm"] = steps.groupby(run_id).cumcount() >= warmup
    completed = any(e.get("kind") == "target_reached" for e in events)
    job_id = meta.get("job_id", job_dir.name)
    val = pd.DataFrame(
        [(float(e["progress"]), float(e["value"])) for e in run_events
         if e.get("type") == "validation" and e.get("job_id") == job_id and "progress" in e and "value" in e],
        columns=["progress", "value"],
    ).sort_values("progress")
    # Target reached -> verified in a fresh process (the run log's complete event).
    verify_seconds = [float(e["verify_s"]) for e in run_events
                      if e.get("type") == "complete" and e.get("job_id") == job_id and e.get("verify_s") is not None]
    return JobData(
        key=f"{run.name}/{job_id}", app=app, init_batch_size=int(spec["init_batch_size"]),
        max_batch_size=int(spec["max_batch_size"]), steps=steps, completed=completed,
        final_progress=float(steps.progress.iloc[-1]), validation=val,
        launch_seconds=_launch_seconds(events, _LAUNCH_EVENTS[1:]),
        start_seconds=_launch_seconds(events, _LAUNCH_EVENTS[:1]), verify_seconds=verify_seconds,
    )


def workload_of_run(run: Path) -> list[WorkloadJob]:
    """The jobs of a real run (``config.json``) as a simulator workload (the kind
    names the exported profile: the job's built-in spec name).

    Raises:
        InvalidProblem: no readable config.json.
    """
    path = Path(run) / "config.json"
    if not path.is_file():
        raise InvalidProblem(f"run dir {str(run)!r} has no config.json")
    config = read_json(path, "run config")
    workload = config.get("workload") if isinstance(config, dict) else None
    jobs = workload.get("jobs") if isinstance(workload, dict) else None
    if not isinstance(jobs, list) or not all(isinstance(j, dict) and {"id", "kind", "batch_size"} <= set(j)
                                             for j in jobs):
        raise InvalidProblem(f"run config {str(path)!r}: workload.jobs must be a list of jobs with id, kind and "
                             f"batch_size")
    return [
        WorkloadJob(id=str(j["id"]), kind=str(j["kind"]), arrival_s=j.get("arrival_s", 0.0),
                    replicas=j.get("replicas", 1), batch_size=j["batch_size"])
        for j in jobs
    ]
