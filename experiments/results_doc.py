"""Write ``docs/results.md`` and the README's headline table from the experiments' CSVs.

Every number in ``docs/results.md`` and between the README's
``<!-- results:headline -->`` markers comes from ``experiments/results/*.csv``
(written by the scripts in ``experiments/``); nothing is typed in by hand::

    python experiments/results_doc.py            # rewrite docs/results.md and README.md's headline block
    python experiments/results_doc.py --check    # exit 1 if either is out of date

Required (the simulation scripts write ``OUT/NAME.csv``; it is kept here as
``sim_NAME.csv``): ``sim_compare.csv`` (``sim_compare.py``; the means over
workloads are computed from it), ``sim_compare_means.csv`` (also
``sim_compare.py``; only its published averages are read),
``sim_sensitivity.csv`` (``sim_sensitivity.py``), ``sim_scale.csv``
(``sim_scale.py``).  Optional,
each adding a section when present: ``solver_comparison.csv``
(``solver_comparison.py``), ``runtime_measurements.csv``
(``runtime_measurements.py --csv``), ``fidelity.csv`` (``sim_fidelity.py``),
``real_cluster.csv`` (``real_cluster.py --csv``),
``solver_speed.csv`` (``solver_speed.py``), ``ray_*.csv`` (``ray_cluster.py``;
``ray_fidelity.csv``: ``sim_fidelity.py`` on its Ray runs), ``user_jobs.csv``
(``user_jobs.py``), ``fuzz.csv`` (``fuzz_instances.py``), ``kills.csv``
(``kill_runs.py``), ``service.csv`` (``service_targets.py``), ``dashboard.csv``
(``dashboard_targets.py``), ``autoscale.csv`` (``autoscale.py``), ``autoscale_bound.csv``
(``autoscale_bound.py``) and ``fair_jct.csv``,
``fair_jct_estimator.csv`` (``fair_jct.py``, ``fair_jct_estimator.py``).
The ``*_quick.csv`` files are smoke runs and are not reported.  The simulation
sections (comparison, sensitivity, scale, solvers, allocator speed) are in
``results_sim.py``, the sections on real jobs in ``results_real.py``,
fair-jct's in ``results_fair_jct.py``, autoscaling's in ``results_autoscale.py``, the heterogeneous cluster's in
``results_typed.py``, the service's in ``results_service.py``, the simulation's speed (``encode_speed.csv``,
``fit_speed.csv``: ``encode_speed.py``, ``fit_speed.py``) in
``results_sim_speed.py``, the shared formatting in ``results_format.py``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from pollux_opt.records.files import atomic_write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its section modules, also when loaded by path
from results_format import (  # noqa: E402
    POLICY_NAMES,
    REAL_POLICY_NAMES,
    RESULTS_LINK,
    ResultsError,
    display_name,
    machines,
    md_table,
    ms,
    ordered,
    pct,
    reduction,
    seconds,
)
from results_autoscale import autoscale_headline, autoscale_section  # noqa: E402
from results_fair_jct import fair_jct_headline, fair_jct_section  # noqa: E402
from results_typed import solver_types_section, typed_headline, typed_section  # noqa: E402
from results_sim import (  # noqa: E402
    compare_section,
    mean_jct,
    per_workloadreduction,
    scale_section,
    sensitivity_section,
    solvers_section,
    speed_section,
)
from results_service import dashboard_section, service_section  # noqa: E402
from results_sim_speed import sim_speed_section  # noqa: E402
from results_real import (  # noqa: E402
    fidelity_section,
    fuzz_section,
    gpu_section,
    kills_section,
    ray_section,
    real_section,
    runtime_section,
    user_jobs_section,
)

log = logging.getLogger("results_doc")

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "experiments" / "results"
DOC_PATH = ROOT / "docs" / "results.md"
README_PATH = ROOT / "README.md"

#: The machine every committed CSV was measured on (no CSV records it).
#: The machine of every table whose CSV names none (its processor as ``solver_speed.machine_name`` writes it).
MACHINE_NAME = "AMD EPYC, 2 vCPUs"
MACHINE = f"the project's 2-core development machine ({MACHINE_NAME}, 23 GiB memory, no GPU)"

HEADLINE_BEGIN = "<!-- results:headline -->"
HEADLINE_END = "<!-- /results:headline -->"

#: Script that writes each results CSV (for error messages).
SOURCES = {
    "sim_compare.csv": "sim_compare.py", "sim_compare_means.csv": "sim_compare.py",
    "sim_sensitivity.csv": "sim_sensitivity.py", "sim_scale.csv": "sim_scale.py",
    "service.csv": "service_targets.py", "dashboard.csv": "dashboard_targets.py",
}
REQUIRED_COLUMNS = {
    "sim_compare.csv": ["workload", "policy", "jobs", "completed", "avg_jct_s", "p99_jct_s", "makespan_s",
                        "worst_rho", "frac_rho_gt_1", "wall_s"],
    "sim_compare_means.csv": ["policy", "published_avg_jct_s"],
    "sim_sensitivity.csv": ["axis", "value", "policy", "avg_jct_s", "completed", "jobs"],
    "sim_scale.csv": ["cpus", "policy", "jobs", "completed", "avg_jct_s", "mean_solver_s", "p95_solver_s",
                      "max_solver_s", "wall_s"],
}
#: Columns of sim_compare.csv averaged over the workloads (the means table).
MEAN_COLUMNS = ["avg_jct_s", "p99_jct_s", "makespan_s", "worst_rho", "frac_rho_gt_1", "wall_s"]
OPTIONAL_COLUMNS = {
    "solver_comparison.csv": ["size", "solver", "status", "objective", "gap", "total_s", "solve_cpu_s"],
    "runtime_measurements.csv": ["job"],
    "runtime_gpu.csv": ["job", "device"],
    "real_gpu.csv": ["policy", "cluster", "avg_jct_s"],
    "fidelity.csv": ["run", "policy", "variant", "real_avg_jct_s", "sim_avg_jct_s", "rel_error"],
    "real_cluster.csv": ["workload", "policy", "avg_jct_s", "worst_rho", "avg_goodput", "overhead_pct_of_interval"],
    "solver_speed.csv": ["code", "case", "solves", "wall_median_s", "wall_p95_s", "cpu_median_s", "load_average_1min"],
    "ray_rescale.csv": ["to", "replicas", "seconds"],
    "ray_vs_local.csv": ["backend", "policy", "avg_jct_s", "makespan_s", "overhead_pct_of_interval", "mean_load1"],
    "ray_fidelity.csv": ["run", "policy", "variant", "real_avg_jct_s", "sim_avg_jct_s", "rel_error"],
    "user_jobs.csv": ["part", "job", "value_pct", "target_pct", "detail", "load1"],
    "fuzz.csv": ["front_end", "mode", "cases", "answered", "rejected", "tracebacks", "hangs", "wrong_status",
                 "max_case_seconds"],
    "kills.csv": ["test", "policy", "kills", "scheduler_kills", "worker_kills", "rank0_kills", "jobs", "verified",
                  "steps_repeated_where_none_may_be", "steps_repeated_after_rank0_kills", "processes_left",
                  "temp_dirs_left", "same_outcome_as_without_kills", "load1"],
    "fair_jct.csv": ["set", "workload", "policy", "avg_jct_s", "p99_jct_s", "worst_rho", "jain_index", "wall_s"],
    "fair_jct_estimator.csv": ["workload", "variant", "application", "samples", "median_rel_error",
                               "p90_rel_error", "median_ratio"],
    "sim_typed.csv": ["workload", "policy", "avg_jct_s", "p99_jct_s", "makespan_s", "worst_rho",
                       "gpu_hours_per_job", "round_s_median", "round_s_p95"],
    "solver_types.csv": ["code", "case", "solves", "wall_median_s", "wall_p95_s", "cpu_median_s",
                         "load_average_1min"],
    "real_typed.csv": ["sweep", "policy", "avg_jct_s", "max_jct_s", "makespan_s", "worst_rho", "restarts", "load1",
                        "wall_s", "step_ratio", "sweep_step_ratio"],
    "fair_jct_diagnosis.csv": ["run", "application", "jobs", "mean_jct_s", "share_of_mean", "wait_s", "restarts",
                               "restart_s", "mean_replicas", "max_replicas"],
    "encode_speed.csv": ["code", "wall_s", "cpu_s", "encode_cpu_s", "encode_cpu_share", "identical_jobs_csv",
                         "load_average_1min_before"],
    "fit_speed.csv": ["case", "code", "fits", "ms_per_fit", "cpu_ms_per_fit", "differing_fits", "load_average_1min"],
    "fair_jct_speed.csv": ["code", "policy", "wall_s", "cpu_s", "solve_s", "highs_mip_s", "fit_s", "encode_s",
                           "policy_jobs_s", "work_rates_s", "solve_calls", "highs_mip_calls", "fit_calls",
                           "work_rates_calls", "identical_jobs_csv"],
    "service.csv": ["target", "metric", "value", "unit", "limit", "passed", "n", "machine"],
    "dashboard.csv": ["target", "metric", "value", "unit", "limit", "passed", "n", "machine"],
    "autoscale.csv": ["set", "workload", "rule", "grow_above", "shrink_below", "weak_scaling", "nodes", "startup_s",
                      "jobs", "completed", "avg_jct_s", "p99_jct_s", "makespan_s", "node_hours", "cost",
                      "most_nodes", "wall_s"],
    "autoscale_bound.csv": ["set", "workload", "time_value", "jobs", "slots_per_node", "node_hours", "avg_jct_s"],
}
@dataclass(frozen=True)
class Results:
    """The experiments' tables (optional ones None when their CSV is absent)."""

    compare: pd.DataFrame
    means: pd.DataFrame
    sensitivity: pd.DataFrame
    scale: pd.DataFrame
    solvers: pd.DataFrame | None
    runtime: pd.DataFrame | None
    fidelity: pd.DataFrame | None
    real: pd.DataFrame | None
    plots: tuple[str, ...]  # PNG file names present in the results folder
    speed: pd.DataFrame | None = None
    ray: dict | None = None  # ray_*.csv by file name (those present), None without any
    user_jobs: pd.DataFrame | None = None
    fuzz: pd.DataFrame | None = None
    kills: pd.DataFrame | None = None
    fair_jct: pd.DataFrame | None = None
    fair_jct_estimator: pd.DataFrame | None = None
    fair_jct_diagnosis: pd.DataFrame | None = None
    typed: pd.DataFrame | None = None
    solver_types: pd.DataFrame | None = None
    real_typed: pd.DataFrame | None = None
    encode_speed: pd.DataFrame | None = None
    fit_speed: pd.DataFrame | None = None
    fair_jct_speed: pd.DataFrame | None = None
    service: pd.DataFrame | None = None
    dashboard: pd.DataFrame | None = None
    autoscale: pd.DataFrame | None = None
    autoscale_bound: pd.DataFrame | None = None
    runtime_gpu: pd.DataFrame | None = None
    real_gpu: pd.DataFrame | None = None


def _read(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    df = pd.read_csv(path)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ResultsError(f"{path} lacks column(s) {missing}; it has {list(df.columns)}")
    if df.empty:
        raise ResultsError(f"{path} has no rows")
    return df


def _check_keys(df: pd.DataFrame, name: str, keys: list[str], policies: set[str]) -> None:
    """ResultsError unless ``keys`` identify ``df``'s rows and every one of ``policies`` has rows."""
    dup = df[df.duplicated(keys, keep=False)]
    if not dup.empty:
        raise ResultsError(f"{name} has several rows for {keys} = {dup[keys].iloc[0].tolist()}")
    missing = sorted(policies - set(df.policy))
    if missing:
        raise ResultsError(f"{name} has no rows for policy {missing}")


def load_results(results_dir: Path) -> Results:
    """Read the CSVs in ``results_dir``; ResultsError naming the file if a required one is missing."""
    tables: dict[str, pd.DataFrame | None] = {}
    for name, columns in REQUIRED_COLUMNS.items():
        path = results_dir / name
        if not path.is_file():
            raise ResultsError(f"required results file {path} is missing (written by experiments/"
                               f"{SOURCES[name]})")
        tables[name] = _read(path, columns)
        log.info("read %s (%d rows)", path, len(tables[name]))
    for name, columns in OPTIONAL_COLUMNS.items():
        path = results_dir / name
        if path.is_file():
            tables[name] = _read(path, columns)
            log.info("read %s (%d rows)", path, len(tables[name]))
        else:
            tables[name] = None
            log.info("no %s: its section is left out", path)
    _check_keys(tables["sim_compare.csv"], "sim_compare.csv", ["workload", "policy"], {"pollux", "tiresias"})
    _check_keys(tables["sim_sensitivity.csv"], "sim_sensitivity.csv", ["axis", "value", "policy"], {"pollux"})
    _check_keys(tables["sim_scale.csv"], "sim_scale.csv", ["cpus", "policy"], {"pollux"})
    plots = tuple(sorted(p.name for p in results_dir.glob("*.png") if "_quick" not in p.name))
    return Results(
        compare=tables["sim_compare.csv"],
        means=compare_means(tables["sim_compare.csv"], tables["sim_compare_means.csv"]),
        sensitivity=tables["sim_sensitivity.csv"],
        scale=tables["sim_scale.csv"],
        solvers=tables["solver_comparison.csv"],
        runtime=tables["runtime_measurements.csv"],
        fidelity=tables["fidelity.csv"],
        real=tables["real_cluster.csv"],
        plots=plots,
        speed=tables["solver_speed.csv"],
        ray={n: t for n, t in tables.items() if n.startswith("ray_") and t is not None} or None,
        user_jobs=tables["user_jobs.csv"],
        fuzz=tables["fuzz.csv"],
        kills=tables["kills.csv"],
        fair_jct=tables["fair_jct.csv"],
        fair_jct_estimator=tables["fair_jct_estimator.csv"],
        fair_jct_diagnosis=tables["fair_jct_diagnosis.csv"],
        typed=tables["sim_typed.csv"],
        solver_types=tables["solver_types.csv"],
        real_typed=tables["real_typed.csv"],
        encode_speed=tables["encode_speed.csv"],
        fit_speed=tables["fit_speed.csv"],
        fair_jct_speed=tables["fair_jct_speed.csv"],
        service=tables["service.csv"],
        dashboard=tables["dashboard.csv"],
        autoscale=tables["autoscale.csv"],
        autoscale_bound=tables["autoscale_bound.csv"],
        runtime_gpu=tables["runtime_gpu.csv"],
        real_gpu=tables["real_gpu.csv"],
    )


def compare_means(compare: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Per policy, the means over workloads of ``compare``'s columns, the largest wall time, and
    the published average JCT (``published``'s column; NaN where it has none) with our ratio to it."""
    means = compare.groupby("policy")[MEAN_COLUMNS].mean()
    means["max_wall_s"] = compare.groupby("policy").wall_s.max()
    means["workloads"] = compare.groupby("policy").workload.nunique()
    means = means.join(published.set_index("policy")[["published_avg_jct_s"]], how="left")
    means["ratio_to_published"] = means.avg_jct_s / means.published_avg_jct_s
    return means.reset_index()


# ----------------------------------------------------------------------------- sections


def headline(results: Results) -> list[str]:
    """The README's summary table (also the top of docs/results.md)."""
    m = results.means
    policies = ordered(m.policy, POLICY_NAMES)
    n_workloads = results.compare.workload.nunique()
    names = " / ".join(display_name(p) for p in policies)
    ours = " / ".join(seconds(mean_jct(results, p)) for p in policies)
    published = " / ".join(seconds(float(m[m.policy == p].published_avg_jct_s.iloc[0])) for p in policies)
    red = per_workloadreduction(results)
    scale = results.scale[results.scale.policy == "pollux"].sort_values("cpus")
    small, large = scale.iloc[0], scale.iloc[-1]
    pm = m[m.policy == "pollux"].iloc[0]
    rows = [
        [f"Average JCT, {n_workloads} AdaptDL workloads, 16 x 4 simulated: {names}", f"{ours} s"],
        [f"Published Pollux-simulator averages: {names}", f"{published} s"],
        [f"Pollux's average JCT below Tiresias ({n_workloads}-workload mean; per-workload range)",
         f"{pct(reduction(mean_jct(results, 'pollux'), mean_jct(results, 'tiresias')), 1)}"
         f" ({pct(red.min())} to {pct(red.max())})"],
        [f"Pollux scheduling round (speedup tables + MILP), mean / p95, {small.cpus:.0f} CPUs and "
         f"{large.cpus:.0f} CPUs", f"{ms(small.mean_solver_s)} / {ms(small.p95_solver_s)} ms and "
                                   f"{ms(large.mean_solver_s)} / {ms(large.p95_solver_s)} ms"],
        [f"Simulating one {int(results.compare.jobs.max())}-job workload under Pollux, wall (mean, max)",
         f"{pm.wall_s:.0f} s, {pm.max_wall_s:.0f} s"],
    ]
    typed = typed_headline(results)
    if typed is not None:
        rows.insert(3, typed)
    fair = fair_jct_headline(results)
    if fair is not None:
        rows.insert(3, fair)
    scaled = autoscale_headline(results)
    if scaled is not None:
        rows.insert(3, scaled)
    if results.real is not None:
        real = results.real
        workload = "mixed" if "mixed" in set(real.workload) else str(real.workload.iloc[0])
        sub = real[real.workload == workload]
        pols = ordered(sub.policy, REAL_POLICY_NAMES)
        if "sweep" in sub.columns:  # policies compared within the sweeps that ran them all
            complete = [w for w, runs in sub.groupby("sweep") if set(pols) <= set(runs.policy)]
            sub = sub[sub.sweep.isin(complete)] if complete else sub
        runs = sub.groupby("policy").size()[pols]
        count = (f"{runs.iloc[0]} run{'s' if runs.iloc[0] > 1 else ''}" if runs.nunique() == 1
                 else f"{' / '.join(map(str, runs))} runs")
        rows.append([f"Real CPU jobs, set `{workload}`, average JCT (mean of {count}): {' / '.join(pols)}",
                     " / ".join(f"{float(sub[sub.policy == p].avg_jct_s.mean()):.1f}" for p in pols) + " s"])
    return md_table(["result", "value"], rows, [False, True])


def render_doc(results: Results) -> str:
    lines = [
        "# Results",
        "",
        "<!-- Generated by `python experiments/results_doc.py` from experiments/results/*.csv; "
        "do not edit by hand. -->",
        "",
        f"All figures were measured on {MACHINE}, except in the tables that name another machine. "
        "The CSVs and plots are in "
        f"[`experiments/results/`]({RESULTS_LINK}/); each section names the script that writes its CSV. "
        "Wall times are of a shared machine: read them as orders of magnitude, and compare policies "
        "within one table.",
        "",
        "## Summary",
        "",
        *headline(results),
        "",
        *compare_section(results),
        *sensitivity_section(results),
        *fair_jct_section(results),
        *typed_section(results),
        *autoscale_section(results),
        *scale_section(results),
        *solvers_section(results),
        *speed_section(results),
        *sim_speed_section(results),
        *solver_types_section(results),
        *runtime_section(results),
        *gpu_section(results),
        *fidelity_section(results),
        *real_section(results),
        *ray_section(results),
        *user_jobs_section(results),
        *fuzz_section(results),
        *kills_section(results),
        *service_section(results),
        *dashboard_section(results),
        "## Solver benchmarks",
        "",
        "The allocator's own timings (build + solve per instance, the Pollux reference scheduler's recorded "
        "rounds, and `milp` against `evolutionary` and `greedy`) are kept by the benchmark suite, "
        "`python -m pytest benchmarks/ --benchmark`, with the machine and date of each run: "
        "[`benchmarks/results.md`](../benchmarks/results.md) and "
        "[`benchmarks/results-solvers.md`](../benchmarks/results-solvers.md).",
        "",
    ]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def render_headline_block(results: Results) -> str:
    """The README's block, markers included."""
    where = machines([results.compare, results.scale, results.typed, results.real], MACHINE_NAME)
    note = f"Measured on {where[0]}." if len(where) == 1 else f"Measured on these machines: {'; '.join(where)}."
    return "\n".join([HEADLINE_BEGIN, *headline(results), "", note, HEADLINE_END])


def replace_block(text: str, block: str) -> str:
    """``text`` with its headline block (markers included) replaced by ``block``."""
    start, end = text.find(HEADLINE_BEGIN), text.find(HEADLINE_END)
    if start < 0 or end < start:
        raise ResultsError(f"README lacks the markers {HEADLINE_BEGIN} ... {HEADLINE_END}")
    return text[:start] + block + text[end + len(HEADLINE_END):]


# ----------------------------------------------------------------------------- files


def _read_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of the experiments' CSVs")
    ap.add_argument("--out", type=Path, default=DOC_PATH, help="results document to write (docs/results.md)")
    ap.add_argument("--readme", type=Path, default=README_PATH,
                    help="README whose headline block to update (README.md)")
    ap.add_argument("--no-readme", action="store_true", help="leave the README alone")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    ap.add_argument("--log-level", default="INFO", help="progress logging level (INFO)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    log.setLevel(args.log_level.upper())
    try:
        results = load_results(args.results)
        wanted = {args.out: render_doc(results)}
        if not args.no_readme:
            current = _read_text(args.readme)
            if current is None:
                raise ResultsError(f"README {args.readme} does not exist")
            wanted[args.readme] = replace_block(current, render_headline_block(results))
    except ResultsError as exc:
        log.error("%s", exc)
        return 2
    stale = [path for path, text in wanted.items() if _read_text(path) != text]
    if args.check:
        for path in stale:
            log.error("%s is out of date: run python experiments/results_doc.py", path)
        if not stale:
            log.info("up to date: %s", ", ".join(str(p) for p in wanted))
        return 1 if stale else 0
    for path in stale:
        atomic_write_text(path, wanted[path])
        log.info("wrote %s", path)
    for path in set(wanted) - set(stale):
        log.info("unchanged: %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
