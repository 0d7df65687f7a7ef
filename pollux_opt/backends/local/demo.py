"""The demo: one workload under each policy in turn, then a comparison (:func:`run_demo`)."""

from __future__ import annotations

import os
from pathlib import Path

from solvers import InvalidProblem

from pollux_opt.backends.local.rundir import CONFIG_FILE, EVENTS_FILE
from pollux_opt.backends.local.run import DEFAULT_INTERVAL_S, run_workload
from pollux_opt.model import Cluster
from pollux_opt.model.cluster_types import ClusterTypes
from pollux_opt.records.events import read_events
from pollux_opt.records.files import atomic_write_json, safe_name

__all__ = ["DEMO_POLICIES", "QUICK_INTERVAL_S", "run_demo"]

#: Round interval of ``demo --quick`` (seconds): jobs of the quick sets train for
#: 20-90 s, so a 30 s round would leave a job's first fitted model unused for
#: most of its life; 10 s keeps the scheduler's overhead (about 0.05 s a round
#: on this machine) well under 2 % of the interval.
QUICK_INTERVAL_S = 10.0
#: Policies of the demo, in the order they run.
DEMO_POLICIES = ("fixed", "dynamic", "pollux")
#: The demo's comparison of the policies' summaries, in its output folder.
COMPARISON_FILE = "comparison.json"


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
) -> dict[str, dict]:
    """Run ``workload`` under each policy one after another into ``out_dir/<policy>``,
    then write ``out_dir/comparison.json`` and the plots; return policy -> summary.

    A policy whose run directory already exists is resumed (a finished one
    just has its summary recomputed).  ``interval`` defaults to
    :data:`QUICK_INTERVAL_S` with ``quick``, else :data:`DEFAULT_INTERVAL_S`.
    ``import_dir``: where a workload file's user jobs are imported from
    (:func:`~pollux_opt.workloads.load.load_workload`).  ``cluster``: as in
    :func:`~pollux_opt.backends.local.run.run_workload` (a node-type description
    runs every policy on the same typed, throttled nodes).
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
            cluster=cluster, interval=interval, progress=progress,
        )
    runs = {name: read_events(out / name / EVENTS_FILE) for name in policies}
    plot_all(runs, summaries, out)
    atomic_write_json(out / COMPARISON_FILE, summaries)
    return summaries
