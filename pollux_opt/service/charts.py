"""The dashboard's charts over time, drawn by the server as SVG from the index
(:meth:`pollux_opt.service.db.Store.history`): no chart library in the page.

Each chart is step lines (or stacked steps) over Unix time, the x axis in the
viewer's local time (``tz_offset_s``, seconds east of UTC, sent by the page),
a unit on the y axis.  Text that comes from users (job names) is escaped.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping, Sequence
from xml.sax.saxutils import escape

import numpy as np

from pollux_opt.lifecycle import JobState

__all__ = ["CHARTS", "JOB_CHARTS", "JOB_ONLY", "Series", "chart_series", "for_job", "render_svg"]

#: The charts, by name: their title and y axis label (with its unit).
CHARTS = {
    "allocations": ("CPUs held by each job", "CPUs"),
    "goodput": ("cluster goodput (sum of the running jobs' measured goodput)", "samples/s"),
    "utilisation": ("CPUs allocated", "% of the cluster"),
    "jobs": ("jobs queued and running", "jobs"),
    "decisions": ("each round's decision time", "ms"),
    "batch": ("each job's total batch size", "samples"),
    "step_time": ("step time: measured, and the job's throughput model's for the configuration that ran",
                  "s per step"),
    "efficiency": ("statistical efficiency against the total batch size, at the last measured noise scale",
                   "E(M)"),
}
#: The charts that can show one job (``for_job``) ...
JOB_CHARTS = ("allocations", "goodput", "batch", "step_time", "efficiency")
#: ... and those that show one job only: what the scheduler believes about it (Pollux's goodput model).
JOB_ONLY = ("step_time", "efficiency")
#: Batch sizes at which the efficiency curve is drawn, from M0 to the job's largest batch (geometric).
EFFICIENCY_POINTS = 48
#: Colours of the series, in order (Tableau 10); the page colours jobs in the same order.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")
#: Most series a chart draws: the allocation chart stacks the jobs that held
#: the most CPU-seconds and the others together, the batch chart the jobs that
#: reported last (hundreds of series would make a page that no longer scrolls smoothly).
SERIES_MAX = 10
#: Most series named in a chart's legend.
LEGEND_MAX = 8
#: Candidate x tick spacings, seconds: the first giving at most ``X_TICKS`` ticks is used.
TIME_STEPS_S = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
X_TICKS, Y_TICKS = 6, 4
#: The plot's margins inside the SVG, pixels: left (y labels), right, top (legend), bottom (x labels).
MARGIN = (56, 12, 22, 34)
_ACTIVE = frozenset({JobState.RUNNING.value, JobState.RESCALING.value})


@dataclass(frozen=True)
class Series:
    """One step series: the value ``ys[i]`` holds from ``xs[i]`` to ``xs[i + 1]`` (Unix seconds)."""

    label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    steps: bool = True  # False: a line through the points (a curve, not values held over time)


def chart_series(name: str, history: Mapping[str, Sequence[Mapping]], *, total_cpus: int,
                 job: str | None = None) -> list[Series]:
    """The series of chart ``name`` (a key of :data:`CHARTS`) from a history
    (of job ``job`` alone if given: one of :data:`JOB_CHARTS`; the :data:`JOB_ONLY` need it)."""
    if job is not None:
        history = for_job(history, job)
    if name in JOB_ONLY:
        return _model_view(name, history.get("reports", []))
    rounds, transitions = history.get("rounds", []), history.get("transitions", [])
    if name == "allocations":
        jobs = list(dict.fromkeys(j for r in rounds for j in r["placement"]))
        times = tuple(r["t"] for r in rounds)
        cpus = {j: [float(sum(r["placement"].get(j, {}).values())) for r in rounds] for j in jobs}
        kept = sorted(jobs, key=lambda j: -sum(cpus[j]))[:SERIES_MAX - 1] if len(jobs) > SERIES_MAX else jobs
        kept = set(kept)
        out = [Series(f"job {j}", times, tuple(cpus[j])) for j in jobs if j in kept]
        rest = [j for j in jobs if j not in kept]
        if rest:  # the jobs that held the fewest CPU-seconds, together
            out.append(Series(f"{len(rest)} other jobs", times, tuple(map(sum, zip(*(cpus[j] for j in rest))))))
        return out
    if name == "utilisation":
        return [Series("allocated", tuple(r["t"] for r in rounds),
                       tuple(100.0 * sum(sum(p.values()) for p in r["placement"].values()) / max(total_cpus, 1)
                             for r in rounds))]
    if name == "decisions":
        timed = [r for r in rounds if r.get("solver_s") is not None]
        return [Series("decision", tuple(r["t"] for r in timed), tuple(1000.0 * r["solver_s"] for r in timed))]
    if name == "jobs":
        return _job_counts(transitions)
    if name == "goodput":
        return [_cluster_goodput(history.get("reports", []), transitions, "cluster" if job is None else f"job {job}")]
    if name == "batch":
        by_job: dict[str, list[Mapping]] = {}
        for r in history.get("reports", []):
            if r.get("batch_size") is not None:
                by_job.setdefault(r["job_id"], []).append(r)
        latest = set(sorted(by_job, key=lambda j: by_job[j][-1]["t"])[-SERIES_MAX:])  # the most recently reporting
        return [Series(f"job {j}", tuple(r["t"] for r in by_job[j]), tuple(float(r["batch_size"]) for r in by_job[j]))
                for j in by_job if j in latest]
    raise KeyError(name)


def _model_view(name: str, reports: Sequence[Mapping]) -> list[Series]:
    """One job's measurements against its goodput model: step times over time
    (M / throughput, measured and predicted), or E(M) = (phi + M0) / (phi + M)
    over M0..its largest batch at the last noise scale phi (Pollux eq. 2), with its batch then."""
    if name == "step_time":
        def step_time(key: str) -> Series:
            kept = [r for r in reports if r.get(key) and r.get("batch_size")]
            return Series("measured" if key == "throughput" else "model", tuple(r["t"] for r in kept),
                          tuple(r["batch_size"] / r[key] for r in kept))
        return [step_time("throughput"), step_time("predicted_throughput")]
    last = next((r for r in reversed(reports) if r.get("noise_scale") is not None and r.get("init_batch_size")),
                None)
    if last is None:
        return []
    phi, m0 = float(last["noise_scale"]), float(last["init_batch_size"])
    top = max(float(last.get("max_batch_size") or m0), float(last.get("batch_size") or m0), m0 + 1)
    batches = tuple(float(m) for m in np.unique(np.geomspace(m0, top, EFFICIENCY_POINTS).round()))
    now = float(last.get("batch_size") or m0)
    e_now = (phi + m0) / (phi + now)
    return [Series("E(M)", batches, tuple((phi + m0) / (phi + m) for m in batches), steps=False),
            Series(f"batch now ({now:g})", (now, now), (0.0, e_now), steps=False)]


def for_job(history: Mapping[str, Sequence[Mapping]], job_id: str) -> dict[str, list[dict]]:
    """The part of ``history`` about job ``job_id``: its transitions and
    reports, and the rounds from the first that placed it on (its placement alone)."""
    rounds = list(history.get("rounds", []))
    first = next((i for i, r in enumerate(rounds) if r["placement"].get(job_id)), len(rounds))
    return {
        "rounds": [{**r, "placement": {job_id: r["placement"].get(job_id, {})}} for r in rounds[first:]],
        "transitions": [m for m in history.get("transitions", []) if m["job_id"] == job_id],
        "reports": [r for r in history.get("reports", []) if r["job_id"] == job_id],
    }


def _job_counts(transitions: Sequence[Mapping]) -> list[Series]:
    """Jobs queued and jobs running (or rescaling) after each state change."""
    state: dict[str, str] = {}
    xs, queued, running = [], [], []
    for move in transitions:
        state[move["job_id"]] = move["new"]
        xs.append(move["t"])
        queued.append(float(sum(s == JobState.QUEUED.value for s in state.values())))
        running.append(float(sum(s in _ACTIVE for s in state.values())))
    return [Series("queued", tuple(xs), tuple(queued)), Series("running", tuple(xs), tuple(running))]


def _cluster_goodput(reports: Sequence[Mapping], transitions: Sequence[Mapping], label: str) -> Series:
    """The sum of each running job's last reported goodput, after each report
    or state change (a job that stops running stops counting)."""
    moments = sorted([(r["t"], 0, r) for r in reports] + [(m["t"], 1, m) for m in transitions],
                     key=lambda x: (x[0], x[1]))
    last: dict[str, float] = {}
    xs, ys = [], []
    for t, kind, item in moments:
        if kind == 0:
            last[item["job_id"]] = float(item["goodput"] or 0.0)
        elif item["new"] not in _ACTIVE:
            last.pop(item["job_id"], None)
        xs.append(t)
        ys.append(sum(last.values()))
    return Series(label, tuple(xs), tuple(ys))


# ------------------------------------------------------------------ drawing
def _nice_step(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (1 if nothing to show)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    return next(k * base for k in (1, 2, 2.5, 5, 10) if k * base >= value)


def _clock(t: float, step: float, tz_offset_s: float) -> str:
    return time.strftime("%H:%M:%S" if step < 60 else "%H:%M", time.gmtime(t + tz_offset_s))


def _number(v: float) -> str:
    """``v`` in at most four characters or so: 0.5, 12, 250k, 1.5M."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= factor:
            return f"{v / factor:g}{suffix}"
    return f"{v:g}"


def render_svg(name: str, series: Sequence[Series], *, start: float, end: float, tz_offset_s: float = 0.0,
               width: int = 640, height: int = 200) -> str:
    """Chart ``name`` of ``series`` from Unix time ``start`` to ``end`` as an SVG document.

    Allocations are stacked; the other charts draw one step line per series.
    """
    title, unit = CHARTS[name]
    stacked = name == "allocations"
    by_batch = name == "efficiency"  # x: samples, not time
    left, right, top, bottom = MARGIN
    w, h = width - left - right, height - top - bottom
    end = max(end, start + 1.0)
    totals = _stack(series) if stacked else None
    peak = max([y for s in (totals or series) for y in s.ys] or [0.0])
    ystep = _nice_step(peak / Y_TICKS)
    if name == "jobs" or stacked:  # whole jobs and CPUs
        ystep = max(1.0, math.ceil(ystep))
    ticks = max(1, math.ceil(peak / ystep))
    ymax = ystep * ticks

    def px(t: float) -> float:
        return left + w * (min(max(t, start), end) - start) / (end - start)

    def py(v: float) -> float:
        return top + h * (1.0 - v / ymax)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
           f'data-chart="{name}" font-family="system-ui, sans-serif" font-size="11">',
           f"<title>{escape(title)}</title>"]
    if by_batch:
        step, tz_offset_s = _nice_step((end - start) / X_TICKS), 0.0
    else:
        step = next((s for s in TIME_STEPS_S if (end - start) / s <= X_TICKS), TIME_STEPS_S[-1])
    for tick in range(int(math.ceil((start + tz_offset_s) / step)), int((end + tz_offset_s) // step) + 1):
        t = tick * step - tz_offset_s
        anchor = "end" if px(t) > left + w - 24 else "start" if px(t) < left + 24 else "middle"  # in the frame
        out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top}" y2="{top + h}" stroke="#e3e7eb"/>'
                   f'<text x="{px(t):.1f}" y="{top + h + 14}" text-anchor="{anchor}">'
                   f"{_number(t) if by_batch else _clock(t, step, tz_offset_s)}</text>")
    for k in range(ticks + 1):
        v = ystep * k
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#e3e7eb"/>'
                   f'<text x="{left - 4}" y="{py(v) + 4:.1f}" text-anchor="end">{_number(v)}</text>')
    out.append(f'<text x="12" y="{top + h / 2:.0f}" transform="rotate(-90 12 {top + h / 2:.0f})" '
               f'text-anchor="middle">{escape(unit)}</text>')
    out.append(f'<text x="{left + w / 2:.0f}" y="{height - 2}" text-anchor="middle">'
               f'{"total batch size (samples)" if by_batch else "local time"}</text>')
    drawn = totals or series
    for i, s in enumerate(drawn):
        colour = PALETTE[i % len(PALETTE)]
        points = _steps(s, end) if s.steps else list(zip(s.xs, s.ys))
        if not points:
            continue
        line = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in points)
        if stacked:
            below = _steps(drawn[i - 1], end) if i else [(points[0][0], 0.0), (points[-1][0], 0.0)]
            back = " ".join(f"{px(t):.1f},{py(v):.1f}" for t, v in reversed(below))
            out.append(f'<polygon class="series" points="{line} {back}" fill="{colour}" fill-opacity="0.85">'
                       f"<title>{escape(s.label)}</title></polygon>")
        else:
            out.append(f'<polyline class="series" points="{line}" fill="none" stroke="{colour}" stroke-width="2">'
                       f"<title>{escape(s.label)}</title></polyline>")
    if not any(s.xs for s in series):
        out.append(f'<text x="{left + w / 2:.0f}" y="{top + h / 2:.0f}" text-anchor="middle" fill="#5f6b76">'
                   "nothing yet</text>")
    x = left
    for i, s in enumerate(drawn[:LEGEND_MAX]):
        out.append(f'<rect x="{x}" y="4" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>'
                   f'<text x="{x + 14}" y="13">{escape(s.label)}</text>')
        x += 22 + 7 * len(s.label)
    if len(drawn) > LEGEND_MAX:
        out.append(f'<text x="{x}" y="13">and {len(drawn) - LEGEND_MAX} more</text>')
    out.append("</svg>")
    return "".join(out)


def _steps(s: Series, end: float) -> list[tuple[float, float]]:
    """The corners of step series ``s`` held until ``end``."""
    points: list[tuple[float, float]] = []
    for i, (t, v) in enumerate(zip(s.xs, s.ys)):
        if points:
            points.append((t, points[-1][1]))
        points.append((t, v))
        if i == len(s.xs) - 1:
            points.append((max(end, t), v))
    return points


def _stack(series: Sequence[Series]) -> list[Series]:
    """Each series plus those before it (all share the rounds' times)."""
    out, below = [], None
    for s in series:
        ys = s.ys if below is None else tuple(a + b for a, b in zip(below, s.ys))
        out.append(Series(s.label, s.xs, ys))
        below = ys
    return out
