"""Real jobs on a 2-node Ray test cluster (a head without CPUs, two nodes of one
CPU each, ``ray.cluster_utils.Cluster`` on this machine) against the local backend.

* ``rescale``: one job rescaled across the nodes, {a:1} -> {a:1, b:1} -> {b:1}
  -> ... ; each rescale's wall time (checkpoint, re-form the group, resume) as
  the runtime measures it, with its parts.  Writes ``ray_rescale.csv``.
* ``compare``: the quick ``mixed`` workload under each policy on the Ray
  cluster and on the local backend with the same 2 x 1 CPUs of this machine;
  average JCT, makespan, scheduler overhead (mean per round, % of the
  interval) and where a job's time goes (:data:`PHASES`) side by side.  Writes ``ray_vs_local.csv``; the run directories
  stay under ``--runs`` for ``experiments/sim_fidelity.py`` (the simulator
  replay with profiles measured in the Ray runs, ``ray_fidelity.csv``).

    python experiments/ray_cluster.py rescale
    python experiments/ray_cluster.py compare --policies pollux fixed --runs runs/ray
    python experiments/sim_fidelity.py runs/ray/ray-* --out runs/ray/fidelity
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from pollux_opt.backends.local import default_cluster, run_workload  # noqa: E402
from pollux_opt.lifecycle import JobState  # noqa: E402
from pollux_opt.workloads import WorkloadJob, load_workload  # noqa: E402

log = logging.getLogger("ray_cluster")

RESULTS = Path(__file__).resolve().parent / "results"
#: The rescale target: median wall seconds of a rescale across nodes.
TARGET_RESCALE_S = 1.0
#: The job rescaled: a regression job with a target it needs a while to reach.
RESCALED = WorkloadJob("regress", "synth-regress", 0.0, 1, 32,
                       spec={"target": 0.05, "eval_every": 50, "config": {"samples": 20_000, "width": 64}})
#: Steps trained between two rescales.
STEPS_BETWEEN = 40
#: Round interval of the compared runs, seconds (the quick demo's).
INTERVAL_S = 10.0


def _cluster():
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster, ray


def rescale(count: int) -> pd.DataFrame:
    """``count`` rescales of :data:`RESCALED` across the two nodes."""
    from pollux_opt.backends.ray.nodes import RayNodes
    from pollux_opt.backends.ray.pool import RayWorkerPool
    from pollux_opt.runtime.job import ElasticJob

    cluster, ray = _cluster()
    nodes = RayNodes(ray)
    a, b = (n.id for n in nodes.cluster().nodes)
    pool = RayWorkerPool(nodes)
    for n in nodes.cluster().nodes:
        pool.add_node(n.id, n.cpus)
    cycle = [{a: 1, b: 1}, {b: 1}, {a: 1, b: 1}, {a: 1}]
    with tempfile.TemporaryDirectory() as tmp:
        job = ElasticJob(RESCALED.job_spec(), Path(tmp) / "job", pool=pool)
        try:
            job.start({a: 1})
            for i in range(count):
                _wait_steps(job, STEPS_BETWEEN)
                job.rescale(cycle[i % len(cycle)])
            _wait_steps(job, 1)
            report = job.report()
        finally:
            job.close()
            pool.close()
            ray.shutdown()
            cluster.shutdown()
    rows = []
    for e in (e for e in report.events if e.kind == "rescaled"):
        d = e.details
        rows.append({"to": "+".join(f"{n}:{k}" for n, k in d["placement"].items()), "replicas": d["num_replicas"],
                     "seconds": d["seconds"], "queue_s": max(d["queue_s"]), "build_s": max(d["build_s"]),
                     "group_s": max(d["group_s"]), "load_s": max(d["load_s"])})
    return pd.DataFrame(rows)


def _wait_steps(job, steps: int) -> None:
    start = job.report().step
    while True:
        r = job.report()
        if r.state.terminal:
            raise RuntimeError(f"the rescaled job ended ({r.state.value}: {r.error}); use a harder target")
        if r.state is JobState.RUNNING and r.step >= start + steps:
            return
        time.sleep(0.1)


#: Phases of a job's time in a run, from its events: name -> (from, to), each
#: the first event of its kind but the last validation.  Starting covers the
#: workers' start, the job's build and the steps to its first evaluation.
PHASES = {"wait_s": ("submit", "start"), "startup_s": ("start", "validation"),
          "train_s": ("validation", "last validation"), "verify_s": ("last validation", "complete")}


def job_phases(run_dir: Path) -> dict[str, float]:
    """Mean seconds per job of each of :data:`PHASES` in the run ``run_dir``
    (they add up to its average JCT)."""
    from pollux_opt.records.events import read_events

    events = read_events(run_dir / "events.jsonl")
    totals = dict.fromkeys(PHASES, 0.0)
    jobs = sorted({e["job_id"] for e in events if e["job_id"]})
    for job in jobs:
        times: dict[str, float] = {}
        for e in (e for e in events if e["job_id"] == job):
            times.setdefault(e["type"], e["t"])
            if e["type"] == "validation":
                times["last validation"] = e["t"]
        for name, (a, b) in PHASES.items():
            totals[name] += times[b] - times[a]
    return {name: total / len(jobs) for name, total in totals.items()}


def compare(policies: list[str], runs: Path) -> pd.DataFrame:
    """The quick mixed workload under ``policies``, on Ray and on the local backend."""
    from pollux_opt.backends.ray import run_ray_workload

    workload = load_workload("mixed", quick=True)
    rows = []
    for policy in policies:  # each policy on both backends in turn: a drifting machine load hits both alike
        for backend in ("ray", "local"):
            out = runs / f"{backend}-{policy}"
            t0 = time.time()
            if backend == "ray":
                cluster, ray = _cluster()
                try:
                    s = run_ray_workload(out, workload, policy, interval=INTERVAL_S, progress=False)
                finally:
                    ray.shutdown()
                    cluster.shutdown()
            else:
                s = run_workload(out, workload, policy, cluster=default_cluster(2, 2), interval=INTERVAL_S,
                                 progress=False)
            rows.append({"backend": backend, "policy": policy, "avg_jct_s": s["avg_jct_s"],
                         "makespan_s": s["makespan_s"], "completed": sum(j["completed"] for j in s["jobs"]),
                         "jobs": len(s["jobs"]), "mean_overhead_s": s["mean_overhead_s"],
                         "overhead_pct_of_interval": s["overhead_pct_of_interval"],
                         "mean_load1": s["mean_load1"], "wall_s": time.time() - t0, **job_phases(out)})
            log.warning("%s %s: avg JCT %.1f s", backend, policy, s["avg_jct_s"])
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("rescale")
    p.add_argument("--count", type=int, default=12)
    p = sub.add_parser("compare")
    p.add_argument("--policies", nargs="+", default=["pollux", "fixed", "tiresias"])
    p.add_argument("--runs", type=Path, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    RESULTS.mkdir(exist_ok=True)
    if args.what == "rescale":
        table = rescale(args.count)
        table.to_csv(RESULTS / "ray_rescale.csv", index=False)
        med = statistics.median(table.seconds)
        print(table.to_string(index=False))
        print(f"median rescale {med:.2f} s ({'within' if med <= TARGET_RESCALE_S else 'outside'} the "
              f"{TARGET_RESCALE_S:g} s target)")
    else:
        table = compare(args.policies, args.runs)
        table.to_csv(RESULTS / "ray_vs_local.csv", index=False)
        print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
