"""Real jobs on a throttled node: a replica's measured step time under a 50 %
CPU quota, and a short run on ``local-hetero`` whose slow node's replica runs
in that node's cgroup, measured per type, with the groups removed at the end."""

from __future__ import annotations

import os
import threading
import time

import pytest

pytest.importorskip("torch", reason="real jobs need the CPU build of torch (pip install 'pollux-opt[jobs]')")
pytest.importorskip("sklearn", reason="the digits job needs scikit-learn (pip install 'pollux-opt[jobs]')")

from pollux_opt.backends.local import run_workload  # noqa: E402
from pollux_opt.backends.local.nodes import RunNodes, typed_cluster  # noqa: E402
from pollux_opt.backends.local.throttle import PARENT, ThrottleUnavailable, detect  # noqa: E402
from pollux_opt.model.cluster_types import PRESETS  # noqa: E402
from pollux_opt.records.events import read_events  # noqa: E402
from pollux_opt.workloads import Workload, WorkloadJob  # noqa: E402


try:
    REAL, WHY = detect(), ""
except ThrottleUnavailable as exc:
    REAL, WHY = None, str(exc)
pytestmark = [
    pytest.mark.skipif(REAL is None, reason=f"cgroup CPU quotas unavailable here: {WHY}"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="local-hetero needs two CPUs this process may use"),
]

#: Two short jobs: the first goes to one node, the second to the other.
PAIR = Workload("pair", (
    WorkloadJob("digits", "digits-cnn", 0.0, 1, 32, spec={"target": 0.85, "eval_every": 10}),
    WorkloadJob("regress", "synth-regress", 0.0, 1, 32,
                spec={"target": 0.3, "eval_every": 20, "config": {"samples": 20_000, "width": 64}}),
))


def _cpu_rate(seconds: float = 1.0) -> float:
    """CPU-seconds per wall-second a busy loop gets here now (1: an idle core)."""
    t, c = time.perf_counter(), time.process_time()
    while time.perf_counter() - t < seconds:
        sum(i * i for i in range(1000))
    return (time.process_time() - c) / (time.perf_counter() - t)


@pytest.mark.slow
def test_half_quota_roughly_doubles_a_real_replicas_measured_step(tmp_path):
    import numpy as np

    from pollux_opt.runtime.job import ElasticJob
    from pollux_opt.runtime.pool import WorkerPool
    from pollux_opt.runtime.entry import get_job
    from pollux_opt.runtime.report import RuntimeOptions

    cluster, quotas, _ = typed_cluster(PRESETS["local-hetero"])
    cpu = sorted(os.sched_getaffinity(0))[0]
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        rate = _cpu_rate()
    finally:
        os.sched_setaffinity(0, affinity)
    if rate < 0.8:
        pytest.skip(f"CPUs contended: a busy loop got {rate:.2f} CPU-s per s, so a 0.5 quota cannot bind")
    spec = get_job("digits-cnn")
    nodes, pool = RunNodes(cluster, quotas), WorkerPool(spares=0)
    step = {}
    try:
        for node, node_type in (("fast-0", "fast"), ("slow-0", "slow")):
            # The largest batch: steps well above the 20 ms CFS period.  A step shorter
            # than the period may run inside one period's quota, and the fastest such
            # step misses the limit (docs/node-types.md, section 6).
            options = RuntimeOptions(step_limit=150, fixed_batch_size=spec.max_batch_size)
            with ElasticJob(spec, tmp_path / node, options=options, pool=pool) as job:
                job.start({node: 1}, cpus=[cpu], **nodes.command_kwargs({node: 1}))
                report = job.wait(timeout=600)
                step[node_type] = float(np.min(report.type_measurements[node_type].step_time))
    finally:
        pool.close()
        nodes.close()
    assert 1.6 <= step["slow"] / step["fast"] <= 2.4, step


@pytest.mark.slow
def test_a_run_on_local_hetero_throttles_the_slow_nodes_replica_and_cleans_up(tmp_path):
    seen: set[int] = set()
    done = threading.Event()
    base = REAL.cpu_root / PARENT

    def watch():
        while not done.is_set():
            for group in base.glob(f"{os.getpid()}-slow-0"):
                try:
                    seen.update(int(p) for p in (group / "cgroup.procs").read_text().split())
                except OSError:
                    pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        summary = run_workload(tmp_path, PAIR, "fixed", cluster=PRESETS["local-hetero"], interval=5.0,
                               progress=False, backend_kwargs={"report_every_s": 1.0})
    finally:
        done.set()
        watcher.join()
    assert all(j["completed"] for j in summary["jobs"])
    events = read_events(tmp_path / "events.jsonl")
    on_slow = {e["job_id"] for e in events if e["type"] == "start" and "slow-0" in e["placement"]}
    assert len(on_slow) == 1
    assert seen, "no process ever ran in the slow node's cgroup"
    assert os.getpid() not in seen  # the replicas moved themselves; the scheduler stays unthrottled
    complete = {e["job_id"]: e for e in events if e["type"] == "complete"}
    assert set(complete[on_slow.pop()]["type_models"]) == {"slow"}  # measured on the type it ran on
    assert not list(base.glob(f"{os.getpid()}-*"))  # the run removed its groups
