"""One real run: a policy on a workload of real jobs, in a run directory (:func:`run_workload`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

from pollux_opt.backends.local.backend import RealBackend
from pollux_opt.backends.local.console import ConsoleProgress
from pollux_opt.backends.local.rundir import EVENTS_FILE, SUMMARY_FILE, cluster_from_json, open_run_config
from pollux_opt.model import Cluster
from pollux_opt.records.events import EventLog, read_events
from pollux_opt.records.files import atomic_write_json
from pollux_opt.workloads.job import Workload

__all__ = ["DEFAULT_INTERVAL_S", "run_workload"]

#: Default round interval of real runs, seconds (the project's choice for jobs
#: of minutes; Pollux reallocates every 60 s).
DEFAULT_INTERVAL_S = 30.0


def run_workload(
    run_dir: str | os.PathLike,
    workload: Workload | None = None,
    policy: str | None = None,
    *,
    cluster: Cluster | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    pin_cpus: bool = True,
    runtime_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    backend_kwargs: Mapping[str, Any] | None = None,
) -> dict:
    """Run (or resume) one policy on one workload of real jobs; return the summary.

    A new run needs ``workload`` and ``policy``; if ``run_dir`` already holds a
    ``config.json`` the run resumes with that configuration (``workload`` and
    ``policy``, if given, must match it; see
    :mod:`~pollux_opt.backends.local.rundir`).  Writes ``summary.json`` at the end.

    Args:
        run_dir: the run directory (created).
        workload: the jobs and arrivals (new runs).
        policy: a registered policy that runs on real jobs (new runs; see
            :func:`pollux_opt.scheduling.policies.policy_names`).
        cluster: nodes and CPUs (default: this machine, one node).
        interval: seconds between scheduling rounds (default :data:`DEFAULT_INTERVAL_S`).
        pin_cpus: pin replicas to CPUs (see :class:`RealBackend`).
        runtime_options: extra RuntimeOptions fields for every job.
        progress: show a live table (rich) while running.
        backend_kwargs: extra keyword arguments of :class:`RealBackend` (tests).
    """
    from pollux_opt.records.metrics import summarize
    from pollux_opt.scheduling.policies import make_policy

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg, resumed = open_run_config(run_dir, workload, policy, cluster=cluster, interval=interval,
                                   pin_cpus=pin_cpus, runtime_options=runtime_options)
    workload = Workload.from_json(cfg["workload"])
    cluster = cluster_from_json(cfg["cluster"])
    pol = make_policy(cfg["policy"])
    events = EventLog(run_dir / EVENTS_FILE)
    backend = None
    try:
        events.emit("run_start", time.time() - cfg["started_unix"], None, policy=pol.name, resumed=resumed,
                    workload=workload.name, cluster_cpus=cluster.total_cpus,
                    node_cpus=max(n.cpus for n in cluster.nodes), cluster=cfg["cluster"],
                    interval_s=cfg["interval_s"])
        backend = RealBackend(
            run_dir, workload, cluster, events, adapts_batch=pol.adapts_batch,
            started_unix=cfg["started_unix"], pin_cpus=cfg["pin_cpus"],
            runtime_options=cfg["runtime_options"], **dict(backend_kwargs or {}),
        )
        _loop(backend, pol, events, cfg["interval_s"], progress)
    finally:
        if backend is not None:
            backend.close(graceful=not backend.finished())
        events.close()
    summary = summarize(read_events(run_dir / EVENTS_FILE))
    summary["workload"] = workload.name
    atomic_write_json(run_dir / SUMMARY_FILE, summary)
    return summary


def _loop(backend: RealBackend, policy, events: EventLog, interval: float, progress: bool) -> None:
    """The scheduler loop over ``backend`` until every job has finished, with the console view if ``progress``."""
    from pollux_opt.scheduling.loop import run

    display = ConsoleProgress(policy.name, backend.workload, backend.cluster) if progress else None
    if display is None:
        run(backend, policy, backend.cluster, events, interval=interval)
        return
    display.done_fn = lambda: sum(j.finished for j in backend.jobs.values())
    with display:
        run(backend, policy, backend.cluster, events, interval=interval, progress=display.update)
