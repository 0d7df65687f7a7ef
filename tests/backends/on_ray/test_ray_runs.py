"""Whole runs on the Ray test cluster (see conftest.py), through the same loop,
policies, event log and metrics as the local backend: a node removed mid-run,
a node added mid-run, and the quick mixed workload under pollux (slow: minutes each)."""

from __future__ import annotations

import math
import threading
import time

import pytest

from pollux_opt.backends.ray.nodes import NODE_ID_CHARS
from pollux_opt.records.events import read_events
from pollux_opt.workloads import Workload, WorkloadJob, load_workload

pytestmark = pytest.mark.slow

#: A regression job that trains for seconds on one core (about 3 s to a
#: target of 0.13; tens of seconds to 0.115, nearer its noise floor of 0.09).
def _regress(jid: str, arrival: float = 0.0, seed: int = 0, target: float = 0.13) -> WorkloadJob:
    return WorkloadJob(jid, "synth-regress", arrival, 1, 32,
                       spec={"target": target, "eval_every": 50, "seed": seed,
                             "config": {"samples": 20_000, "width": 64}})


#: Seconds to wait for an event a test acts on.
EVENT_WAIT_S = 300.0
#: Seconds between a job's periodic checkpoints in the node-removal test (a
#: checkpoint well before the job reaches its target).
CHECKPOINT_EVERY_S = 2.0


def _run(tmp_path, workload, policy, interval=5.0, runtime_options=None):
    from pollux_opt.backends.ray import run_ray_workload

    return run_ray_workload(tmp_path / "run", workload, policy, interval=interval, progress=False,
                            runtime_options=runtime_options, backend_kwargs={"report_every_s": 1.0})


def _run_while(tmp_path, workload, policy, predicate, action, **kw) -> dict:
    """Run ``workload`` in a thread; in this one (Ray's test cluster changes its
    nodes from the main thread only), call ``action(events)`` once ``predicate(events)``
    holds for the run's event log.  Returns the run's summary."""
    path = tmp_path / "run" / "events.jsonl"
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(summary=_run(tmp_path, workload, policy, **kw)),
                              daemon=True)
    runner.start()
    deadline = time.monotonic() + EVENT_WAIT_S
    while runner.is_alive() and time.monotonic() < deadline:
        events = read_events(path) if path.exists() else []
        if predicate(events):
            action(events)
            break
        time.sleep(0.5)
    runner.join()
    return result["summary"]


def _ray_node(cluster, ray_nodes, node_id: str):
    ray_id = ray_nodes.get(node_id).ray_id
    return next(n for n in cluster.worker_nodes if n.node_id == ray_id)


def test_a_node_removed_mid_run_restarts_its_job_elsewhere_and_it_completes(two_nodes, tmp_path):
    from pollux_opt.backends.ray.nodes import RayNodes

    cluster, ray = two_nodes
    nodes = RayNodes(ray)
    removed = []

    def has_checkpoint(events):  # mid-training: a periodic checkpoint, not the final one
        return any(e["type"] == "checkpoint" and not e.get("final") for e in events)

    def remove(events):
        (node,) = [e for e in events if e["type"] == "start"][0]["placement"]
        removed.append(node)
        cluster.remove_node(_ray_node(cluster, nodes, node), allow_graceful=False)

    # A target it needs a while to reach, so that the node leaves while it trains.
    summary = _run_while(tmp_path, Workload("one", (_regress("regress", target=0.115),)), "pollux",
                         has_checkpoint, remove,
                         runtime_options={"checkpoint_interval_s": CHECKPOINT_EVERY_S})
    assert removed
    (job,) = summary["jobs"]
    assert job["completed"] and job["verified"] and not job["failed"]
    log = read_events(tmp_path / "run" / "events.jsonl")
    (left,) = [e for e in log if e["type"] == "nodes" and e["left"]]
    assert left["left"] == removed
    faults = [e for e in log if e["type"] == "restart_after_fault" and e["placement"] == {}]
    assert faults and removed[0] in faults[-1]["reason"]
    after = [e for e in log if e["type"] in ("start", "rescale_begin") and e["t"] > faults[-1]["t"]]
    assert after and all(removed[0] not in e["placement"] for e in after)
    assert any(e["type"] == "checkpoint" and e["t"] > faults[-1]["t"] for e in log)  # trained on after it


def test_a_node_added_mid_run_gets_used(two_nodes, tmp_path):
    cluster, _ = two_nodes
    added = []

    def two_started(events):
        return sum(e["type"] == "start" for e in events) >= 2

    def add(events):
        added.append(cluster.add_node(num_cpus=1))

    jobs = tuple(_regress(f"r{i}", seed=i) for i in range(3))
    summary = _run_while(tmp_path, Workload("three", jobs), "fixed", two_started, add)
    assert added and all(j["completed"] and j["verified"] for j in summary["jobs"])
    log = read_events(tmp_path / "run" / "events.jsonl")
    (joined,) = [e for e in log if e["type"] == "nodes" and e["joined"] and not e["left"]][1:]
    (new_node,) = joined["joined"]
    assert new_node == f"ray-{added[0].node_id[-NODE_ID_CHARS:]}"
    # Placed on before a job ended (which job goes there depends on how the random node ids sort).
    used = [e for e in log if e["type"] in ("start", "rescale_begin") and new_node in e["placement"]]
    assert used and used[0]["t"] < min(e["t"] for e in log if e["type"] == "complete")


def test_mixed_quick_under_pollux_on_two_nodes_completes_every_job_verified(two_nodes, tmp_path):
    summary = _run(tmp_path, load_workload("mixed", quick=True), "pollux", interval=10.0)
    assert summary["jobs"] and all(j["completed"] and j["verified"] for j in summary["jobs"])
    for j in summary["jobs"]:
        assert all(v is not None for v in j.values()), j
    for key in ("avg_jct_s", "makespan_s", "utilization", "overhead_pct_of_interval", "avg_goodput"):
        assert summary[key] is not None and math.isfinite(summary[key]), key
    log = read_events(tmp_path / "run" / "events.jsonl")
    for e in log:  # at most one distributed job per node (the interference rule)
        if e["type"] == "allocation":
            spread = [p for p in e["placement"].values() if len(p) > 1]
            for node in {n for p in spread for n in p}:
                assert sum(node in p for p in spread) <= 1, e
