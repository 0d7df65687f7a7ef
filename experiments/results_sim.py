"""The simulation sections of ``docs/results.md`` (:mod:`results_doc` renders them):
the policy comparison on the AdaptDL workloads (``sim_compare.py``), the
sensitivity sweeps (``sim_sensitivity.py``), scale (``sim_scale.py``), the
solvers side by side (``solver_comparison.py``) and the allocator's speed
(``solver_speed.py``).  Each takes the loaded :class:`results_doc.Results`
and returns its lines (none when its optional CSV is absent)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import pandas as pd
from results_format import (
    POLICY_NAMES,
    RESULTS_LINK,
    ResultsError,
    display_name,
    machine_note,
    md_table,
    missing,
    ms,
    ordered,
    pct,
    reduction,
    seconds,
    short,
    workload_key,
)

if TYPE_CHECKING:
    from results_doc import Results

#: Sensitivity axes: column value -> (label, value formatter), in table order.
SENSITIVITY_AXES: dict[str, tuple[str, Callable[[float], str]]] = {
    "load": ("job load (x)", lambda v: f"{v:g}"),
    "interval_s": ("interval (s)", lambda v: f"{v:g}"),
    "restart_delay_s": ("restart delay (s)", lambda v: f"{v:g}"),
    "report_noise": ("report noise (log-normal sigma)", lambda v: f"{v:g}"),
    "p": ("fairness exponent p", lambda v: f"{v:g}"),
}


def _plot(results: Results, name: str, alt: str) -> list[str]:
    return [f"![{alt}]({RESULTS_LINK}/{name})", ""] if name in results.plots else []


def mean_jct(results: Results, policy: str) -> float:
    row = results.means[results.means.policy == policy]
    if row.empty:
        raise ResultsError(f"sim_compare.csv has no row for policy {policy!r}")
    return float(row.avg_jct_s.iloc[0])


def per_workloadreduction(results: Results, ours: str = "pollux", baseline: str = "tiresias") -> pd.Series:
    """Per workload, how far ``ours``'s average JCT is below ``baseline``'s (fraction)."""
    pivot = results.compare.pivot(index="workload", columns="policy", values="avg_jct_s")
    return (1.0 - pivot[ours] / pivot[baseline]).dropna()


def compare_section(results: Results) -> list[str]:
    df = results.compare
    policies = ordered(df.policy, POLICY_NAMES)
    pivot = df.pivot(index="workload", columns="policy", values="avg_jct_s")
    incomplete = sorted(set(df.workload[df.completed < df.jobs]), key=workload_key)
    workloads = sorted(pivot.index, key=workload_key)
    red = per_workloadreduction(results)
    rows = [[w, *(seconds(pivot.loc[w, p]) for p in policies), pct(red.get(w, float("nan")))] for w in workloads]
    lines = [
        "## Policy comparison on the AdaptDL workloads",
        "",
        f"`experiments/sim_compare.py`: the {len(workloads)} AdaptDL {df.jobs.max():.0f}-job workloads on a "
        "simulated 16 x 4 "
        "cluster, interval 60 s, restart delay 30 s; each job follows its measured trace profile, which "
        "the policies never see. NCF jobs keep their tuned configuration under every policy, as in "
        "Pollux's simulator. Average JCT per workload in seconds"
        + (f" (not every job completed in: {', '.join(incomplete)})" if incomplete else "")
        + ":",
        "",
        *md_table(["workload", *(display_name(p) for p in policies), "Pollux below Tiresias"],
                  rows, [False] + [True] * (len(policies) + 1)),
        "",
        f"Means over the {len(workloads)} workloads, against the published Pollux-simulator averages. "
        "rho is finish-time fairness (a job's JCT over its JCT alone on its fair share); worst rho is the "
        "mean over workloads of each workload's worst; wall is the simulation's own run time per workload."
        + machine_note(df),
        "",
    ]
    m = results.means.set_index("policy")
    mrows = [[
        display_name(p), f"{seconds(m.avg_jct_s[p])} ({m.avg_jct_s[p] / 3600:.3f} h)",
        "-" if missing(m.published_avg_jct_s[p])
        else f"{seconds(m.published_avg_jct_s[p])} ({m.published_avg_jct_s[p] / 3600:.2f} h)",
        "-" if missing(m.ratio_to_published[p]) else f"{m.ratio_to_published[p]:.3f}",
        seconds(m.p99_jct_s[p]), seconds(m.makespan_s[p]),
        short(m.worst_rho[p]), f"{m.frac_rho_gt_1[p]:.2f}", f"{short(m.wall_s[p])}, {short(m.max_wall_s[p])}",
    ] for p in ordered(m.index, POLICY_NAMES)]
    lines += md_table(["policy", "avg JCT (s)", "published (s)", "ours / published", "p99 JCT (s)",
                       "makespan (s)", "worst rho", "frac rho > 1", "wall s / workload (mean, max)"],
                      mrows, [False] + [True] * 8)
    lines += ["", *_plot(results, "sim_compare.png", "average JCT per workload and policy")]
    return lines


def sensitivity_section(results: Results) -> list[str]:
    df = results.sensitivity
    axes = ordered(df.axis, {a: a for a in SENSITIVITY_AXES})
    rows = []
    for axis in axes:
        label, fmt = SENSITIVITY_AXES.get(axis, (axis, lambda v: f"{v:g}"))
        sub = df[df.axis == axis]
        for value in sorted(sub.value.unique(), key=lambda v: (axis == "p", -v if axis == "p" else v)):
            at = sub[sub.value == value].set_index("policy").avg_jct_s
            pol, tir = at.get("pollux", float("nan")), at.get("tiresias", float("nan"))
            rows.append([label, fmt(value), seconds(pol), seconds(tir),
                         "-" if missing(pol) or missing(tir) else pct(reduction(pol, tir))])
    lines = [
        "## Sensitivity",
        "",
        "`experiments/sim_sensitivity.py`: workload-6 on 16 x 4, one setting varied at a time from interval "
        "60 s, restart delay 30 s, exact reports, p = -1; the load axis resamples the workload from the "
        "Philly trace with that load multiplier. Report noise perturbs what jobs report (Tiresias does not "
        "use reports); p is the power mean's exponent (Pollux only)." + machine_note(df) + " Average JCT in seconds:",
        "",
        *md_table(["axis", "value", "Pollux", "Tiresias", "Pollux below Tiresias"], rows,
                  [False, True, True, True, True]),
        "",
    ]
    for axis in axes:
        label = SENSITIVITY_AXES.get(axis, (axis,))[0]
        lines += _plot(results, f"sim_sensitivity-{axis}.png", f"average JCT against {label}")
    return lines


def scale_section(results: Results) -> list[str]:
    df = results.scale
    rows = []
    for cpus in sorted(df.cpus.unique()):
        at = df[df.cpus == cpus].set_index("policy")
        p = at.loc["pollux"] if "pollux" in at.index else None
        t = at.loc["tiresias"] if "tiresias" in at.index else None
        rows.append([
            f"{cpus:.0f}", f"{at.jobs.max():.0f}",
            seconds(p.avg_jct_s) if p is not None else "-", seconds(t.avg_jct_s) if t is not None else "-",
            f"{ms(p.mean_solver_s)} / {ms(p.p95_solver_s)} / {ms(p.max_solver_s)}" if p is not None else "-",
            f"{p.wall_s:.1f}" if p is not None else "-",
        ])
    return [
        "## Scale",
        "",
        "`experiments/sim_scale.py`: synthetic parametric profiles (three applications), 2.5 jobs per CPU "
        "arriving over 8 h, 4 CPUs per node, interval 60 s. The policy time per round is building the "
        "speedup tables, the MILP and decoding (the jobs' models are fitted outside it), against the 60 s "
        "interval." + machine_note(df),
        "",
        *md_table(["CPUs", "jobs", "Pollux avg JCT (s)", "Tiresias avg JCT (s)",
                   "Pollux policy time per round, mean / p95 / max (ms)", "Pollux run, wall (s)"],
                  rows, [True] * 6),
        "",
        *_plot(results, "sim_scale.png", "policy time per round against cluster size"),
    ]


def solvers_section(results: Results) -> list[str]:
    if results.solvers is None:
        return []
    df = results.solvers
    rows = [[r.size, r.solver, r.status, f"{r.objective:.4g}", pct(max(r.gap, 0.0), 2),
             f"{r.total_s:.3g}", f"{r.solve_cpu_s:.3g}"] for r in df.itertuples()]
    return [
        "## Solvers side by side",
        "",
        "`experiments/solver_comparison.py`: seeded `solvers.testing.random_problem` instances; gap = "
        "(MILP bound - objective) / MILP bound; the evolutionary solver's times are after JIT compilation.",
        "",
        *md_table(["size", "solver", "status", "objective", "gap", "wall per solve (s)", "CPU (s)"], rows,
                  [False, False, False, True, True, True, True]),
        "",
        *_plot(results, "solver_comparison.png", "gap to the MILP bound against time"),
    ]


def speed_section(results: Results) -> list[str]:
    """Solver timings of ``experiments/solver_speed.py``: the current code against a reference copy."""
    if results.speed is None:
        return []
    df = results.speed
    cur = df[df.code == "current"].set_index("case")
    ref = df[df.code == "reference"].set_index("case")
    rows = []
    for case, r in cur.iterrows():
        old = ref.cpu_median_s.get(case, math.nan)
        rows.append([str(case), ms(r.wall_median_s), ms(r.cpu_median_s), ms(old),
                     "-" if missing(old) else f"{old / r.cpu_median_s:.2f}x",
                     f"{r.load_average_1min:.1f}", f"{ref.load_average_1min.get(case, math.nan):.1f}"])
    return [
        "## Allocator speed",
        "",
        "`experiments/solver_speed.py --reference DIR`: the working tree's solvers and a reference copy "
        "(DIR), each in its own subprocess one after the other on the same seeded instances, the two "
        "alternating `--repeats` times; milliseconds per solve, median over the solves (then over the repeats). The machine is shared: "
        "the 1-minute load average is given for each code, and the ratio is of CPU time, which the load "
        "distorts less than wall time." + machine_note(df),
        "",
        *md_table(["case", "wall median (ms)", "CPU median (ms)", "reference CPU (ms)",
                   "reference / current CPU", "load", "reference load"], rows, [False] + [True] * 6),
        "",
    ]
