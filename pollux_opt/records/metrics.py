"""Run metrics computed from the event log alone (real and simulated runs alike).

:func:`summarize` turns a list of events (see :mod:`pollux_opt.records.events` for the
schema and its semantics) into the ``summary.json`` dictionary; the step functions
the plots draw are in :mod:`pollux_opt.records.timelines`.

Per job: JCT (submit to complete), completed and verified flags, final
metric, restarts, CPU-seconds held (the CPU analogue of GPU-seconds) and the
finish-time fairness ``rho = JCT / JCT_isolated``.

**Isolated JCT.**  ``JCT_isolated`` is the job's JCT on an exclusive ``1/N``
share of the cluster, ``N`` being the time-average number of active
(submitted, unfinished) jobs over the job's life, including itself.  It is
estimated from the job's own fitted goodput model written in its ``complete``
event, as

    JCT_isolated = startup_s + W / R(C / N) + verify_s

* ``W``: the progress the job needed (M0-equivalent iterations, from the
  ``complete`` event);
* ``R(K)``: its progress rate (iterations per second) on ``K`` CPUs, training
  as its user submitted it: ``goodput(N_K, K, m, s) / M0`` with the submitted
  batch size split over K replicas (``GoodputModel.optimize(...,
  fixed_batch_size=B)``) and statistical efficiency at that batch included,
  on the fewest nodes that hold K; K is capped by the job's ``max_replicas``.
  A fractional share interpolates linearly between the neighbouring integer
  counts, and a share below one CPU time-slices one CPU (``R(1) * K``);
* ``startup_s``, ``verify_s``: the job's measured start and final
  verification times (0 if the log has none).

The reference is the same for every policy (the user's own configuration on
a private share), so rho values are comparable across policies; a policy that
adapts the batch can beat it (rho < 1).  It is as good as the fitted model:
with noisy reports (the simulator's ``report_noise``) it carries their noise,
job by job and run by run.

**Goodput.**  Cluster goodput at time t is the sum over jobs of each job's
measured progress rate (M0-equivalent iterations per second, from the
``progress`` of consecutive events) divided by its modelled rate on one CPU at
M0 (from the model in its ``complete`` event): progress in units of "single
CPUs running the job at its initial batch size", comparable across jobs of
different sizes.  ``avg_goodput`` is its time-average over the makespan
window.  The normaliser is a fitted model, so on a machine whose load drifts
it carries that noise too.

**Fairness.**  ``worst_rho`` = max rho, ``frac_rho_gt_1`` = fraction of
completed jobs with rho > 1, ``jain_index`` = Jain's index
``(sum x)^2 / (n sum x^2)`` of ``x_j = 1 / rho_j`` (each job's attained share of
its isolated performance; 1 = perfectly even).

**Nodes and cost.**  ``node_hours``: node-hours billed between the first
submission and the last completion.  A run on Ray bills each node from its
joining to its leaving (``nodes`` events); an autoscaled simulation, from its
request to its release (``scale`` events); a fixed cluster, its nodes
(``nodes`` of ``run_start``, per type) throughout.  ``cost``: node-hours times
each type's price per node-hour (``node_prices`` of ``run_start``; null
without prices).

**Scheduler overhead.**  From the ``allocation`` events: per-round wall time
outside the jobs' work (``overhead_s``, which includes the policy's solver
time, plus ``poll_s``, the backend's bookkeeping since the previous round), as
a percentage of the round interval (mean and max over rounds), and in total as
a percentage of the makespan.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model.cluster import DEFAULT_NODE_TYPE
from pollux_opt.model.domains import Integer, check
from pollux_opt.model.goodput import isolated_rate as model_isolated_rate
from pollux_opt.records.events import goodput_model_from_json, jsonable
from pollux_opt.records.replay import JobTrack, replay, time_ordered
from pollux_opt.records.timelines import goodput_timeline

__all__ = [
    "node_usage",
    "summarize",
    "isolated_rate",
    "jain_index",
    "compare_table",
    "COMPARE_COLUMNS",
]

#: The CPUs of the cluster a run's summary is computed for.
_CLUSTER_CPUS = Integer(ge=1)


def _num(x) -> float:
    return math.nan if x is None else float(x)


def _active_count(jobs: Mapping[str, JobTrack], t_end: float) -> tuple[np.ndarray, np.ndarray]:
    """Step function (times, count) of active jobs; count[i] holds on [times[i], times[i+1])."""
    deltas: list[tuple[float, int]] = []
    for job in jobs.values():
        if math.isnan(job.submit):
            continue
        deltas.append((job.submit, 1))
        deltas.append((job.end if not math.isnan(job.end) else t_end, -1))
    if not deltas:
        return np.zeros(0), np.zeros(0)
    deltas.sort()
    times = np.array([d[0] for d in deltas])
    counts = np.cumsum([d[1] for d in deltas])
    return times, counts


def _average_step(times: np.ndarray, values: np.ndarray, a: float, b: float) -> float:
    """Time-average over [a, b] of the right-continuous step function (times, values), 0 before times[0]."""
    if b <= a:
        return math.nan
    edges = np.concatenate([[a], np.clip(times, a, b), [b]])
    vals = np.concatenate([[0.0], values])
    # value on [edges[i], edges[i+1]) is vals[i] where times are sorted
    total = float(np.sum(np.diff(edges) * vals))
    return total / (b - a)


def isolated_rate(model_json: dict, cpus: float, batch_size: int, max_replicas: int | None,
                  node_cpus: int | None = None) -> float:
    """:func:`pollux_opt.model.goodput.isolated_rate` of the model written in a
    ``complete`` event (nan without one)."""
    model = goodput_model_from_json(model_json)
    return math.nan if model is None else model_isolated_rate(model, cpus, batch_size, max_replicas, node_cpus)


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n sum x^2)`` (nan for no values)."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if x.size == 0 or not np.any(x):
        return math.nan
    return float(x.sum() ** 2 / (x.size * np.square(x).sum()))


def _cluster_info(events: Sequence[dict]) -> tuple[str | None, float | None]:
    policy, interval = None, None
    for e in events:
        if e["type"] == "run_start" and policy is None:
            policy = e.get("policy")
        if e["type"] == "allocation" and interval is None and e.get("interval_s") is not None:
            interval = float(e["interval_s"])
    return policy, interval


def _stat(fn, arr: np.ndarray) -> float:
    """``fn`` over the finite entries of ``arr``; nan if there are none."""
    arr = arr[np.isfinite(arr)]
    return float(fn(arr)) if arr.size else math.nan


def _cluster_cpus(starts: Sequence[dict], cluster_cpus: int | None) -> int:
    if cluster_cpus is None:
        cluster_cpus = next((e.get("cluster_cpus") for e in starts if e.get("cluster_cpus")), None)
    if cluster_cpus is None:
        raise InvalidProblem("cluster_cpus must be given when the log has no run_start event with it")
    return check("cluster_cpus", cluster_cpus, _CLUSTER_CPUS)


def _job_row(job: JobTrack, times: np.ndarray, counts: np.ndarray, cluster_cpus: int,
             node_cpus: int | None) -> dict:
    """One job's entry of the summary: JCT and its finish-time fairness rho
    against an isolated run on ``cluster_cpus / (average active jobs)`` CPUs."""
    jct = job.end - job.submit if job.completed else math.nan
    n_avg = rho = jct_iso = share = math.nan
    if job.completed and jct > 0:
        n_avg = _average_step(times, counts.astype(float), job.submit, job.end)
        n_avg = max(n_avg, 1.0)
        share = cluster_cpus / n_avg
        batch = job.submitted_batch_size
        if job.model is not None and batch and math.isfinite(job.progress):
            r = isolated_rate(job.model, share, int(batch), job.max_replicas, node_cpus)
            if math.isfinite(r) and r > 0:
                jct_iso = job.startup_s + job.progress / r + job.verify_s
                rho = jct / jct_iso
    return {
        "id": job.id,
        "submit_s": job.submit,
        "end_s": job.end,
        "jct_s": jct,
        "completed": job.completed,
        "verified": job.verified,
        "failed": job.failed,
        "cancelled": job.cancelled,
        "final_metric": job.final_metric,
        "restarts": job.restarts,
        "cpu_seconds": job.cpu_seconds,
        "avg_active_jobs": n_avg,
        "share_cpus": share,
        "jct_isolated_s": jct_iso,
        "rho": rho,
    }


def _round_metrics(events: Sequence[dict], window: float) -> dict:
    """Scheduler overhead and solver time per allocation round."""
    rounds = [e for e in events if e["type"] == "allocation"]
    overhead = np.array([_num(e.get("overhead_s")) + (_num(e.get("poll_s")) if e.get("poll_s") is not None else 0.0)
                         for e in rounds], dtype=float)
    solver = np.array([_num(e.get("solver_s")) for e in rounds], dtype=float)
    intervals = np.array([_num(e.get("interval_s")) for e in rounds], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        pct = 100.0 * overhead / intervals
    return {
        "rounds": len(rounds),
        "mean_overhead_s": _stat(np.mean, overhead),
        "max_overhead_s": _stat(np.max, overhead),
        "mean_solver_s": _stat(np.mean, solver),
        "overhead_pct_of_interval": _stat(np.mean, pct),
        "max_overhead_pct_of_interval": _stat(np.max, pct),
        "mean_load1": _stat(np.mean, np.array([_num(e.get("load1")) for e in rounds], dtype=float)),
        "overhead_pct_of_wall": 100.0 * float(np.nansum(overhead)) / window if window > 0 else math.nan,
    }


def _billed(events: Sequence[dict]) -> list[tuple[str, float, float]] | None:
    """``(type, from, to)`` per node of the log (``to`` inf: never released):
    the nodes Ray had (``nodes`` events: joined to left), else the autoscaled
    nodes requested (``scale`` events: request to release); None where neither."""
    spans: list[tuple[str, float, float]] = []
    since: dict[str, tuple[str, float]] = {}
    ray = any(e["type"] == "nodes" for e in events)
    for e in events:
        if e["type"] != ("nodes" if ray else "scale"):
            continue
        t = float(e["t"])
        if ray:
            types = {n["id"]: n.get("type", DEFAULT_NODE_TYPE) for n in e["cluster"]}
            gone, new = e["left"], {nid: types.get(nid, DEFAULT_NODE_TYPE) for nid in e["joined"]}
        else:
            gone, new = e["released"], e["requested"]
        for nid in gone:
            if nid in since:
                kind, start = since.pop(nid)
                spans.append((kind, start, t))
        for nid, kind in new.items():
            since.setdefault(nid, (kind, t))
    spans += [(kind, start, math.inf) for kind, start in since.values()]
    return spans if ray or any(e["type"] == "scale" for e in events) else None


def node_usage(events: Sequence[dict], t0: float, t1: float) -> dict[str, float | None]:
    """Node-hours billed within ``[t0, t1]`` (seconds) and their cost (see the module docstring).

    Returns ``{"node_hours": ..., "cost": ...}``; nan node-hours where the log
    says neither the nodes nor their requests, a null cost without prices."""
    start = next((e for e in events if e["type"] == "run_start"), {})
    prices = start.get("node_prices")
    spans = _billed(events)
    if spans is None and start.get("nodes"):
        spans = [(kind, t0, t1) for kind, count in start["nodes"].items() for _ in range(int(count))]
    if spans is None:
        return {"node_hours": math.nan, "cost": None}
    hours: dict[str, float] = {}
    for kind, a, b in spans:
        hours[kind] = hours.get(kind, 0.0) + max(0.0, min(b, t1) - max(a, t0)) / 3600.0
    cost = None if not prices else sum(h * float(prices.get(kind, 1.0)) for kind, h in hours.items())
    return {"node_hours": sum(hours.values()), "cost": cost}


def summarize(events: Sequence[dict], cluster_cpus: int | None = None, *, node_cpus: int | None = None) -> dict:
    """The ``summary.json`` dictionary of a run, from its events alone.

    Args:
        events: the run's events (as :func:`pollux_opt.records.events.read_events` returns them).
        cluster_cpus: CPUs in the cluster (default: ``cluster_cpus`` of the
            first ``run_start`` event).
        node_cpus: CPUs of the largest node, for the isolated-JCT estimate
            (default: ``node_cpus`` of the first ``run_start`` event, else one node).

    Returns:
        A JSON-ready dict (nan written as None) with ``policy``, ``jobs`` (each
        with ``id``, ``jct_s``, ``completed``, ``final_metric``, ``restarts``,
        ``rho`` and more) and the cluster metrics named in the module docstring.
    """
    events = time_ordered(events)
    for e in events:
        if "t" not in e or "type" not in e:
            raise InvalidProblem(f"event needs 't' and 'type', got {e!r}")
    starts = [e for e in events if e["type"] == "run_start"]
    cluster_cpus = _cluster_cpus(starts, cluster_cpus)
    if node_cpus is None:
        node_cpus = next((e.get("node_cpus") for e in starts if e.get("node_cpus")), None)
    policy, interval = _cluster_info(events)
    jobs = replay(events)
    t_last = float(events[-1]["t"]) if events else 0.0
    submits = [j.submit for j in jobs.values() if not math.isnan(j.submit)]
    t0 = min(submits) if submits else 0.0
    ends = [j.end if not math.isnan(j.end) else t_last for j in jobs.values()]
    t1 = max(ends) if ends else t_last
    for job in jobs.values():  # close open holdings at the end of the log
        job.account(t1)
    times, counts = _active_count(jobs, t1)
    out_jobs = [_job_row(job, times, counts, cluster_cpus, node_cpus)
                for job in sorted(jobs.values(), key=lambda j: (j.submit, j.id))]
    jcts = np.array([j["jct_s"] for j in out_jobs if j["completed"]], dtype=float)
    rhos = np.array([j["rho"] for j in out_jobs if math.isfinite(j["rho"])], dtype=float)
    window = t1 - t0
    cpu_s = sum(j.cpu_seconds for j in jobs.values())
    gp = goodput_timeline(events)
    avg_goodput = (
        _average_step(gp["t"].to_numpy(), gp["goodput"].to_numpy(), t0, t1) if len(gp) and window > 0 else math.nan
    )
    rounds = _round_metrics(events, window)
    summary = {
        "policy": policy,
        "cluster_cpus": int(cluster_cpus),
        "num_jobs": len(out_jobs),
        "num_completed": int(sum(j["completed"] for j in out_jobs)),
        "num_failed": int(sum(j["failed"] for j in out_jobs)),
        "num_cancelled": int(sum(j["cancelled"] for j in out_jobs)),
        "jobs": out_jobs,
        "avg_jct_s": _stat(np.mean, jcts),
        "p50_jct_s": _stat(np.median, jcts),
        "p99_jct_s": _stat(lambda a: np.percentile(a, 99), jcts),
        "makespan_s": window if out_jobs else math.nan,
        "avg_goodput": avg_goodput,
        "utilization": cpu_s / (cluster_cpus * window) if window > 0 else math.nan,
        "cpu_seconds": cpu_s,
        "worst_rho": _stat(np.max, rhos),
        "frac_rho_gt_1": float(np.mean(rhos > 1.0)) if rhos.size else math.nan,
        "jain_index": jain_index([1.0 / r for r in rhos if r > 0]),
        **node_usage(events, t0, t1),
        "rounds": rounds.pop("rounds"),
        "interval_s": interval,
        **rounds,
    }
    return jsonable(summary)


#: Columns of :func:`compare_table`: summary key -> column title.
COMPARE_COLUMNS = {
    "policy": "policy",
    "workload": "workload",
    "num_completed": "done",
    "avg_jct_s": "avg JCT (s)",
    "p50_jct_s": "p50 JCT (s)",
    "p99_jct_s": "p99 JCT (s)",
    "makespan_s": "makespan (s)",
    "avg_goodput": "avg goodput",
    "utilization": "util",
    "worst_rho": "worst rho",
    "frac_rho_gt_1": "rho>1",
    "jain_index": "Jain",
    "overhead_pct_of_interval": "overhead %",
    "mean_load1": "load avg",
}


def compare_table(summaries: Mapping[str, dict]):
    """A pandas DataFrame, one row per run (label -> summary), columns :data:`COMPARE_COLUMNS`."""
    import pandas as pd

    rows = []
    for label, s in summaries.items():
        row = {"run": label}
        for key, title in COMPARE_COLUMNS.items():
            row[title] = s.get(key)
        rows.append(row)
    return pd.DataFrame(rows).set_index("run")
