"""The sections of ``docs/results.md`` on real jobs (:mod:`results_doc` renders
them): runtime measurements, the simulator's fidelity, real-cluster runs,
Ray, user jobs, hostile instance files, and kills.  Each takes the loaded
:class:`results_doc.Results` and returns its lines (none when its CSV is absent)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from results_format import REAL_POLICY_NAMES, display_name, md_table, missing, ordered

if TYPE_CHECKING:
    from results_doc import Results

#: runtime_measurements.py columns shown when present (its --parts choose which exist).
RUNTIME_COLUMNS = [
    ("to_target_s", "to target on 1 CPU (s)", lambda v: f"{v:.1f}"),
    ("to_verified_s", "to verified (s)", lambda v: f"{v:.1f}"),
    ("rescale_median_s", "rescale median (s)", lambda v: f"{v:.3f}"),
    ("rescale_max_s", "rescale max (s)", lambda v: f"{v:.2f}"),
    ("mape_pct", "held-out step-time MAPE", lambda v: f"{v:.1f} %"),
    ("max_ape_pct", "worst held-out row", lambda v: f"{v:.1f} %"),
    ("passes", "profiling passes", lambda v: f"{v:.0f}"),
    ("repeat_pct", "pass-to-pass difference", lambda v: f"{v:.1f} %"),
    ("kappa", "fitted kappa", lambda v: f"{v:.2f}"),
]


def _runtime_table(df) -> list[str]:
    cols = [(c, label, fmt) for c, label, fmt in RUNTIME_COLUMNS if c in df.columns]
    rows = [[str(r["job"]), *("-" if missing(r[c]) else fmt(float(r[c])) for c, _, fmt in cols)]
            for _, r in df.iterrows()]
    return md_table(["job", *(label for _, label, _ in cols)], rows, [False] + [True] * len(cols))


def runtime_section(results: Results) -> list[str]:
    if results.runtime is None:
        return []
    return [
        "## Elastic CPU training jobs",
        "",
        "`experiments/runtime_measurements.py`: each built-in job trained on one CPU to its target and "
        "verified, rescaled between 1 and 2 replicas, and its throughput model fitted on 7 profiled "
        "configurations and checked on 5 held-out ones.",
        "",
        *_runtime_table(results.runtime),
        "",
    ]


#: real_typed.py --gpus columns shown (label, format).
GPU_RUN_COLUMNS = [
    ("avg_jct_s", "average JCT (s)", lambda v: f"{v:.1f}"),
    ("p99_jct_s", "p99 JCT (s)", lambda v: f"{v:.1f}"),
    ("makespan_s", "makespan (s)", lambda v: f"{v:.1f}"),
    ("restarts", "restarts", lambda v: f"{v:.0f}"),
    ("step_ratio", "cpu/gpu step time", lambda v: f"{v:.2f}"),
]


def gpu_section(results: Results) -> list[str]:
    """Real jobs on GPUs (``runtime_gpu.csv``, ``real_gpu.csv``), each table with its device;
    where neither exists, that no GPU has run them."""
    lines = ["## Elastic jobs on GPUs", ""]
    if results.runtime_gpu is None and results.real_gpu is None:
        return lines + [
            "Not measured: no machine with a GPU has run these measurements yet. The GPU code paths "
            "([gpus.md](gpus.md)) are covered by tests that need no CUDA. On a machine with a GPU, "
            "`experiments/runtime_measurements.py --gpus 1 --csv experiments/results/runtime_gpu.csv` and "
            "`experiments/real_typed.py --gpus 1 --csv experiments/results/real_gpu.csv` write this section's CSVs.",
            ""]
    if results.runtime_gpu is not None:
        devices = ", ".join(sorted(set(map(str, results.runtime_gpu["device"]))))
        lines += [f"`experiments/runtime_measurements.py --gpus`, on {devices}: each built-in job to its target "
                  "on the GPU, rescaled (between 1 and 2 GPUs, or with one GPU between the GPU and a CPU core), "
                  "and its step-time model's held-out error.", "", *_runtime_table(results.runtime_gpu), ""]
    if results.real_gpu is not None:
        df = results.real_gpu
        rows = [[display_name(str(r["policy"])), str(r["cluster"]),
                 *("-" if missing(r.get(c)) else fmt(float(r[c])) for c, _, fmt in GPU_RUN_COLUMNS)]
                for _, r in df.iterrows()]
        lines += ["`experiments/real_typed.py --gpus`: the quick `hetero` set on the GPUs and the CPU cores as "
                  "two node types.", "",
                  *md_table(["policy", "cluster", *(label for _, label, _ in GPU_RUN_COLUMNS)], rows,
                            [False, False] + [True] * len(GPU_RUN_COLUMNS)), ""]
    return lines


def fidelity_section(results: Results) -> list[str]:
    if results.fidelity is None:
        return []
    df = results.fidelity
    rows = [[str(r.run), str(r.policy), str(r.variant), f"{r.real_avg_jct_s:.1f}", f"{r.sim_avg_jct_s:.1f}",
             f"{100 * r.rel_error:+.1f} %"] for r in df.itertuples()]
    return [
        "## Simulator fidelity",
        "",
        "`experiments/sim_fidelity.py`: real runs exported as profiles (`pollux-opt profile`) and replayed "
        "under the same policy, cluster and interval; **paper** is Pollux's simulator (fixed rounds), "
        "**matched** also models what the executor does around the jobs (early rounds, measured start and "
        "verification times, the one-replica split).",
        "",
        *md_table(["run", "policy", "variant", "real avg JCT (s)", "simulated (s)", "error"], rows,
                  [False, False, False, True, True, True]),
        "",
    ]


def real_section(results: Results) -> list[str]:
    """Every run of ``real_cluster.csv`` (set, sweep, policy), then fair-jct against pollux per set and sweep."""
    if results.real is None:
        return []
    df = results.real
    sweeps = df["sweep"].astype(str) if "sweep" in df.columns else None
    rows, versus = [], []
    for w in list(dict.fromkeys(df.workload)):
        in_set = df[df.workload == w]
        for sweep in (list(dict.fromkeys(sweeps[in_set.index])) if sweeps is not None else [None]):
            sub = (in_set if sweep is None else in_set[sweeps[in_set.index] == sweep]).set_index("policy")
            for p in ordered(sub.index, REAL_POLICY_NAMES):
                r = sub.loc[p]
                load = f"{r.load1:.1f}" if "load1" in sub.columns and not missing(r.load1) else "-"
                rows.append([str(w), "-" if sweep is None else sweep, display_name(p, REAL_POLICY_NAMES),
                             f"{r.avg_jct_s:.1f}", f"{r.worst_rho:.2f}", f"{r.avg_goodput:.2f}",
                             f"{r.overhead_pct_of_interval:.2f} %", load])
            if {"pollux", "fair-jct"} <= set(sub.index):
                versus.append(f"`{w}`{'' if sweep is None else f' sweep {sweep}'}: "
                              f"{100 * (sub.loc['fair-jct'].avg_jct_s / sub.loc['pollux'].avg_jct_s - 1):+.1f} %")
    out = [
        "## Real CPU jobs",
        "",
        "`experiments/real_cluster.py` (`pollux-opt demo` per workload set): real CPU training jobs on this "
        "machine, the policies one after another; every run is listed (a sweep runs each policy once). "
        "Average goodput is in single-CPU equivalents; overhead is the scheduler's time per round in % of the "
        "interval; load is the mean 1-minute load average during the run. Wall-clock figures on a shared "
        "machine: compare policies within one sweep.",
        "",
        *md_table(["set", "sweep", "policy", "avg JCT (s)", "worst rho", "avg goodput", "overhead", "load"], rows,
                  [False, False, False, True, True, True, True, True]),
        "",
    ]
    if versus:
        out += ["fair-jct's average JCT against pollux's in the same sweep: " + "; ".join(versus) + ".", ""]
    if sweeps is not None and "machine" in df.columns:
        by_machine: dict[str, list[str]] = {}
        for sweep, machine in dict.fromkeys(zip(sweeps, df.machine)):
            if not missing(machine) and sweep not in by_machine.setdefault(str(machine), []):
                by_machine[str(machine)].append(sweep)
        where = [f"sweep{'s' if len(s) > 1 else ''} {', '.join(s)} on {m}" for m, s in by_machine.items()]
        out += ["Machines: " + "; ".join(where) + ".", ""]
    return out


#: ray_vs_local.csv's phase columns and their headers.
RAY_PHASES = {"wait_s": "waiting", "startup_s": "starting", "train_s": "training", "verify_s": "verifying"}


def ray_section(results: Results) -> list[str]:
    if results.ray is None:
        return []
    out = ["## Real jobs on a 2-node Ray cluster", "",
           "`experiments/ray_cluster.py`: a Ray test cluster on this machine (`ray.cluster_utils.Cluster`: a "
           "head without CPUs, two nodes of one CPU each); see [`docs/ray.md`](ray.md).", ""]
    rescale = results.ray.get("ray_rescale.csv")
    if rescale is not None:
        warm = rescale.iloc[1:] if len(rescale) > 1 else rescale  # the first one starts the second node's actor
        out += [f"Rescales across the nodes (checkpoint, re-form the group, resume): median "
                f"{rescale.seconds.median():.2f} s over {len(rescale)}, {warm.seconds.median():.2f} s without the "
                f"first (which builds the job in the second node's actor: {rescale.seconds.iloc[0]:.2f} s), "
                f"max {rescale.seconds.max():.2f} s.", ""]
    vs = results.ray.get("ray_vs_local.csv")
    if vs is not None:
        rows = []
        for policy in list(dict.fromkeys(vs.policy)):
            sub = vs[vs.policy == policy].set_index("backend")
            if {"ray", "local"} <= set(sub.index):
                r, lo = sub.loc["ray"], sub.loc["local"]
                rows.append([display_name(policy, REAL_POLICY_NAMES), f"{r.avg_jct_s:.1f}", f"{lo.avg_jct_s:.1f}",
                             f"{100 * (r.avg_jct_s / lo.avg_jct_s - 1):+.0f} %",
                             f"{r.overhead_pct_of_interval:.2f} %", f"{lo.overhead_pct_of_interval:.2f} %",
                             f"{r.mean_load1:.1f} / {lo.mean_load1:.1f}"])
        out += ["The quick `mixed` workload on the Ray cluster and on the local backend with the same 2 x 1 "
                "CPUs, each policy on both in turn; overhead is the scheduler's time per round in % of the "
                "interval.", "",
                *md_table(["policy", "Ray avg JCT (s)", "local (s)", "Ray vs local", "Ray overhead",
                           "local overhead", "load (Ray / local)"], rows, [False] + [True] * 6), ""]
        if set(RAY_PHASES) <= set(vs.columns):
            rows = [[display_name(r.policy, REAL_POLICY_NAMES), str(r.backend), f"{r.avg_jct_s:.1f}",
                     *(f"{getattr(r, c):.1f}" for c in RAY_PHASES)] for r in vs.itertuples()]
            out += ["Where a job's time goes, mean seconds per job (from each run's events): waiting for CPUs "
                    "(submit to start), starting (the workers' start, the job's build and the steps to its first "
                    "evaluation), training (first to last evaluation) and verifying (last evaluation to the "
                    "verified completion, in a fresh process).", "",
                    *md_table(["policy", "backend", "avg JCT", *RAY_PHASES.values()], rows,
                              [False, False] + [True] * 5), ""]
    fid = results.ray.get("ray_fidelity.csv")
    if fid is not None:
        rows = [[str(r.policy), str(r.variant), f"{r.real_avg_jct_s:.1f}", f"{r.sim_avg_jct_s:.1f}",
                 f"{100 * r.rel_error:+.1f} %"] for r in fid.itertuples()]
        out += ["The Ray runs replayed in the simulator with the profiles measured in them "
                "(`experiments/sim_fidelity.py`).", "",
                *md_table(["policy", "variant", "real avg JCT (s)", "simulated (s)", "error"], rows,
                          [False, False, True, True, True]), ""]
    return out


def user_jobs_section(results: Results) -> list[str]:
    if results.user_jobs is None:
        return []
    names = {"overhead": "keep-your-loop CPU time per step over the builder protocol",
             "mape": "held-out step-time MAPE of the fitted model"}
    rows = [[names.get(r.part, str(r.part)), str(r.job), f"{r.value_pct:.1f} %", f"<= {r.target_pct:g} %",
             str(r.detail), f"{r.load1:.1f}"] for r in results.user_jobs.itertuples()]
    return [
        "## Users' own training loops",
        "",
        "`experiments/user_jobs.py`: the wrapper of `pollux_opt.elastic` against the builder protocol on the "
        "same model (one replica, in-process), and the throughput model fitted to the example scripts of "
        "`examples/user-jobs/` (see [`docs/user-jobs.md`](user-jobs.md)).",
        "",
        *md_table(["measure", "job", "value", "target", "detail", "load"], rows,
                  [False, False, True, True, False, True]),
        "",
    ]


def fuzz_section(results: Results) -> list[str]:
    if results.fuzz is None:
        return []
    rows = [[str(r.front_end), str(r.mode), f"{r.cases:.0f}", f"{r.answered:.0f}", f"{r.rejected:.0f}",
             f"{r.tracebacks:.0f}", f"{r.hangs:.0f}", f"{r.wrong_status:.0f}", f"{r.max_case_seconds:.1f}"]
            for r in results.fuzz.itertuples()]
    return [
        "## Hostile instance files",
        "",
        "`experiments/fuzz_instances.py`: seeded instance files (about 60 % valid, 30 % with hostile values, "
        "10 % with hostile bytes) through `pollux_opt.allocate` and `pollux-opt allocate`, 5 s time limit each. "
        "A traceback is any exception but `InvalidProblem` (or an exit status other than 0 and 2), a hang a "
        "case 30 s past its limit, a wrong status an answer whose placement breaks a constraint under a "
        "status that claims a solution, or an `optimal` one worse than the greedy solver's. A subprocess case's "
        "time includes the interpreter's start-up and imports, which on the shared, loaded machine can alone "
        "exceed the slack; the slowest case's seconds are shown.",
        "",
        *md_table(["front end", "CLI run as", "cases", "answered", "rejected (exit 2)", "tracebacks", "hangs",
                   "wrong status", "slowest case (s)"], rows, [False, False] + [True] * 7),
        "",
    ]


def _count(v) -> str:
    return "" if missing(v) else f"{float(v):.0f}"


def kills_section(results: Results) -> list[str]:
    if results.kills is None:
        return []
    rows = []
    for r in results.kills.itertuples():
        same = r.same_outcome_as_without_kills
        rows.append([str(r.test), str(r.policy), _count(r.kills), _count(r.scheduler_kills), _count(r.worker_kills),
                     _count(r.rank0_kills), "" if missing(r.jobs) else f"{r.verified:.0f} / {r.jobs:.0f}",
                     _count(r.steps_repeated_where_none_may_be), _count(r.steps_repeated_after_rank0_kills),
                     _count(r.processes_left), _count(r.temp_dirs_left),
                     "" if missing(same) else ("yes" if str(same) == "True" else "no")])
    return [
        "## Kills and Ctrl-C",
        "",
        "`experiments/kill_runs.py` (the slow tests of `tests/e2e/test_kills.py`): `pollux-opt run` on four "
        "real jobs and 2 CPUs, with SIGKILLs of the scheduler (resumed at once with the same `--out`) and of "
        "training workers at random moments, a single scheduler SIGKILL, and Ctrl-C to the process group "
        "followed by a rerun. A kill of rank 0 may repeat the steps since its last checkpoint (at most "
        "`checkpoint_interval_s` of training, asserted); every other kill and the stop may repeat none. "
        f"Load average during the runs: {results.kills.load1.iloc[0]:.1f}.",
        "",
        *md_table(["run", "policy", "kills", "of the scheduler", "of a worker", "of which rank 0", "jobs verified",
                   "steps repeated where none may be", "steps repeated after a rank-0 kill", "processes left",
                   "temporary folders left", "same end as without kills"], rows,
                  [False, False] + [True] * 10),
        "",
    ]
