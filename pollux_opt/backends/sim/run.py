"""Run one simulated workload through the shared scheduler loop into a run directory.

The run directory matches a real run's: ``events.jsonl`` (the unified event
log) and ``summary.json`` (from the shared metrics module when present), plus
``jobs.csv`` with one row per simulated job.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from solvers import InvalidProblem

from pollux_opt.records import metrics as _metrics
from pollux_opt.scheduling.policies import Requirement, make_policy
from pollux_opt.records.events import EventLog, jsonable, read_events
from pollux_opt.records.files import atomic_write_csv, atomic_write_json
from pollux_opt.model import Cluster
from pollux_opt.model.domains import Integer, Real, check
from pollux_opt.scheduling.autoscale import Autoscaler, ScaleOptions, node_prices
from pollux_opt.scheduling.loop import run as run_loop
from pollux_opt.backends.sim.backend import SimBackend
from pollux_opt.backends.sim.provision import SimNodes
from pollux_opt.backends.sim.state import SIM_DEFAULT_CPUS_PER_NODE, SIM_DEFAULT_INTERVAL_S, SIM_DEFAULT_NODES, SimConfig
from pollux_opt.backends.sim.traces import Profile
from pollux_opt.workloads.job import WorkloadJob

__all__ = ["MAX_ARRIVAL_ROUNDS", "MAX_SIM_CPUS", "MIN_INTERVAL_S", "SimResult", "quiet_library_logs", "run_tasks",
           "simulate"]


@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`simulate` (times in seconds)."""

    policy: str
    num_jobs: int
    completed: int
    avg_jct: float
    p99_jct: float
    makespan: float
    rounds: int
    wall_seconds: float
    solver_seconds: float
    out_dir: str | None
    #: Node-hours billed from the first submission to the last completion, and
    #: their cost at the run's prices (None without prices).
    node_hours: float = math.nan
    cost: float | None = None


#: Shortest scheduling interval of a simulation, seconds.  Pollux schedules every
#: 60 s; below a second the rounds, not the jobs, dominate the run, and a round
#: count of (workload span / interval) no longer finishes.
MIN_INTERVAL_S = 1.0
#: The last arrival must come within this many rounds of the start (69 days at
#: Pollux's 60 s; 28 hours at 1 s): the loop runs every round until then, so a
#: far arrival (1e300 s) would never be reached.
MAX_ARRIVAL_ROUNDS = 100_000
#: Largest simulated cluster, replica slots in all: 32 x the largest size the
#: scale experiment measured (2048, experiments/sim_scale.py); every policy
#: keeps per-node state, so 10**5 nodes would stall in the first round.
MAX_SIM_CPUS = 65_536
_INTERVAL = Real(ge=MIN_INTERVAL_S, unit="seconds")

#: The library's top-level loggers (the simulator, policies and solvers log under these).
LIBRARY_LOGGERS = ("pollux_opt", "solvers")
#: Worker processes of :func:`run_tasks` (1: none, in this process).
_WORKERS = Integer(ge=1)


def quiet_library_logs(level: int = logging.ERROR) -> None:
    """Raise the library's loggers to ``level``: in an experiment's worker, the
    simulator's own warnings (e.g. an over-committed node, a fit that did not
    converge) would drown the experiment's progress lines."""
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)


def run_tasks(fn: Callable[[Any], Any], tasks: Sequence[Any], *, jobs: int = 1,
              on_result: Callable[[Any, Any], None] | None = None) -> list:
    """``[fn(t) for t in tasks]``, in ``jobs`` worker processes (in this process
    when 1); ``on_result(task, result)`` is called as each one finishes (e.g.
    to advance a progress bar or write partial results).

    ``fn`` must be a top-level function and the tasks picklable when ``jobs > 1``
    (workers start from a fork server, or are spawned, never forked).
    Results come back in the order of ``tasks``.
    """
    jobs = check("jobs", jobs, _WORKERS)
    results: list = [None] * len(tasks)
    with contextlib.ExitStack() as stack:
        if jobs == 1:
            done = ((i, fn(task)) for i, task in enumerate(tasks))
        else:
            # Not fork: the caller may hold threads (JAX, torch, a progress bar), and a
            # forked child of a multithreaded process can deadlock.
            methods = mp.get_all_start_methods()
            context = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
            pool = stack.enter_context(ProcessPoolExecutor(max_workers=jobs, mp_context=context))
            futures = {pool.submit(fn, task): i for i, task in enumerate(tasks)}
            done = ((futures[future], future.result()) for future in as_completed(futures))
        for i, result in done:
            results[i] = result
            if on_result is not None:
                on_result(tasks[i], result)
    return results


def simulate(
    jobs: Sequence[WorkloadJob],
    profiles: Mapping[str, Profile],
    policy: str | Any,
    *,
    cluster: Cluster | None = None,
    interval: float = SIM_DEFAULT_INTERVAL_S,
    config: SimConfig | None = None,
    out_dir=None,
    policy_options: Mapping[str, Any] | None = None,
    max_rounds: int | None = None,
    progress: Callable | None = None,
    autoscale: ScaleOptions | None = None,
    prices: Mapping[str, float] | None = None,
) -> SimResult:
    """Simulate ``jobs`` under ``policy`` (a name or a policy object).

    Args:
        jobs: the workload.
        profiles: application -> true profile.
        policy: a registered policy name (see :data:`pollux_opt.scheduling.policies.POLICIES`;
            the simulator provides every requirement, e.g. Optimus' oracle) or a Policy.
        cluster: default 16 nodes x 4 (the paper's cluster).
        interval: scheduling interval, seconds.
        config: simulation settings.
        out_dir: run directory (events.jsonl, summary.json, jobs.csv); None: no files.
        policy_options: keyword options of the named policy.
        max_rounds: stop after this many rounds.
        progress: per-round callback of the scheduler loop.
        autoscale: size the cluster each round (``cluster`` is then the
            largest one; nodes start after ``autoscale.startup_s`` and are
            billed until released); None: every node throughout.
        prices: price per node-hour of each node type, for the summary's
            ``cost`` and the autoscaler's choice of type (None: no cost;
            the autoscaler takes every type at 1).

    Raises:
        InvalidProblem: an interval below :data:`MIN_INTERVAL_S`, a cluster of
            more than :data:`MAX_SIM_CPUS` slots, a job arriving later than
            :data:`MAX_ARRIVAL_ROUNDS` intervals, or a bad job or setting.
    """
    cluster = cluster or Cluster.uniform(SIM_DEFAULT_NODES, SIM_DEFAULT_CPUS_PER_NODE)
    _check_scale(jobs, cluster, interval)
    t0 = time.perf_counter()
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "events.jsonl").unlink(missing_ok=True)  # a simulation is deterministic: rerun from scratch
    # Rerun from scratch, never resumed: one fsync at the end instead of one per event.
    events = EventLog(out / "events.jsonl", durable=False, ordered=False) if out is not None else None
    scaler = None if autoscale is None else Autoscaler(cluster, autoscale, prices=prices)
    price_table = None if prices is None else node_prices(prices, cluster)
    with events or contextlib.nullcontext():
        nodes = None if scaler is None else SimNodes(cluster, scaler.initial(), startup_s=autoscale.startup_s,
                                                     events=events)
        backend = SimBackend(jobs, profiles, cluster, events, config, nodes=nodes)
        provides = {Requirement.ORACLE: backend.oracle}
        pol = (make_policy(policy, provides=provides, **dict(policy_options or {}))
               if isinstance(policy, str) else policy)
        backend.fixed_batch = pol.fixed_batch  # the policy's, before its first round
        start = backend.events.emit(
            "run_start", 0.0, None, policy=pol.name, resumed=False, simulated=True,
            cluster_cpus=cluster.total_cpus, node_cpus=max(n.cpus for n in cluster.nodes),
            nodes={t: len(cluster.of_type(t)) for t in cluster.types}, node_prices=price_table,
            autoscale=None if autoscale is None else asdict(autoscale))
        if nodes is not None:
            nodes.announce(0.0)
        solver_s = [0.0]

        def on_round(now, views, decision):
            solver_s[0] += decision.solver_seconds
            if progress is not None:
                progress(now, views, decision)

        rounds = run_loop(backend, pol, cluster, backend.events, interval=interval, progress=on_round,
                          max_rounds=max_rounds, autoscaler=scaler)
    jct = np.array(sorted(backend.jcts().values()))
    records = backend.job_records()
    done = [r["completion_time"] for r in records if r["completion_time"] is not None]
    first = min((r["submit_time"] for r in records), default=0.0)
    usage = _metrics.node_usage([{**start, "type": "run_start", "node_prices": price_table,
                                  "nodes": {t: len(cluster.of_type(t)) for t in cluster.types}},
                                 *([] if nodes is None else nodes.history)],
                                first, max(done, default=first))
    wall = time.perf_counter() - t0
    result = SimResult(
        policy=pol.name, num_jobs=len(records), completed=int(jct.size),
        avg_jct=float(jct.mean()) if jct.size else math.nan,
        p99_jct=float(np.percentile(jct, 99)) if jct.size else math.nan,
        makespan=float(max(done) - first) if done else math.nan,
        node_hours=usage["node_hours"], cost=usage["cost"],
        rounds=rounds, wall_seconds=wall, solver_seconds=solver_s[0],
        out_dir=None if out is None else str(out),
    )
    if out is not None:
        atomic_write_csv(out / "jobs.csv", pd.DataFrame(records))
        summary = _summary(out, result, config or SimConfig(), interval, cluster)
        atomic_write_json(out / "summary.json", summary)
    return result


def _check_scale(jobs: Sequence[WorkloadJob], cluster: Cluster, interval: float) -> None:
    """Reject a simulation that would not finish: see :data:`MIN_INTERVAL_S`,
    :data:`MAX_ARRIVAL_ROUNDS` and :data:`MAX_SIM_CPUS`."""
    check("interval", interval, _INTERVAL)
    if cluster.total_cpus > MAX_SIM_CPUS:
        raise InvalidProblem(f"the simulated cluster must have at most MAX_SIM_CPUS = {MAX_SIM_CPUS} replica slots, "
                             f"got {len(cluster.nodes)} nodes with {cluster.total_cpus} in all")
    late = max(jobs, key=lambda j: j.arrival_s, default=None)
    if late is not None and late.arrival_s > MAX_ARRIVAL_ROUNDS * interval:
        raise InvalidProblem(
            f"job {late.id!r}: arrival_s must be within MAX_ARRIVAL_ROUNDS = {MAX_ARRIVAL_ROUNDS} rounds of "
            f"{interval:g} s ({MAX_ARRIVAL_ROUNDS * interval:g} s), got {late.arrival_s:g}"
        )


def _summary(out: Path, result: SimResult, config: SimConfig, interval: float, cluster: Cluster) -> dict:
    """The shared metrics' summary of the event log, plus the simulation's own fields."""
    summary = _metrics.summarize(read_events(out / "events.jsonl"))
    summary["simulation"] = {
        **asdict(result), "config": asdict(config), "interval_s": interval,
        "nodes": len(cluster.nodes), "cpus": cluster.total_cpus,
    }
    return jsonable(summary)
