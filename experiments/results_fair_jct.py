"""The fair-jct section of ``docs/results.md`` (:mod:`results_doc` renders it):
fair-jct against Pollux on the AdaptDL and Philly workloads, the diagnosis of
where the mean JCT goes, the screened variants and the remaining-work
estimator's error."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from results_format import machine_note, md_table, missing, ordered, pct, reduction, seconds, short, workload_key

if TYPE_CHECKING:
    from results_doc import Results

#: Display names of the section's policies, in table order.
FAIR_JCT_POLICIES = {"pollux": "Pollux", "fair-jct": "fair-jct", "fair-jct-oracle": "fair-jct+oracle (bound)"}


def fair_jct_section(results: Results) -> list[str]:
    """fair-jct against Pollux (experiments/fair_jct.py); Pollux rows missing from
    fair_jct.csv are taken from sim_compare.csv (same simulator and settings)."""
    if results.fair_jct is None:
        return []
    df = results.fair_jct
    base = results.compare[results.compare.policy == "pollux"].assign(set="adaptdl", jain_index=math.nan)
    have = set(zip(df.workload, df.policy))
    extra = base[[(w, "pollux") not in have for w in base.workload]]
    extra = extra[extra.workload.isin(df.workload)]
    df = pd.concat([df, extra[["set", "workload", "policy", "avg_jct_s", "p99_jct_s", "worst_rho", "jain_index",
                               "wall_s"]]], ignore_index=True)
    # per set: the means over its workloads (NaN where a workload lacks the figure), for the
    # policies run on all of the set's workloads
    means = df.groupby(["set", "policy"], as_index=False)[["avg_jct_s", "p99_jct_s", "worst_rho", "jain_index",
                                                           "wall_s"]].agg(lambda x: x.mean(skipna=False))
    runs = df.groupby(["set", "policy"]).workload.nunique()
    full = runs.groupby(level="set").transform("max")
    # a set of one workload needs no mean row: it would repeat the workload's
    means = means[[bool(runs[(s, p)] == full[(s, p)] > 1) for s, p in zip(means.set, means.policy)]]
    df = pd.concat([df, means.assign(workload=[f"mean {s}" for s in means.set])], ignore_index=True)
    rows = []
    order = lambda n: (n.startswith("mean "), not n.startswith("workload"), workload_key(n))  # noqa: E731
    for w in sorted(dict.fromkeys(df.workload), key=order):
        sub = df[df.workload == w].set_index("policy")
        ref = float(sub.avg_jct_s["pollux"]) if "pollux" in sub.index else math.nan
        for p in ordered(sub.index, FAIR_JCT_POLICIES):
            r = sub.loc[p]
            rows.append([str(w), FAIR_JCT_POLICIES[p], seconds(r.avg_jct_s),
                         "-" if p == "pollux" or missing(ref) else pct(reduction(float(r.avg_jct_s), ref), 1),
                         seconds(r.p99_jct_s), short(r.worst_rho),
                         "-" if missing(r.jain_index) else f"{r.jain_index:.3f}", short(r.wall_s)])
    lines = [
        "## fair-jct: mean JCT with a finish-time fairness bound",
        "",
        "`experiments/fair_jct.py` (formulation in [`docs/fair-jct.md`](fair-jct.md)): Pollux's power mean "
        "with online Gittins-index weights, a predicted-rho bound, a weight-scaled restart factor and an "
        "exploration cap of 4, 16 x 4, interval 60 s, against Pollux"
        + (" (from `sim_compare.csv` where the row is not in `fair_jct.csv`; those lack Jain's index). "
           if len(extra) else ", each pair of rows run side by side (two processes). ")
        + "`philly-Lx-sN` rows are workloads sampled from `philly.csv` at job load L, seed N; a "
        "`-noiseS`, `-intervalI` or `-restartD` suffix marks a sensitivity setting (report noise S, "
        "interval I s, restart delay D s instead of 30 s); a `mean` row averages its set's workloads "
        "(for a Philly load, its seeds). \"below Pollux\" is the reduction of average JCT."
        + machine_note(results.fair_jct),
        "",
        *md_table(["workload", "policy", "avg JCT (s)", "below Pollux", "p99 JCT (s)", "worst rho",
                   "Jain (1/rho)", "wall (s)"], rows, [False, False] + [True] * 6),
        "",
    ]
    lines += _speed_lines(results.fair_jct_speed)
    diag = results.fair_jct_diagnosis
    if diag is not None:
        drows = [[str(r.run), str(r.application), f"{r.jobs:.0f}", seconds(r.mean_jct_s), pct(r.share_of_mean),
                  seconds(r.wait_s), f"{r.restarts:.1f}", seconds(r.restart_s), f"{r.mean_replicas:.1f}",
                  f"{r.max_replicas:.1f}"] for r in diag.itertuples()]
        lines += [
            "Where the mean JCT goes, per application (`experiments/fair_jct_diagnose.py` on the runs' "
            "events; wait: submission to first allocation; restarts and their seconds; replicas over the "
            "rounds a job held any; means over the application's jobs):",
            "",
            *md_table(["run", "application", "jobs", "mean JCT (s)", "share of summed JCT", "wait (s)",
                       "restarts", "restart time (s)", "mean replicas", "max replicas"], drows,
                      [False, False] + [True] * 8),
            "",
        ]
    screen = results.fair_jct_screen
    if screen is not None:
        ref = results.compare[results.compare.policy == "pollux"].set_index("workload").avg_jct_s
        srows = [[str(r.workload), "defaults" if r.options == "{}" else str(r.options), seconds(r.avg_jct_s),
                  pct(reduction(float(r.avg_jct_s), float(ref[r.workload])), 1) if r.workload in ref.index else "-",
                  seconds(r.p99_jct_s), short(r.worst_rho), f"{r.jain_index:.3f}"]
                 for r in screen.sort_values(["workload", "avg_jct_s"]).itertuples()]
        lines += [
            "Screening of fair-jct's options (`fair_jct_screen.csv`: `experiments/fair_jct.py --option`, the "
            "options in [`docs/fair-jct.md`](fair-jct.md), \"Variants screened\"; \"defaults\": the policy "
            "as registered):",
            "",
            *md_table(["workload", "options", "avg JCT (s)", "below Pollux", "p99 JCT (s)", "worst rho",
                       "Jain (1/rho)"], srows, [False, False] + [True] * 5),
            "",
        ]
    est = results.fair_jct_estimator
    if est is not None:
        erows = [[str(r.workload), str(r.variant), str(r.application), f"{r.samples:.0f}",
                  pct(r.median_rel_error), pct(r.p90_rel_error), f"{r.median_ratio:.2f}"]
                 for r in est.itertuples()]
        lines += [
            "Remaining-work estimate against the simulator's truth (`experiments/fair_jct_estimator.py`, "
            "logged every few rounds for each job with a fitted model, the run's length and period in "
            "[`docs/fair-jct.md`](fair-jct.md); relative error |estimate - truth| / truth):",
            "",
            *md_table(["workload", "estimator", "application", "samples", "median error", "p90 error",
                       "median estimate / truth"], erows, [False, False, False, True, True, True, True]),
            "",
        ]
    return lines


#: Stages of the simulation-time table: label, CSV column, call-count column (or None).
SPEED_STAGES = (
    ("MILP rounds, HiGHS included (rounds)", "solve_s", "solve_calls"),
    ("HiGHS's branch and bound (MIPs)", "highs_mip_s", "highs_mip_calls"),
    ("throughput fits (fits)", "fit_s", "fit_calls"),
    ("`to_problem` (speedup tables, batch search)", "encode_s", None),
    ("the policy's allocator jobs (weights, restart factors)", "policy_jobs_s", None),
    ("of which fair-jct's work rates (calls)", "work_rates_s", "work_rates_calls"),
)


def _speed_lines(df: pd.DataFrame | None) -> list[str]:
    """Where a workload-6 simulation's wall time goes under each policy (``fair_jct_speed.csv``,
    ``experiments/encode_speed.py --policy``): means over the working tree's runs."""
    if df is None:
        return []
    tree = df[df.code == "working tree"]
    pols = ordered(tree.policy, FAIR_JCT_POLICIES)
    m = {p: tree[tree.policy == p].apply(pd.to_numeric, errors="coerce").mean() for p in pols}
    runs = {p: int((tree.policy == p).sum()) for p in pols}

    def cell(p: str, col: str, calls: str | None) -> str:
        if missing(m[p][col]):
            return "-"
        return f"{m[p][col]:.1f}" + ("" if calls is None or missing(m[p][calls]) else f" ({m[p][calls]:.0f})")

    rest = {p: m[p].wall_s - m[p].solve_s - m[p].fit_s - m[p].encode_s - m[p].policy_jobs_s for p in pols}
    rows = [["whole simulation, wall", *(f"{m[p].wall_s:.1f}" for p in pols)],
            ["whole simulation, CPU", *(f"{m[p].cpu_s:.1f}" for p in pols)],
            *([label, *(cell(p, col, calls) for p in pols)] for label, col, calls in SPEED_STAGES),
            ["the rest (simulator, views, event log)", *(f"{rest[p]:.1f}" for p in pols)]]
    same = "identical" if tree.identical_jobs_csv.astype(bool).all() else "not always identical"
    out = [
        "Where a workload-6 simulation's time goes under each policy (`fair_jct_speed.csv`, "
        "`experiments/encode_speed.py --policy`: the policies alternating, each run in its own process, "
        f"{' / '.join(str(runs[p]) for p in pols)} runs; wall seconds, means over the runs; each policy's "
        f"jobs.csv {same} across its runs)." + machine_note(df),
        "",
        *md_table(["stage", *(FAIR_JCT_POLICIES[p] for p in pols)], rows, [False] + [True] * len(pols)),
        "",
    ]
    if {"pollux", "fair-jct"} <= set(pols):
        wall, cpu = (m["fair-jct"][c] / m["pollux"][c] - 1 for c in ("wall_s", "cpu_s"))
        out += [f"fair-jct's simulation against Pollux's: {100 * wall:+.0f} % wall, {100 * cpu:+.0f} % CPU.", ""]
    return out
