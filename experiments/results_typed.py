"""The sections of ``docs/results.md`` on heterogeneous clusters (:mod:`results_doc`
renders them): the simulated policies on Sia's 64-GPU cluster (followed by the
real throttled cluster's runs, :func:`real_typed_section`) and the typed
allocator's round times.  Each takes the loaded :class:`results_doc.Results`
and returns its lines (none when its CSV is absent)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from results_format import machine_note, md_table, ms, pct, seconds

if TYPE_CHECKING:
    from results_doc import Results

#: Policies of ``sim_typed.csv`` in table order, with their display names.
TYPED_POLICIES = {"pollux": "Pollux (type-aware)", "pollux-all-shapes": "Pollux (type-aware), every shape",
                   "sia": "Sia", "pollux-unaware": "Pollux, type-unaware"}
#: Columns averaged over the workloads, with their labels and formatters.
TYPED_COLUMNS = [
    ("avg_jct_s", "avg JCT (s)", seconds),
    ("p99_jct_s", "p99 JCT (s)", seconds),
    ("makespan_s", "makespan (s)", seconds),
    ("worst_rho", "worst rho", lambda v: f"{v:.2f}"),
    ("gpu_hours_per_job", "GPU-hours per job", lambda v: f"{v:.2f}"),
    ("round_s_median", "round median (ms)", ms),
    ("round_s_p95", "round p95 (ms)", ms),
]


def _means(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Per policy (in :data:`TYPED_POLICIES` order), the means over the workloads
    every listed policy completed."""
    policies = [p for p in TYPED_POLICIES if p in set(df.policy)]
    common = set.intersection(*(set(df[df.policy == p].workload) for p in policies))
    sub = df[df.workload.isin(common)]
    return sub.groupby("policy")[[c for c, _, _ in TYPED_COLUMNS]].mean().reindex(policies), len(common)


#: Policies of ``real_typed.csv`` in table order, with their display names.
REAL_TYPED_POLICIES = {"fixed": "fixed", "dynamic": "dynamic", **TYPED_POLICIES}
#: Columns of the real runs' table, with their labels and formatters.
REAL_TYPED_COLUMNS = [
    ("avg_jct_s", "avg JCT (s)", seconds),
    ("max_jct_s", "max JCT (s)", seconds),
    ("makespan_s", "makespan (s)", seconds),
    ("worst_rho", "worst rho", lambda v: f"{v:.2f}"),
    ("restarts", "restarts", lambda v: f"{v:.0f}"),
    ("step_ratio", "slow/fast step", lambda v: "-" if pd.isna(v) else f"{v:.2f}"),
    ("load1", "load", lambda v: f"{v:.1f}"),
    ("wall_s", "wall (s)", seconds),
]


def typed_headline(results: Results) -> list[str] | None:
    """The README summary's row of the heterogeneous comparison (None without its three policies)."""
    if results.typed is None:
        return None
    means, count = _means(results.typed[results.typed.policy.isin(["pollux", "sia", "pollux-unaware"])])
    if set(means.index) != {"pollux", "sia", "pollux-unaware"}:
        return None
    names = " / ".join(TYPED_POLICIES[p] for p in means.index)
    return [f"Average JCT, {count} AdaptDL workloads on Sia's 64 GPUs of 3 types, simulated: {names}",
            " / ".join(seconds(float(v)) for v in means.avg_jct_s) + " s"]


def real_typed_section(results: Results) -> list[str]:
    """The latest sweep of ``experiments/real_typed.py`` (real jobs on ``local-hetero``)."""
    df = getattr(results, "real_typed", None)
    if df is None or df.empty:
        return []
    sweep = df.sweep.astype(str).iloc[-1]
    sub = df[df.sweep.astype(str) == sweep].drop_duplicates("policy", keep="last")
    order = [p for p in REAL_TYPED_POLICIES if p in set(sub.policy)] + \
        [p for p in sub.policy if p not in REAL_TYPED_POLICIES]
    sub = sub.set_index("policy").loc[order]
    rows = [[REAL_TYPED_POLICIES.get(p, p), *(fmt(float(r[c])) for c, _, fmt in REAL_TYPED_COLUMNS)]
            for p, r in sub.iterrows()]
    ratio = float(sub.sweep_step_ratio.iloc[0])
    return [
        "### Real jobs on a throttled cluster (local-hetero)",
        "",
        "`experiments/real_typed.py`: the quick `hetero` set (four built-in CPU jobs) on `local-hetero`, one node "
        "`fast` (1 CPU) and one node `slow` (1 CPU at a 0.5 cgroup CPU quota), 10 s rounds, one policy after "
        f"another (sweep {sweep}). Wall-clock runs on the shared 2-core machine: the load column is the mean "
        "1-minute load during each run. `slow/fast step` is the median over the run's jobs that ran on both "
        "types of the step-time ratio their own per-type fits predict at one replica and M0; over the sweep "
        f"(per job kind, fits pooled over the runs) it is {'-' if pd.isna(ratio) else f'{ratio:.2f}'}.",
        "",
        *md_table(["policy", *(label for _, label, _ in REAL_TYPED_COLUMNS)], rows,
                  [False] + [True] * len(REAL_TYPED_COLUMNS)),
        "",
    ]


def typed_section(results: Results) -> list[str]:
    df = results.typed
    if df is None:
        return real_typed_section(results)
    means, count = _means(df)
    rows = [[TYPED_POLICIES[p], *(fmt(float(r[c])) for c, _, fmt in TYPED_COLUMNS)] for p, r in means.iterrows()]
    lines = [
        "## Heterogeneous cluster (Sia's 64 GPUs)",
        "",
        "`experiments/sim_typed.py`: the eight AdaptDL workloads on `sia-64` (6 nodes x 4 `aws` (T4, measured) "
        "+ 3 x 8 `rtx` + 2 x 8 `dgx-ext`, synthetic per-type profiles, docs/node-types.md), interval 60 s; "
        f"means over the {count} workloads every policy completed. Round times are the policy's allocator calls "
        "on the shared machine (1-minute load in the CSV)." + machine_note(df),
        "",
        *md_table(["policy", *(label for _, label, _ in TYPED_COLUMNS)], rows, [False] + [True] * len(TYPED_COLUMNS)),
        "",
    ]
    if {"pollux", "sia", "pollux-unaware"} <= set(means.index):
        aware, sia, unaware = (float(means.avg_jct_s[p]) for p in ("pollux", "sia", "pollux-unaware"))
        lines += [
            f"Type-aware Pollux's average JCT is {100 * (aware / sia - 1):+.1f} % against Sia's; against type-unaware "
            f"Pollux, type-aware Pollux is {pct(1 - aware / unaware)} lower and Sia {pct(1 - sia / unaware)} lower "
            "(targets: Pollux at or below Sia, both at least 30 % below type-unaware Pollux).",
            "",
        ]
    if {"pollux", "pollux-all-shapes"} <= set(means.index):
        shaped, every = (float(means.avg_jct_s[p]) for p in ("pollux", "pollux-all-shapes"))
        lines += [
            f"Sia's configurations (the default on several types) against every (nodes, replicas) shape: type-aware "
            f"Pollux's average JCT {100 * (shaped / every - 1):+.1f} % (docs/node-types.md, section 7).",
            "",
        ]
    per = df.pivot_table(index="workload", columns="policy", values="avg_jct_s")
    per = per[[p for p in TYPED_POLICIES if p in per.columns]]
    rows = [[str(w), *("-" if pd.isna(v) else seconds(float(v)) for v in r)] for w, r in per.iterrows()]
    lines += [
        "Average JCT (s) per workload:",
        "",
        *md_table(["workload", *(TYPED_POLICIES[p] for p in per.columns)], rows, [False] + [True] * per.shape[1]),
        "",
    ]
    return lines + real_typed_section(results)


def solver_types_section(results: Results) -> list[str]:
    df = results.solver_types
    if df is None:
        return []
    rows = []
    for r in df.itertuples():
        gap = "-" if pd.isna(getattr(r, "max_gap", float("nan"))) else f"{100 * r.max_gap:.3f} %"
        rows.append([str(r.code), str(r.case), str(r.solves), ms(r.wall_median_s), ms(r.wall_p95_s),
                     ms(r.cpu_median_s), gap, f"{r.load_average_1min:.1f}"])
    return [
        "## Allocator rounds over node types",
        "",
        "`experiments/solver_types.py`: seeded typed instances (`solvers.testing.random_typed_problem`) on Sia's "
        "64-GPU cluster and on 2048 GPUs of three types; milliseconds per solve, build included (median over "
        "the solves, then over the alternating `--repeats`); `reference` "
        "rows are a reference copy of the code (`--reference DIR`) on the same instances. Targets: 64 GPUs "
        "median <= 20 ms and p95 <= 100 ms, 2048 GPUs <= 0.5 s at a gap <= 1 %." + machine_note(df),
        "",
        *md_table(["code", "case", "solves", "wall median (ms)", "wall p95 (ms)", "CPU median (ms)", "largest gap",
                   "load"], rows, [False, False] + [True] * 6),
        "",
    ]
