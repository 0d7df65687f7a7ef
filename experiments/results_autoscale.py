"""The autoscaling section of ``docs/results.md`` (:mod:`results_doc` renders it) from
``autoscale.csv`` (``experiments/autoscale.py``): Pollux's cloud case, the AdaptDL
workloads on an autoscaled 16 x 4 maximum and ``sia-64``'s priced types, each
rule's node-hours (cost) beside its completion time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from results_format import RESULTS_LINK, machine_note, md_table, missing, pct, seconds

if TYPE_CHECKING:
    from results_doc import Results

#: JCT allowance of the targets: a point may be at most this much slower than its reference.
JCT_ALLOWANCE = 0.10


def run_label(row) -> str:
    """A run's name from its ``autoscale.csv`` row: ``goodput λ=16`` (the cost rule),
    ``goodput 0.25/0.125`` (the threshold rule), ``fixed 12``, ..."""
    weak = " (weak scaling)" if bool(row["weak_scaling"]) else ""
    if row["rule"] == "fixed":
        return f"fixed {int(row['nodes'])}{weak}"
    hold = row.get("release_after_s")
    held = "" if missing(hold) or hold == row["startup_s"] else f", hold {hold:g} s"
    lam = row.get("time_value")
    bar = f"{row['grow_above']:g}/{row['shrink_below']:g}" if missing(lam) else f"λ={lam:g}"
    return f"{row['rule']} {bar}{held}{weak}"


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    if "time_value" not in df:  # rows of the threshold rules and fixed clusters only
        df = df.assign(time_value=float("nan"))
    return df.assign(run=[run_label(r) for r in df.to_dict("records")])


def _change(v: float, ref: float) -> str:
    return "-" if missing(v) or missing(ref) else f"{100 * (v / ref - 1):+.1f} %"


def _best_within(points: pd.DataFrame, ref_jct: float, ref_cost: float, cost: str) -> tuple[str, float, float] | None:
    """The autoscaled run with the lowest ``cost`` among those at most :data:`JCT_ALLOWANCE` slower
    than ``ref_jct``: (name, its cost below ``ref_cost``, its JCT change), None if there is none."""
    ok = points[(points.rule != "fixed") & (points.avg_jct_s <= (1 + JCT_ALLOWANCE) * ref_jct)]
    if ok.empty:
        return None
    best = ok.loc[ok[cost].idxmin()]
    return str(best.run), 1 - float(best[cost]) / ref_cost, float(best.avg_jct_s) / ref_jct - 1


def _target_line(what: str, best, ref: str, unit: str = "node-hours") -> str:
    if best is None:
        return f"No autoscaled run is within {pct(JCT_ALLOWANCE)} of {ref}'s {what}."
    name, saved, slower = best
    return (f"The cheapest autoscaled run within {pct(JCT_ALLOWANCE)} of {ref}'s {what}: {name}, "
            f"{pct(saved, 1)} less {unit} at {100 * slower:+.1f} % {what}.")


def _cloud(df: pd.DataFrame) -> list[str]:
    ref = df[(df.rule == "throughput") & df.weak_scaling.astype(bool)]
    if ref.empty:
        return []
    r = ref.iloc[0]
    rows = [[x.run, str(int(x.most_nodes)), f"{x.avg_jct_s / 3600:.2f}", f"{x.node_hours:.1f}",
             _change(x.node_hours, r.node_hours), _change(x.avg_jct_s, r.avg_jct_s)]
            for x in df.sort_values(["rule", "weak_scaling", "time_value", "grow_above", "nodes"]).itertuples()]
    return [
        "**Pollux's cloud case**: the first ImageNet job of AdaptDL's workload-6, alone, on at most 16 x 4 "
        "GPUs. The throughput rule's reference run is Or et al.'s system (the job keeps its submitted "
        "per-GPU batch, so its total batch grows with its GPUs); the other throughput run and every "
        "goodput run let the job choose its batch as Pollux does. Changes are against the reference.",
        "",
        *md_table(["run", "most nodes", "completion (h)", "node-hours", "node-hours vs ref", "completion vs ref"],
                  rows, [False, True, True, True, True, True]),
        "",
        _target_line("completion time", _best_within(df, float(r.avg_jct_s), float(r.node_hours), "node_hours"),
                     "the reference"),
        "",
    ]


def node_hours_bound(bound: pd.DataFrame, jct: float) -> float:
    """The least mean node-hours per workload of any schedule of ``bound``'s workloads whose
    average JCT is at most ``jct`` seconds: the Lagrangian bound over the relaxation's points
    (``autoscale_bound.py``), ``max_lambda N(lambda) + lambda / s * sum_jobs (T(lambda) - jct)``."""
    per = bound.assign(excess=bound.jobs * (bound.avg_jct_s - jct) * bound.time_value / bound.slots_per_node / 3600)
    sums = per.groupby("time_value")[["node_hours", "excess"]].mean()
    return float((sums.node_hours + sums.excess).max())


def _bound_line(bound: pd.DataFrame | None, ref) -> list[str]:
    if bound is None or ref is None:
        return []
    least = node_hours_bound(bound, (1 + JCT_ALLOWANCE) * float(ref.avg_jct_s))
    same = node_hours_bound(bound, float(ref.avg_jct_s))
    return [f"A lower bound (`autoscale_bound.py`: every job alone from its arrival, on the number of slots "
            f"cheapest for it in each epoch, with no contention, node start-up or restart): no schedule with "
            f"an average JCT within {pct(JCT_ALLOWANCE)} of {ref.run}'s takes fewer than {least:.1f} node-hours "
            f"per workload, {pct(1 - least / float(ref.node_hours), 1)} less than {ref.run}; at its average JCT, "
            f"fewer than {same:.1f} ({pct(1 - same / float(ref.node_hours), 1)} less).", ""]


def _shared(df: pd.DataFrame, set_: str, bound: pd.DataFrame | None = None) -> list[str]:
    """Means over the set's workloads (of the runs made on all of them), against the largest fixed cluster."""
    sub = df[df.set == set_]
    if sub.empty:
        return []
    full = sub.workload.nunique()
    runs = sub.groupby("run").filter(lambda g: g.workload.nunique() == full)
    priced = bool(runs.cost.notna().all())
    cost, unit = ("cost", "cost") if priced else ("node_hours", "node-hours")
    cols = ["avg_jct_s", "p99_jct_s", "node_hours"] + (["cost"] if priced else [])
    means = (runs.groupby(["run", "rule", "time_value", "grow_above"], as_index=False, dropna=False)[cols].mean()
             .sort_values(["rule", "time_value", "grow_above", "run"]))
    fixed = means[means.rule == "fixed"]
    ref = means.loc[fixed.node_hours.idxmax()] if len(fixed) else None
    head = ["run", "avg JCT (s)", "p99 JCT (s)", "node-hours"] + (["cost (USD)"] if priced else [])
    if ref is not None:
        head += [f"{unit} vs {ref.run}", f"avg JCT vs {ref.run}"]
    rows = [[m.run, seconds(m.avg_jct_s), seconds(m.p99_jct_s), f"{m.node_hours:.1f}"]
            + ([f"{m.cost:.0f}"] if priced else [])
            + ([_change(getattr(m, cost), ref[cost]), _change(m.avg_jct_s, ref.avg_jct_s)] if ref is not None else [])
            for m in means.itertuples()]
    intro = (f"**The eight AdaptDL workloads** under Pollux on an autoscaled 16 x 4 maximum, beside fixed "
             f"clusters (means over the {full} workloads)." if set_ == "adaptdl" else
             f"**`sia-64`'s node types** (the same workloads under Pollux, type-aware), each type priced per "
             f"node-hour (means over the {full} workloads; the fixed run is the whole `sia-64`).")
    out = [intro, "", *md_table(head, rows, [False] + [True] * (len(head) - 1)), ""]
    if ref is not None:
        best = _best_within(means, float(ref.avg_jct_s), float(ref[cost]), cost)
        out += [_target_line("average JCT", best, ref.run, unit), ""]
    return out + _bound_line(bound, ref)


def autoscale_section(results: Results) -> list[str]:
    """Autoscaled clusters against fixed ones (experiments/autoscale.py)."""
    if results.autoscale is None:
        return []
    df = _labelled(results.autoscale)
    startup = ", ".join(f"{s:g}" for s in sorted(set(df.startup_s)))
    band = sorted(set(df.band.dropna())) if "band" in df else []
    bands = f" (band {', '.join(f'{b:g}' for b in band)})" if band else ""
    lines = [
        "## Autoscaling: node-hours against completion time",
        "",
        "`experiments/autoscale.py` (the rules in [`docs/autoscaling.md`](autoscaling.md)), simulated: "
        f"nodes come up {startup} s after their request and are billed from request to release; a fixed "
        "cluster is billed for all its nodes from the first submission to the last completion. "
        "\"goodput λ=L\": the cost rule, a node bought while it lowers node cost plus L slot-seconds per "
        f"second of each active job, per unit of goodput{bands}; \"goodput G/S\": the threshold rule, "
        "growing while a node's slots each add at least G of a one-slot job's rate (per price unit) and "
        "shrinking below S; \"throughput 0.5/0.25\": the threshold rule over throughput at each job's submitted "
        "per-GPU batch; \"hold H s\": nodes go once a smaller size has been wanted for H s (otherwise for the "
        "start-up delay)." + machine_note(df),
        "",
        *_cloud(df[df.set == "cloud"]),
        *_plots(results, "autoscale_cloud.png", "nodes provisioned over time in the cloud case"),
        *_shared(df, "adaptdl", results.autoscale_bound),
        *_shared(df, "sia"),
        *_plots(results, "autoscale_cost.png", "node-hours or cost against average JCT per rule"),
    ]
    return lines


def _plots(results: Results, name: str, alt: str) -> list[str]:
    return [f"![{alt}]({RESULTS_LINK}/{name})", ""] if name in results.plots else []


def autoscale_headline(results: Results) -> list[str] | None:
    """The cloud case's headline row: the goodput rule's cheapest point within the JCT allowance."""
    if results.autoscale is None:
        return None
    df = _labelled(results.autoscale)
    cloud = df[df.set == "cloud"]
    ref = cloud[(cloud.rule == "throughput") & cloud.weak_scaling.astype(bool)]
    if ref.empty:
        return None
    best = _best_within(cloud, float(ref.avg_jct_s.iloc[0]), float(ref.node_hours.iloc[0]), "node_hours")
    if best is None:
        return None
    name, saved, slower = best
    return ["Autoscaling, one ImageNet job: node-hours of the goodput rule against throughput-driven "
            f"(Or et al.) within {pct(JCT_ALLOWANCE)} of its completion time",
            f"{pct(-saved, 1)} at {100 * slower:+.1f} % time ({name})"]
