"""Real jobs whose replicas are Ray actors on the two nodes of the test cluster
(see conftest.py): gradients all-reduced across nodes, rescales across nodes
that resume exactly from the checkpoint, a killed replica actor, a raising job,
and the fresh-actor completion check."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import numpy as np
import pytest

from pollux_opt.lifecycle import JobState
from pollux_opt.workloads import WorkloadJob

#: A tiny regression job: an easy target, a few seconds of training on one core.
TINY = WorkloadJob("regress", "synth-regress", 0.0, 1, 32,
                   spec={"target": 0.3, "eval_every": 20, "config": {"samples": 20_000, "width": 64}})
#: The same job with a target it needs a while to reach (rescaled while it trains).
LONGER = WorkloadJob("regress", "synth-regress", 0.0, 1, 32,
                     spec={"target": 0.13, "eval_every": 50, "config": {"samples": 20_000, "width": 64}})
#: Seconds a test job gets to finish on the loaded 2-core test machine.
JOB_TIMEOUT_S = 300.0


@pytest.fixture
def pool_and_nodes(two_nodes):
    from pollux_opt.backends.ray.nodes import RayNodes
    from pollux_opt.backends.ray.pool import RayWorkerPool

    _, ray = two_nodes
    nodes = RayNodes(ray)
    pool = RayWorkerPool(nodes)
    for node in nodes.cluster().nodes:
        pool.add_node(node.id, node.cpus)
    yield pool, [n.id for n in nodes.cluster().nodes], nodes
    pool.close()


def _ray_nodes_of(pool, ray) -> dict[int, str]:
    """Process id -> Ray node id of the replicas ``pool`` hands out from now on (a spy on its regroup)."""
    regroup, seen = pool.regroup, {}

    def spy(*args, **kwargs):
        out = regroup(*args, **kwargs)
        seen.update(ray.get(w.actor.identity.remote()) for w in out if w.actor is not None)
        return out

    pool.regroup = spy
    return seen


@contextlib.contextmanager
def _job(wl: WorkloadJob, tmp_path, pool):
    """The job ``wl`` as an ElasticJob on the pool's actors, closed afterwards."""
    from pollux_opt.runtime.job import ElasticJob

    job = ElasticJob(wl.job_spec(), tmp_path / wl.id, pool=pool)
    try:
        yield job
    finally:
        job.close()


def _events(report, kind: str) -> list:
    return [e for e in report.events if e.kind == kind]


def _wait_step(job, step: int, timeout: float = JOB_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = job.report()
        if r.state is JobState.RUNNING and r.step >= step or r.state.terminal:
            return r
        time.sleep(0.2)
    raise TimeoutError(f"job did not reach step {step}")


def test_a_job_on_two_nodes_all_reduces_across_them_and_completes_verified(pool_and_nodes, tmp_path):
    pool, (a, b), nodes = pool_and_nodes
    with _job(TINY, tmp_path, pool) as job:
        ray_nodes = _ray_nodes_of(pool, nodes.ray)
        job.start({a: 1, b: 1})
        r = _wait_step(job, 5)
        assert r.state is JobState.RUNNING, r.error
        assert [ray_nodes[p] for p in r.worker_pids] == [nodes.get(a).ray_id, nodes.get(b).ray_id]
        r = job.wait(timeout=JOB_TIMEOUT_S)
    assert r.state is JobState.SUCCEEDED, r.error
    m = r.measurements
    two = (m.num_nodes == 2) & (m.num_replicas == 2)
    assert two.any() and np.all(m.sync_time[two] > 0)  # inter-node synchronisation, measured
    (verified,) = _events(r, "verified")
    assert verified.details["reached"] and r.final_metric <= TINY.spec["target"]
    check = json.loads((tmp_path / TINY.id / "verification.json").read_text())
    assert check["pid"] not in {p for e in _events(r, "started") for p in e.details["pids"]}  # a fresh actor


@pytest.mark.slow
def test_a_job_rescaled_one_two_one_across_nodes_resumes_exactly_from_each_checkpoint(pool_and_nodes, tmp_path):
    pool, (a, b), _ = pool_and_nodes
    with _job(LONGER, tmp_path, pool) as job:
        job.start({a: 1})
        step = _wait_step(job, 30).step
        job.rescale({a: 1, b: 1})
        step = _wait_step(job, step + 30).step
        job.rescale({b: 1})
        r = job.wait(timeout=JOB_TIMEOUT_S)
    assert r.state is JobState.SUCCEEDED, r.error
    rescales = _events(r, "rescaled")
    assert [e.details["placement"] for e in rescales] == [{a: 1, b: 1}, {b: 1}]
    for e in rescales:  # the step, progress counters and parameters carried across the checkpoint, exactly
        d = e.details
        assert d["step"] == d["paused_step"] and d["checksum"] == d["paused_checksum"] == d["checkpoint_checksum"]
    assert r.num_restarts == 0 and len(r.rescale_times) == 2 and r.restart_delay is not None


@pytest.mark.slow
def test_a_killed_replica_actor_restarts_the_job_from_its_checkpoint(pool_and_nodes, tmp_path):
    pool, (a, b), _ = pool_and_nodes
    with _job(LONGER, tmp_path, pool) as job:
        job.start({a: 1, b: 1})
        r = _wait_step(job, 40)
        os.kill(r.worker_pids[1], signal.SIGKILL)  # every node of the test cluster runs on this machine
        r = job.wait(timeout=JOB_TIMEOUT_S)
    assert r.state is JobState.SUCCEEDED, r.error
    (lost,) = _events(r, "worker_lost")
    (restarted,) = _events(r, "restarted")
    assert lost.details["rank"] == 1 and restarted.details["from_checkpoint"] == lost.details["step"]
    assert restarted.details["placement"] == {a: 1, b: 1}


@pytest.mark.slow
def test_a_job_whose_code_raises_fails_without_hanging_its_peer(pool_and_nodes, tmp_path):
    pool, (a, b), _ = pool_and_nodes
    bad = WorkloadJob("bad", "synth-regress", 0.0, 1, 32, spec={"config": {"samples": 20_000, "width": -1}})
    with _job(bad, tmp_path, pool) as job:
        job.start({a: 1, b: 1})
        r = job.wait(timeout=JOB_TIMEOUT_S)
    # Failed by the rank's own error report (not as a lost worker: its report came before it exited).
    assert r.state is JobState.FAILED and r.error.startswith("rank ") and r.num_restarts == 0, r.error
