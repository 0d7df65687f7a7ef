"""Plots of runs (matplotlib, imported lazily): JCT CDF, allocation timeline, goodput over time.

Every function reads event logs or summaries (never a backend), so the same
plots serve real and simulated runs.  Figures are written to files with the
non-interactive Agg backend.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from pollux_opt.extras import PLOTS_MISSING, require
from pollux_opt.records.files import atomic_write_bytes

__all__ = ["plot_jct_cdf", "plot_allocation_timeline", "plot_goodput", "plot_all"]


def _pyplot():
    matplotlib = require("matplotlib", PLOTS_MISSING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_jct_cdf(summaries: Mapping[str, dict], path: str | Path) -> Path:
    """Empirical CDF of completed jobs' JCTs, one step line per policy (label -> summary)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, summary in summaries.items():
        jcts = np.sort([j["jct_s"] for j in summary["jobs"] if j.get("completed") and j.get("jct_s") is not None])
        if jcts.size:
            ax.step(np.concatenate([[0.0], jcts]), np.arange(jcts.size + 1) / jcts.size, where="post",
                    label=f"{label} (avg {np.mean(jcts):.0f} s)")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_allocation_timeline(runs: Mapping[str, Sequence[dict]], path: str | Path) -> Path:
    """CPUs held per job over time (stacked), one panel per policy (label -> events)."""
    from pollux_opt.records.timelines import allocation_timeline

    plt = _pyplot()
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.4 * len(runs)), sharex=True, squeeze=False)
    t_max = max((max((float(e["t"]) for e in ev), default=0.0) for ev in runs.values()), default=0.0)
    job_ids = sorted({e["job_id"] for ev in runs.values() for e in ev if e.get("job_id")})
    colors = {j: plt.cm.tab10(i % 10) for i, j in enumerate(job_ids)}
    grid = np.linspace(0.0, t_max, 600) if t_max > 0 else np.zeros(1)
    for ax, (label, events) in zip(axes[:, 0], runs.items()):
        df = allocation_timeline(events)
        stacks, labels = [], []
        for jid in job_ids:
            rows = df[df["job_id"] == jid]
            if rows.empty:
                continue
            t, k = rows["t"].to_numpy(), rows["cpus"].to_numpy()
            idx = np.searchsorted(t, grid, side="right") - 1
            stacks.append(np.where(idx >= 0, k[np.clip(idx, 0, None)], 0))
            labels.append(jid)
        if stacks:
            ax.stackplot(grid, *stacks, labels=labels, colors=[colors[j] for j in labels], step="post")
        ax.set_ylabel(f"{label}\nCPUs")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize="small", ncol=max(1, math.ceil(len(job_ids) / 4)))
    axes[-1, 0].set_xlabel("time since run start (s)")
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_goodput(runs: Mapping[str, Sequence[dict]], path: str | Path) -> Path:
    """Cluster goodput (single-CPU equivalents) over time, one line per policy (label -> events)."""
    from pollux_opt.records.timelines import goodput_timeline

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, events in runs.items():
        df = goodput_timeline(events)
        if len(df):
            ax.step(df["t"], df["goodput"], where="post", label=label)
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("cluster goodput (single-CPU equivalents)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_all(runs: Mapping[str, Sequence[dict]], summaries: Mapping[str, dict], out_dir: str | Path) -> list[Path]:
    """The three standard plots into ``out_dir``: ``jct_cdf.png``, ``allocation.png``, ``goodput.png``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        plot_jct_cdf(summaries, out_dir / "jct_cdf.png"),
        plot_allocation_timeline(runs, out_dir / "allocation.png"),
        plot_goodput(runs, out_dir / "goodput.png"),
    ]


def _save(fig, plt, path) -> Path:
    """Write ``fig`` to ``path`` atomically (the format from its suffix) and close it."""
    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
