"""Step functions over a run's event log, for plots and summaries.

:func:`goodput_timeline` is cluster goodput in single-CPU equivalents (its
definition is in :mod:`pollux_opt.records.metrics`), :func:`allocation_timeline`
the CPUs each job holds, :func:`node_timeline` an autoscaled cluster's nodes.
All read the event log alone.
"""

from __future__ import annotations

import math
from typing import Sequence

from pollux_opt.model.domains import Real
from pollux_opt.records.events import goodput_model_from_json
from pollux_opt.records.replay import replay, time_ordered

__all__ = ["allocation_timeline", "goodput_timeline", "node_timeline"]

#: A progress value an event reports (a non-finite one is skipped).
_PROGRESS = Real()


def _base_rate(model_json: dict | None) -> float:
    """Progress rate (M0-iterations / s) of the model on one CPU at M0 (nan if unknown)."""
    model = goodput_model_from_json(model_json)
    if model is None:
        return math.nan
    m0 = model.limits.init_batch_size
    choice = model.optimize(1, 1, fixed_batch_size=m0)
    return float(choice.goodput) / m0 if bool(choice.feasible) else math.nan


def goodput_timeline(events: Sequence[dict]):
    """Cluster goodput (single-CPU equivalents, see module docstring) over time.

    Each job's goodput between two consecutive events that carry its
    ``progress`` (its first ``start`` counts as progress 0) is the progress
    made over the time between them (never negative: work lost to a restart
    is not goodput), divided by its single-CPU rate at M0 from the model in
    its ``complete`` event; jobs without one are left out.

    Returns a pandas DataFrame with columns ``t`` and ``goodput`` (a step
    function: the value holds from its ``t`` to the next row's).
    """
    import pandas as pd

    samples: dict[str, list[tuple[float, float]]] = {}
    base: dict[str, float] = {}
    started: set[str] = set()
    for e in time_ordered(events):
        jid = e.get("job_id")
        if jid is None:
            continue
        t = float(e["t"])
        if e["type"] == "start" and jid not in started:
            started.add(jid)
            samples.setdefault(jid, []).append((t, 0.0))
        if e["type"] == "complete":
            base[jid] = _base_rate(e.get("model"))
        p = e.get("progress")
        if _PROGRESS.accepts(p):
            samples.setdefault(jid, []).append((t, float(p)))
    deltas: dict[float, float] = {}
    for jid, pts in samples.items():
        b = base.get(jid, math.nan)
        if not (math.isfinite(b) and b > 0):
            continue
        best = -math.inf
        for (t_a, p_a), (t_b, p_b) in zip(pts, pts[1:]):
            best = max(best, p_a)
            if t_b <= t_a:
                continue
            rate = max(p_b - max(best, p_a), 0.0) / (t_b - t_a) / b
            if rate == 0.0:
                continue
            deltas[t_a] = deltas.get(t_a, 0.0) + rate
            deltas[t_b] = deltas.get(t_b, 0.0) - rate
    rows, level = [], 0.0
    for t in sorted(deltas):
        level += deltas[t]
        rows.append((t, max(level, 0.0) if abs(level) > 1e-12 else 0.0))
    return pd.DataFrame(rows, columns=["t", "goodput"])


def allocation_timeline(events: Sequence[dict]):
    """CPUs held per job over time: a DataFrame with columns ``t``, ``job_id``, ``cpus``
    (a step function per job: the value holds from its ``t`` to the job's next row)."""
    import pandas as pd

    rows = []
    for jid, job in replay(time_ordered(events)).items():
        rows.extend((t, jid, k) for t, k in job.replicas)
    return pd.DataFrame(rows, columns=["t", "job_id", "cpus"]).sort_values("t", kind="stable")


def node_timeline(events: Sequence[dict]):
    """An autoscaled run's nodes over time: a pandas DataFrame with columns
    ``t``, ``type``, ``provisioned`` (requested and not released: up or
    starting) and ``up`` (taking replicas or draining), one row per type at
    each ``scale`` event (empty for a run without one)."""
    import pandas as pd

    up: dict[str, str] = {}
    rows = []
    for e in time_ordered(events):
        if e["type"] != "scale":
            continue
        up.update(e["ready"])
        for nid in e["released"]:
            up.pop(nid, None)
        for t, count in e["sizes"].items():
            rows.append({"t": float(e["t"]), "type": t, "provisioned": int(count),
                         "up": sum(1 for kind in up.values() if kind == t)})
    return pd.DataFrame(rows, columns=["t", "type", "provisioned", "up"])
