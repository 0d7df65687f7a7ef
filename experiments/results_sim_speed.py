"""The simulation-speed section of ``docs/results.md`` (:mod:`results_doc` renders it):
one workload-6 Pollux simulation, the working tree against a reference copy of
the repository in the same run, with the share of its time spent encoding each
round's problem (``experiments/encode_speed.py``) and fitting throughput models
(``experiments/fit_speed.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from results_format import machine_note, md_table, missing

if TYPE_CHECKING:
    from results_doc import Results

#: The code label both scripts give the working tree.
WORKING_TREE = "working tree"


def _ratio(new: float, old: float) -> str:
    return "-" if missing(new) or missing(old) or new == 0 else f"{old / new:.2f}x"


def _encode_rows(df) -> list[list[str]]:
    """Per code: the simulation's wall and CPU, to_problem's CPU and share, identity, load."""
    means = df.groupby("code").agg(wall_s=("wall_s", "mean"), cpu_s=("cpu_s", "mean"),
                                   encode_cpu_s=("encode_cpu_s", "mean"),
                                   share=("encode_cpu_share", "mean"), runs=("wall_s", "size"),
                                   identical=("identical_jobs_csv", "all"),
                                   load=("load_average_1min_before", "mean"))
    tree = means.loc[WORKING_TREE] if WORKING_TREE in means.index else None
    rows = []
    for code, r in means.iterrows():
        rows.append([str(code), str(int(r.runs)), f"{r.wall_s:.1f}", f"{r.cpu_s:.1f}", f"{r.encode_cpu_s:.1f}",
                     f"{100 * r.share:.0f} %", "-" if tree is None else _ratio(tree.cpu_s, r.cpu_s),
                     "yes" if r.identical else "no", f"{r.load:.1f}"])
    return rows


#: CSV columns of the stages :func:`_stage_rows` splits the working tree's simulation into.
STAGE_COLUMNS = ("highs_mip_s", "highs_s", "solve_s", "encode_s", "fit_s")


def _stage_rows(df) -> list[list[str]]:
    """The working tree's simulation by stage: mean wall seconds and share of its wall
    (nothing when its rows lack a stage)."""
    tree = df[df.code == WORKING_TREE]
    if tree.empty or any(c not in tree.columns or tree[c].isna().any() for c in STAGE_COLUMNS):
        return []
    m = tree[[*STAGE_COLUMNS, "wall_s"]].astype(float).mean()
    stages = [
        ("HiGHS's branch and bound (rounds whose LP relaxation is fractional)", m.highs_mip_s),
        ("HiGHS's LP relaxations", m.highs_s - m.highs_mip_s),
        ("the rest of the MILP rounds (price relaxation, model, decoding)", m.solve_s - m.highs_s),
        ("`to_problem` (speedup tables, batch search)", m.encode_s),
        ("throughput fits (scipy's trust-region least squares)", m.fit_s),
        ("the rest (simulator, views, policy, event log)", m.wall_s - m.solve_s - m.encode_s - m.fit_s),
    ]
    return [[name, f"{s:.1f}", f"{100 * s / m.wall_s:.0f} %"] for name, s in stages]


def _fit_rows(df) -> list[list[str]]:
    """Per code: CPU and wall milliseconds per replayed fit, and the fits whose answer differs."""
    replay = df[df.case == "replay"].set_index("code")
    tree = replay.loc[WORKING_TREE] if WORKING_TREE in replay.index else None
    return [[str(code), str(int(r.fits)), f"{r.cpu_ms_per_fit:.1f}", f"{r.ms_per_fit:.1f}",
             "-" if tree is None else _ratio(tree.cpu_ms_per_fit, r.cpu_ms_per_fit),
             str(int(r.differing_fits)), f"{r.load_average_1min:.1f}"] for code, r in replay.iterrows()]


def sim_speed_section(results: Results) -> list[str]:
    """The section, or nothing when neither CSV is present."""
    lines: list[str] = []
    if results.encode_speed is not None:
        lines += [
            "## Simulation speed",
            "",
            "`experiments/encode_speed.py --code reference=DIR`: one workload-6 Pollux simulation (160 jobs, "
            "16 x 4 CPUs, interval 60 s) per code and round, the codes alternating, each in its own process; "
            "`to_problem` is the encoding of each round's allocation problem (speedup tables and batch "
            "search). Means over the rounds; \"same jobs.csv\": identical to the working tree's first run."
            + machine_note(results.encode_speed),
            "",
            *md_table(["code", "runs", "wall (s)", "CPU (s)", "to_problem CPU (s)", "to_problem share",
                       "CPU / working tree", "same jobs.csv", "load"], _encode_rows(results.encode_speed),
                      [False] + [True] * 8),
            "",
        ]
        stages = _stage_rows(results.encode_speed)
        if stages:
            lines += [
                "Where the working tree's simulation spends its wall time (means over its runs above):",
                "",
                *md_table(["stage", "wall (s)", "share"], stages, [False, True, True]),
                "",
                "HiGHS's branch and bound and the fits decide the answers: among equally good placements "
                "HiGHS returns the first its search meets, and a fit's parameters are where scipy's "
                "iteration stops, so another HiGHS option, warm start or least-squares code gives other "
                "JCTs. The other stages leave the answers as they are.",
                "",
            ]
    if results.fit_speed is not None:
        lines += [
            "`experiments/fit_speed.py`: the 406 throughput fits of one workload-6 Pollux simulation, recorded "
            "and replayed by each code in one process (milliseconds per fit; \"differing\": fits whose "
            "parameters differ from the working tree's)." + machine_note(results.fit_speed),
            "",
            *md_table(["code", "fits", "CPU ms / fit", "wall ms / fit", "CPU / working tree", "differing",
                       "load"], _fit_rows(results.fit_speed), [False] + [True] * 6),
            "",
        ]
    return lines
