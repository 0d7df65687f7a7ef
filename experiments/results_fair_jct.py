"""The fair-jct section of ``docs/results.md`` (:mod:`results_doc` renders it):
what bounds fair-jct's gain over Pollux, every run on the AdaptDL and Philly
workloads and the sensitivity settings, its options, where the simulation's
time and the mean JCT go, and the remaining-work estimator's error."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from results_format import machine_note, md_table, missing, ordered, pct, reduction, seconds, short, workload_key

if TYPE_CHECKING:
    from results_doc import Results

#: Display names of the section's policies, in table order.
FAIR_JCT_POLICIES = {"pollux": "Pollux", "fair-jct": "fair-jct", "fair-jct-oracle": "fair-jct+oracle"}


def _with_means(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` plus, per set and policy run on every workload of its set (more than one),
    a ``mean SET`` row of the means over the set's workloads (NaN where one lacks the figure)."""
    cols = ["avg_jct_s", "p99_jct_s", "worst_rho", "jain_index", "wall_s"]
    means = df.groupby(["set", "policy"], as_index=False)[cols].agg(lambda x: x.mean(skipna=False))
    runs = df.groupby(["set", "policy"]).workload.nunique()
    full = runs.groupby(level="set").transform("max")
    means = means[[bool(runs[(s, p)] == full[(s, p)] > 1) for s, p in zip(means.set, means.policy)]]
    return pd.concat([df, means.assign(workload=[f"mean {s}" for s in means.set])], ignore_index=True)


def _rho(v: float) -> str:
    return "-" if missing(v) else f"{v:.2f}"


def _run_rows(df: pd.DataFrame) -> list[list[str]]:
    """Per workload (mean rows last), each policy's figures against Pollux's on that workload."""
    rows = []
    order = lambda n: (n.startswith("mean "), not n.startswith("workload"), workload_key(n))  # noqa: E731
    for w in sorted(dict.fromkeys(df.workload), key=order):
        sub = df[df.workload == w].set_index("policy")
        ref = float(sub.avg_jct_s["pollux"]) if "pollux" in sub.index else math.nan
        for p in ordered(sub.index, FAIR_JCT_POLICIES):
            r = sub.loc[p]
            rows.append([str(w), FAIR_JCT_POLICIES[p], seconds(r.avg_jct_s),
                         "-" if p == "pollux" or missing(ref) else pct(reduction(float(r.avg_jct_s), ref), 1),
                         seconds(r.p99_jct_s), _rho(r.worst_rho),
                         "-" if missing(r.jain_index) else f"{r.jain_index:.3f}", short(r.wall_s)])
    return rows


#: The options of the formulation's ceiling row in the bounding table: fair-jct+oracle without the bound.
UNBOUNDED = '{"bound": null}'


def _bound_rows(df: pd.DataFrame, unbounded: pd.DataFrame | None = None) -> list[list[str]]:
    """The bounding table: means over the AdaptDL workloads at the default and a zero restart
    delay, each against Pollux at the default delay; worst rho: the largest over the workloads;
    the least reduction on one workload.  ``unbounded``: the runs of the ceiling row
    (:data:`UNBOUNDED`), shown where they cover every workload."""
    pollux = df[(df.set == "adaptdl") & (df.policy == "pollux")].set_index("workload").avg_jct_s
    ref = pollux.mean()
    groups = [(delay, FAIR_JCT_POLICIES[p], df[(df.set == group) & (df.policy == p)],
               p == "pollux" and group == "adaptdl")
              for group, delay in (("adaptdl", "30 s"), ("adaptdl-restart0", "0 s"))
              for p in ordered(df[df.set == group].policy, FAIR_JCT_POLICIES)]
    if unbounded is not None:
        groups.append(("30 s", f"{FAIR_JCT_POLICIES['fair-jct-oracle']}, no bound", unbounded, False))
    rows = []
    for delay, name, r, is_ref in groups:
        if r.workload.nunique() < pollux.index.nunique():
            continue
        jct = r.set_index(r.workload.str.removesuffix(r.set.iloc[0].removeprefix("adaptdl"))).avg_jct_s
        each = 1.0 - jct / pollux  # on each workload (a sensitivity set's names end in its suffix)
        least = each.idxmin()
        rows.append([delay, name, seconds(r.avg_jct_s.mean()),
                     "-" if is_ref else pct(reduction(r.avg_jct_s.mean(), ref), 1),
                     "-" if is_ref else f"{pct(each[least], 1)} ({least})",
                     seconds(r.p99_jct_s.mean()), _rho(r.worst_rho.max())])
    return rows


def _option_rows(df: pd.DataFrame, options: pd.DataFrame) -> list[list[str]]:
    """fair-jct's options on the AdaptDL workloads: means over the workloads each ran on, against
    Pollux's on the same ones; how many of them have a worst rho above Pollux's."""
    pollux = df[(df.set == "adaptdl") & (df.policy == "pollux")].set_index("workload")
    rows = []
    for opt, runs in options.groupby("options", sort=False):
        runs = runs[runs.workload.isin(pollux.index)]
        if runs.empty:
            continue
        ref = pollux.loc[runs.workload]
        above = int((runs.worst_rho.to_numpy() > ref.worst_rho.to_numpy() + 1e-9).sum())
        rows.append(["defaults" if opt == "{}" else opt, str(len(runs)), seconds(runs.avg_jct_s.mean()),
                     pct(reduction(runs.avg_jct_s.mean(), ref.avg_jct_s.mean()), 1), seconds(runs.p99_jct_s.mean()),
                     _rho(runs.worst_rho.max()), str(above)])
    return rows


def _noise_rows(df: pd.DataFrame) -> list[list[str]]:
    """The report-noise runs: worst rho against the run's own (noisy) reference and against
    the noise-free Pollux run's (``worst_rho_ref``)."""
    if "worst_rho_ref" not in df:
        return []
    runs = df[(df.report_noise > 0) & df.worst_rho_ref.notna()]
    rank = {p: i for i, p in enumerate(FAIR_JCT_POLICIES)}
    runs = runs.assign(rank=runs.policy.map(rank)).sort_values(["report_noise", "rank"])
    return [[str(r.workload), FAIR_JCT_POLICIES.get(r.policy, r.policy), seconds(r.avg_jct_s), _rho(r.worst_rho),
             _rho(r.worst_rho_ref)] for r in runs.itertuples()]


def fair_jct_section(results: Results) -> list[str]:
    """fair-jct against Pollux (experiments/fair_jct.py): the bounding table, every run at
    the default options, and the options measured."""
    if results.fair_jct is None:
        return []
    df = results.fair_jct
    df = df.assign(options=df.options.fillna("{}"))
    plain = df[df.options == "{}"]
    options = df[(df.set == "adaptdl") & (df.policy == "fair-jct")]
    lines = [
        "## fair-jct: mean JCT with fairness as a constraint",
        "",
        "`experiments/fair_jct.py` (formulation in [`docs/fair-jct.md`](fair-jct.md)): a linear objective "
        "over Pollux's goodput speedups with the flow-time weights (heSRPT, SmartFill) of the jobs' speedup curves "
        "in the order of their estimated remaining time, and a bound "
        "of 2 on each job's predicted finish-time fairness rho as a constraint; 16 x 4, interval 60 s, against "
        "Pollux. What bounds it (means over the eight AdaptDL workloads; \"below Pollux\": the reduction of "
        "average JCT against Pollux at the 30 s restart delay, and on the workload where it is least; worst rho: "
        "the largest over the workloads): fair-jct+oracle is the same policy told each job's true remaining work "
        "by the simulator, \"no bound\" the same without the fairness bound (the formulation's ceiling), the 0 s "
        "rows have free restarts." + machine_note(results.fair_jct),
        "",
        *md_table(["restart delay", "policy", "avg JCT (s)", "below Pollux", "least below Pollux (workload)",
                   "p99 JCT (s)", "worst rho"],
                  _bound_rows(plain, df[(df.set == "adaptdl") & (df.policy == "fair-jct-oracle")
                                        & (df.options == UNBOUNDED)]),
                  [False, False, True, True, True, True, True]),
        "",
        "Every run at the default options, two at a time (simulated JCTs do not depend on the machine or "
        "its load; wall seconds do, and these rows come from more than one machine: the speed table below "
        "compares the policies' time). "
        "`philly-Lx-sN` rows are workloads sampled from `philly.csv` at job load L, seed N; a `-noiseS`, "
        "`-intervalI` or `-restartD` suffix marks a sensitivity setting (report noise S, interval I s, "
        "restart delay D s instead of 30 s); a `mean` row averages its set's workloads (for a Philly load, "
        "its seeds). \"below Pollux\" is the reduction of average JCT against Pollux on the same workload.",
        "",
        *md_table(["workload", "policy", "avg JCT (s)", "below Pollux", "p99 JCT (s)", "worst rho",
                   "Jain (1/rho)", "wall (s)"], _run_rows(_with_means(plain)), [False, False] + [True] * 6),
        "",
        "fair-jct's options on the AdaptDL workloads (`--option NAME=VALUE`; means over the workloads; "
        "\"rho above Pollux\": workloads whose worst rho exceeds Pollux's):",
        "",
        *md_table(["options", "workloads", "avg JCT (s)", "below Pollux", "p99 JCT (s)", "worst rho",
                   "rho above Pollux"], _option_rows(plain, options), [False] + [True] * 6),
        "",
    ]
    noise = _noise_rows(plain)
    if noise:
        lines += [
            "Worst rho under report noise: a job's rho divides its JCT by its isolated JCT from the model it "
            "fitted, which under noise is fitted from noisy reports; the last column divides by each job's "
            "isolated JCT in the noise-free Pollux run of the workload instead, one yardstick for every policy "
            "and noise level (`worst_rho_ref`):",
            "",
            *md_table(["workload", "policy", "avg JCT (s)", "worst rho (own reference)",
                       "worst rho (noise-free reference)"], noise, [False, False, True, True, True]),
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


def fair_jct_headline(results: Results) -> list[str] | None:
    """The README's fair-jct row: its average JCT against Pollux's on the AdaptDL workloads
    (mean, and the per-workload range), and how many keep Pollux's worst rho; None without runs."""
    if results.fair_jct is None:
        return None
    df = results.fair_jct
    df = df[(df.set == "adaptdl") & (df.options.fillna("{}") == "{}")]
    pair = df.pivot_table(index="workload", columns="policy", values=["avg_jct_s", "worst_rho"])
    if not {"pollux", "fair-jct"} <= set(pair.columns.get_level_values(1)):
        return None
    jct, rho = pair["avg_jct_s"].dropna(subset=["pollux", "fair-jct"]), pair["worst_rho"]
    per = 1 - jct["fair-jct"] / jct["pollux"]
    kept = int((rho.loc[jct.index, "fair-jct"] <= rho.loc[jct.index, "pollux"] + 1e-9).sum())
    return [f"fair-jct's average JCT below Pollux's, {len(jct)} AdaptDL workloads (mean; per-workload range; "
            "workloads with a worst rho no higher)",
            f"{pct(reduction(jct['fair-jct'].mean(), jct['pollux'].mean()), 1)} ({pct(per.min(), 1)} to "
            f"{pct(per.max(), 1)}; {kept} of {len(jct)})"]
