"""One real run: a policy on a workload of real jobs, in a run directory (:func:`run_workload`).

A run holds its directory's lock for its whole life (a second scheduler on
the same directory is refused, :mod:`~pollux_opt.backends.local.runlock`) and
stops on Ctrl-C or SIGTERM with every job checkpointed
(:mod:`~pollux_opt.backends.local.signals`); either way, and after a kill, the
same call on the same directory resumes it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Mapping

from pollux_opt.backends.local.backend import STOP_GRACE_S, RealBackend, RunStopping
from pollux_opt.backends.local.console import ConsoleProgress
from pollux_opt.backends.local.rundir import EVENTS_FILE, SUMMARY_FILE, cluster_from_json, open_run_config
from pollux_opt.backends.local.runlock import hold_run_lock
from pollux_opt.backends.local.signals import RunInterrupted, StopSignals
from pollux_opt.backends.local.nodes import check_throttle, typed_cluster
from pollux_opt.model import Cluster
from pollux_opt.model.cluster_types import ClusterTypes
from pollux_opt.records.events import EventLog, read_events, repair_log
from pollux_opt.records.files import atomic_write_json
from pollux_opt.workloads.job import Workload

__all__ = ["DEFAULT_INTERVAL_S", "RunInterrupted", "run_workload"]

log = logging.getLogger(__name__)

#: Default round interval of real runs, seconds (the project's choice for jobs
#: of minutes; Pollux reallocates every 60 s).
DEFAULT_INTERVAL_S = 30.0


def run_workload(
    run_dir: str | os.PathLike,
    workload: Workload | None = None,
    policy: str | None = None,
    *,
    cluster: Cluster | ClusterTypes | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    pin_cpus: bool = True,
    runtime_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    backend_kwargs: Mapping[str, Any] | None = None,
    repair: bool = False,
    backend_class: type = RealBackend,
) -> dict:
    """Run (or resume) one policy on one workload of real jobs; return the summary.

    A new run needs ``workload`` and ``policy``; if ``run_dir`` already holds a
    ``config.json`` the run resumes with that configuration (``workload`` and
    ``policy``, if given, must match it; see
    :mod:`~pollux_opt.backends.local.rundir`).  Writes ``summary.json`` at the end.
    In the main thread, SIGINT and SIGTERM stop the run with every job
    checkpointed and raise :class:`RunInterrupted` (see
    :mod:`~pollux_opt.backends.local.signals`).

    Args:
        run_dir: the run directory (created).
        workload: the jobs and arrivals (new runs).
        policy: a registered policy that runs on real jobs (new runs; see
            :func:`pollux_opt.scheduling.policies.policy_names`).
        cluster: nodes and CPUs (default: this machine, one node), or a
            node-type description (:func:`~pollux_opt.backends.local.nodes.typed_cluster`:
            typed nodes, and a cgroup CPU quota on the nodes of a type with
            ``cpu_quota`` < 1).
        interval: seconds between scheduling rounds (default :data:`DEFAULT_INTERVAL_S`).
        pin_cpus: pin replicas to CPUs (see :class:`RealBackend`).
        runtime_options: extra RuntimeOptions fields for every job.
        progress: show a live table (rich) while running.
        backend_kwargs: extra keyword arguments of ``backend_class`` (tests; Ray's nodes).
        repair: first move the event log's unreadable lines aside
            (:func:`pollux_opt.records.events.repair_log`).
        backend_class: :class:`RealBackend` or a subclass of it (the Ray backend).

    Raises:
        InvalidProblem: bad arguments, a mismatch with the stored run, an
            unreadable event log, or another scheduler using ``run_dir``.
        ThrottleRefused: a throttled node type where cgroups cannot be written
            (an InvalidProblem; raised before the run directory is written).
        RunInterrupted: a stop signal stopped the run (resumable).
    """
    from pollux_opt.records.metrics import summarize

    quotas: dict[str, float] = {}
    if isinstance(cluster, ClusterTypes):
        cluster, quotas = typed_cluster(cluster)
        check_throttle(quotas)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with hold_run_lock(run_dir), StopSignals() as signals:
        if repair:
            repair_log(run_dir / EVENTS_FILE)
        cfg, resumed = open_run_config(run_dir, workload, policy, cluster=cluster, interval=interval,
                                       pin_cpus=pin_cpus, runtime_options=runtime_options, cpu_quota=quotas)
        _run(run_dir, cfg, resumed, signals, progress, backend_kwargs, backend_class)
        summary = summarize(read_events(run_dir / EVENTS_FILE))
        summary["workload"] = cfg["workload"]["name"]
        atomic_write_json(run_dir / SUMMARY_FILE, summary)
    return summary


def _run(run_dir: Path, cfg: dict, resumed: bool, signals: StopSignals, progress: bool,
         backend_kwargs: Mapping[str, Any] | None, backend_class: type = RealBackend) -> None:
    """The run of ``cfg`` in ``run_dir`` until every job has finished or a stop signal came."""
    from pollux_opt.scheduling.policies import make_policy

    workload = Workload.from_json(cfg["workload"])
    cluster = cluster_from_json(cfg["cluster"])
    pol = make_policy(cfg["policy"])
    if (run_dir / EVENTS_FILE).exists():
        read_events(run_dir / EVENTS_FILE)  # an unreadable log is refused before anything is appended to it
    events = EventLog(run_dir / EVENTS_FILE)
    backend = None
    graceful = True
    try:
        events.emit("run_start", time.time() - cfg["started_unix"], None, policy=pol.name, resumed=resumed,
                    workload=workload.name, cluster_cpus=cluster.total_cpus,
                    node_cpus=max(n.cpus for n in cluster.nodes), cluster=cfg["cluster"],
                    interval_s=cfg["interval_s"])
        extra = dict(backend_kwargs or {})
        if cfg.get("cpu_quota"):
            extra["cpu_quota"] = cfg["cpu_quota"]
        backend = backend_class(
            run_dir, workload, cluster, events, fixed_batch=pol.fixed_batch,
            started_unix=cfg["started_unix"], pin_cpus=cfg["pin_cpus"],
            runtime_options=cfg["runtime_options"], should_stop=signals.requested, **extra,
        )
        try:
            _loop(backend, pol, events, cfg["interval_s"], progress)
        except RunStopping:
            graceful = False  # the jobs are stopped below (or, on a second signal, ended at once)
            name = signal.Signals(signals.signum).name
            log.warning("%s: checkpointing and stopping the jobs (up to %.0f s; a second %s stops at once)",
                        name, STOP_GRACE_S, name)
            stopped = backend.stop_run(name)
            raise RunInterrupted(signals.signum, str(run_dir), stopped) from None
    except KeyboardInterrupt:
        graceful = False  # a second stop signal: end the workers without waiting
        raise
    finally:
        if backend is not None:
            backend.close(graceful=graceful and not backend.finished())
        events.close()


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
