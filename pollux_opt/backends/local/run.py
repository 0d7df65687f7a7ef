"""Real runs: a policy on a workload of real jobs in a run directory
(:func:`run_workload`), and the demo, one workload under each policy in turn
(:func:`run_demo`).  A run holds its directory's lock for its whole life
(:func:`~pollux_opt.backends.local.rundir.hold_run_lock`); however it ends, a
kill included, the same call on the same directory resumes it.

**Stop signals.**  While a run goes on in the main thread, :class:`StopSignals`
handles SIGINT (Ctrl-C) and SIGTERM.  The first one asks the run to stop: the
backend notices at its next poll (within about a second), checkpoints and
stops every job, logs a ``run_stop`` event, and the run raises
:class:`RunInterrupted` (a ``KeyboardInterrupt``; the command line exits
quietly with 128 + the signal number).  A second signal stops at once: workers
are ended without waiting, and the jobs resume from their newest periodic
checkpoints.  The pool's processes ignore SIGINT, so that a Ctrl-C reaches only
the scheduler, but a SIGTERM sent to the whole process group ends them at once
(:mod:`pollux_opt.runtime.lifeline`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from solvers import InvalidProblem

from pollux_opt.backends.local.backend import STOP_GRACE_S, RealBackend, RunStopping
from pollux_opt.backends.local.nodes import check_throttle, typed_cluster
from pollux_opt.backends.local.rundir import CONFIG_FILE, EVENTS_FILE, SUMMARY_FILE, cluster_from_json
from pollux_opt.backends.local.rundir import hold_run_lock, open_run_config
from pollux_opt.model import Cluster
from pollux_opt.model.cluster_types import ClusterTypes
from pollux_opt.records.events import EventLog, read_events, repair_log
from pollux_opt.records.files import atomic_write_json, safe_name
from pollux_opt.scheduling.loop import Decision, JobView
from pollux_opt.workloads.job import Workload

__all__ = ["DEFAULT_INTERVAL_S", "DEMO_POLICIES", "QUICK_INTERVAL_S", "STOP_SIGNALS", "RunInterrupted",
           "StopSignals", "console_progress", "run_demo", "run_workload"]

log = logging.getLogger(__name__)

#: Default round interval of real runs, seconds (the project's choice for jobs
#: of minutes; Pollux reallocates every 60 s).
DEFAULT_INTERVAL_S = 30.0
#: Round interval of ``demo --quick`` (seconds): jobs of the quick sets train for
#: 20-90 s, so a 30 s round would leave a job's first fitted model unused for
#: most of its life; 10 s keeps the scheduler's overhead (about 0.05 s a round
#: on this machine) well under 2 % of the interval.
QUICK_INTERVAL_S = 10.0
#: Policies of the demo, in the order they run.
DEMO_POLICIES = ("fixed", "dynamic", "pollux")
#: The demo's comparison of the policies' summaries, in its output folder.
COMPARISON_FILE = "comparison.json"
#: The signals that stop a run with a checkpoint.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: Exit statuses of a stopped run are this plus the signal number (the shell's convention).
SIGNAL_EXIT_BASE = 128


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by a signal after checkpointing and stopping its jobs.

    Attributes:
        signum: the signal; ``exit_status``: the shell's status of it, 128 + it.
        run_dir: the run directory (rerun on it to resume).
        stopped: ids of the jobs checkpointed and stopped (they resume).
    """

    def __init__(self, signum: int, run_dir: str, stopped: Sequence[str]) -> None:
        self.signum, self.run_dir, self.stopped = int(signum), str(run_dir), list(stopped)
        self.exit_status = SIGNAL_EXIT_BASE + self.signum
        name = signal.Signals(self.signum).name
        super().__init__(
            f"stopped by {name}: {len(self.stopped)} unfinished job(s) checkpointed and stopped in "
            f"{self.run_dir}; run the same command again to resume"
        )


class StopSignals:
    """The run's handlers of :data:`STOP_SIGNALS` (see the module docstring),
    installed for a ``with`` block in the main thread (elsewhere: none)."""

    def __init__(self) -> None:
        #: The first stop signal received (None: none yet).
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self.signum is not None

    def _handle(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            return
        raise KeyboardInterrupt  # the second one: stop without waiting

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: not set from Python
        self._previous.clear()


@contextlib.contextmanager
def console_progress(policy: str, backend: RealBackend) -> Iterator[Callable[[float, Sequence[JobView], Decision], None]]:
    """The live progress table (rich, on stderr) of a run, as the ``progress``
    callback of :func:`pollux_opt.scheduling.loop.run`: each job's state, CPUs,
    batch size, progress and restarts at round ``now`` (run seconds).  It is
    refreshed once per round (no refresh thread, so it costs no CPU between
    rounds); off a terminal it prints one line per round instead."""
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    console = Console(stderr=True)
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None

    def update(now: float, views: Sequence[JobView], decision: Decision) -> None:
        jobs = backend.jobs.values()
        done, total = sum(j.finished for j in jobs), len(jobs)
        cpus = {v.job_id: sum(decision.placement.get(v.job_id, {}).values()) for v in views}
        if live is None:
            alloc = ", ".join(f"{jid}:{k}" for jid, k in cpus.items())
            console.print(f"[{policy}] t={now:.0f}s done {done}/{total} alloc {alloc}", markup=False)
            return
        table = Table(title=f"{policy} on {backend.source.name}: {done}/{total} jobs done, "
                            f"t = {now:.0f} s, {backend.cluster.total_cpus} CPUs", title_justify="left")
        for col in ("job", "state", "CPUs", "batch", "progress", "restarts"):
            table.add_column(col)
        for v in views:
            table.add_row(v.job_id, v.state.value, str(cpus[v.job_id]), str(v.batch_size) if v.batch_size else "-",
                          f"{v.progress:.0f}", str(v.restarts))
        live.update(table, refresh=True)

    with live or contextlib.nullcontext():
        yield update


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
    service: Any = None,
) -> dict:
    """Run (or resume) one policy on one workload of real jobs; return the summary.

    A new run needs ``workload`` and ``policy``; if ``run_dir`` already holds a
    ``config.json`` the run resumes with that configuration (``workload`` and
    ``policy``, if given, must match it).  Writes ``summary.json`` at the end.
    With ``service`` the jobs come from the service's open queue instead of a
    workload (:func:`pollux_opt.service.server.serve`), and the run goes on
    until a stop signal.
    In the main thread, SIGINT and SIGTERM stop the run with every job
    checkpointed (see the module docstring).

    Args:
        run_dir: the run directory (created).
        workload: the jobs and arrivals (new runs).
        policy: a registered policy that runs on real jobs (new runs; see
            :func:`pollux_opt.scheduling.policies.policy_names`).
        cluster: nodes and CPUs (default: this machine, one node), or a node-type
            description (:func:`~pollux_opt.backends.local.nodes.typed_cluster`).
        interval: seconds between scheduling rounds (default :data:`DEFAULT_INTERVAL_S`).
        pin_cpus: pin replicas to CPUs (see :class:`RealBackend`).
        runtime_options: extra RuntimeOptions fields for every job.
        progress: show a live table (rich) while running.
        backend_kwargs: extra keyword arguments of ``backend_class`` (tests; Ray's nodes).
        repair: first move the event log's unreadable lines aside
            (:func:`pollux_opt.records.events.repair_log`).
        backend_class: :class:`RealBackend` or a subclass of it (the Ray backend).
        service: the service around the run (its job source, its index of the
            event log and its HTTP server: :class:`pollux_opt.service.server.Service`).

    Raises:
        InvalidProblem: bad arguments, a mismatch with the stored run, an
            unreadable event log, or another scheduler using ``run_dir``.
        ThrottleRefused: (an InvalidProblem) a throttled node type where cgroups
            cannot be written, before the run directory is written.
        RunInterrupted: a stop signal stopped the run (resumable).
    """
    from pollux_opt.records.metrics import summarize

    quotas: dict[str, float] = {}
    gpu_types: tuple[str, ...] = ()
    if isinstance(cluster, ClusterTypes):
        cluster, quotas, gpu_types = typed_cluster(cluster)
        check_throttle(quotas)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with hold_run_lock(run_dir), StopSignals() as signals:
        if repair:
            repair_log(run_dir / EVENTS_FILE)
        cfg, resumed = open_run_config(run_dir, workload, policy, cluster=cluster, interval=interval,
                                       pin_cpus=pin_cpus, runtime_options=runtime_options, cpu_quota=quotas,
                                       gpu_types=gpu_types,
                                       open_queue=service is not None and service.open_queue)
        _run(run_dir, cfg, resumed, signals, progress, backend_kwargs, backend_class, service)
        summary = summarize(read_events(run_dir / EVENTS_FILE))
        summary["workload"] = cfg["workload"]["name"] if cfg["workload"] else "service"
        atomic_write_json(run_dir / SUMMARY_FILE, summary)
    return summary


def _run(run_dir: Path, cfg: dict, resumed: bool, signals: StopSignals, progress: bool,
         backend_kwargs: Mapping[str, Any] | None, backend_class: type = RealBackend, service: Any = None) -> None:
    """The run of ``cfg`` in ``run_dir`` until every job has finished or a stop signal
    came, with the console view if ``progress``: the jobs of its workload, or of
    ``service``'s open queue while it serves."""
    from pollux_opt.scheduling.loop import run as loop
    from pollux_opt.scheduling.policies import make_policy

    cluster = cluster_from_json(cfg["cluster"])
    pol = make_policy(cfg["policy"])
    # An unreadable log is refused before anything is appended to it.
    history = read_events(run_dir / EVENTS_FILE) if (run_dir / EVENTS_FILE).exists() else []
    if service is None:
        # The backend reads the workload as a ClosedSource that sleeps with its own (injectable) sleep.
        source, on_emit, serving = Workload.from_json(cfg["workload"]), None, contextlib.nullcontext
    else:
        source = service.attach(run_dir, cfg, history)
        on_emit, serving = service.index_event, service.serving
    events = EventLog(run_dir / EVENTS_FILE, on_emit=on_emit)
    backend = None
    graceful = True
    try:
        history.append(events.emit(
            "run_start", time.time() - cfg["started_unix"], None, policy=pol.name, resumed=resumed,
            workload=source.name, cluster_cpus=cluster.total_cpus, node_cpus=max(n.cpus for n in cluster.nodes),
            cluster=cfg["cluster"], interval_s=cfg["interval_s"]))
        extra = dict(backend_kwargs or {})
        if cfg.get("cpu_quota"):
            extra["cpu_quota"] = cfg["cpu_quota"]
        if cfg.get("gpu_types"):
            extra["gpu_types"] = tuple(cfg["gpu_types"])
        backend = backend_class(
            run_dir, source, cluster, events, fixed_batch=pol.fixed_batch,
            started_unix=cfg["started_unix"], pin_cpus=cfg["pin_cpus"],
            runtime_options=cfg["runtime_options"], should_stop=signals.requested, history=history, **extra,
        )
        try:
            view = console_progress(pol.name, backend) if progress else contextlib.nullcontext()
            with serving(backend), view as update:
                loop(backend, pol, backend.cluster, events, interval=cfg["interval_s"], progress=update,
                     autoscaler=getattr(backend, "autoscaler", None))
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
        if service is not None:
            service.close()  # after the last event: the stop's are indexed too


def _check_policies(policies: tuple[str, ...]) -> None:
    """Every name registered and none twice, before the first run starts (one run
    directory per policy)."""
    from pollux_opt.scheduling.policies import policy_names

    known = policy_names()
    if not policies:
        raise InvalidProblem("policies must name at least one policy")
    for name in policies:
        if name not in known:
            raise InvalidProblem(f"policies: unknown policy {name!r} (known: {', '.join(known)})")
    if len(set(policies)) < len(policies):
        raise InvalidProblem(f"policies: a policy named twice in {list(policies)}")


def run_demo(
    out_dir: str | os.PathLike,
    workload: str = "mixed",
    *,
    quick: bool = False,
    interval: float | None = None,
    policies: tuple[str, ...] = DEMO_POLICIES,
    cluster: Cluster | ClusterTypes | None = None,
    progress: bool = True,
    import_dir: str | os.PathLike | None = None,
    service: Callable[[], Any] | None = None,
) -> dict[str, dict]:
    """Run ``workload`` under each policy one after another into ``out_dir/<policy>``,
    then write ``out_dir/comparison.json`` and the plots; return policy -> summary.
    ``service``: makes the service that watches each run (its API and
    dashboard, :class:`pollux_opt.service.server.Service` with ``open_queue=False``).

    A policy whose run directory already exists is resumed (a finished one
    just has its summary recomputed).  ``interval`` defaults to
    :data:`QUICK_INTERVAL_S` with ``quick``, else :data:`DEFAULT_INTERVAL_S`.
    ``import_dir``: where a workload file's user jobs are imported from
    (:func:`~pollux_opt.workloads.load.load_workload`); ``cluster``: as in :func:`run_workload`.
    """
    from pollux_opt.records.plots import plot_all
    from pollux_opt.workloads.load import load_workload

    _check_policies(policies)
    wl = load_workload(workload, quick=quick, import_dir=import_dir)
    interval = interval if interval is not None else (QUICK_INTERVAL_S if quick else DEFAULT_INTERVAL_S)
    out = Path(out_dir)
    summaries: dict[str, dict] = {}
    for name in policies:
        run_dir = out / safe_name("policy", name)
        existing = (run_dir / CONFIG_FILE).exists()
        summaries[name] = run_workload(
            run_dir, None if existing else wl, None if existing else name,
            cluster=cluster, interval=interval, progress=progress, service=None if service is None else service(),
        )
    runs = {name: read_events(out / name / EVENTS_FILE) for name in policies}
    plot_all(runs, summaries, out)
    atomic_write_json(out / COMPARISON_FILE, summaries)
    return summaries
