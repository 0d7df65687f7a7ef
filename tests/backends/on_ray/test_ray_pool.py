"""The Ray pool's slots on the test cluster (see conftest.py), below a job: a
slot reports its process and node, its messages are Ray method calls (the
scheduler opens no listening socket for its workers), a slot whose assignment
raises delivers its error report and is then ended, a killed slot is a lost
worker, a released slot is kept warm, and closing the pool ends its slots."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from pollux_opt.runtime.protocol import ERROR, RUN, Assignment
from pollux_opt.runtime.report import RuntimeOptions

#: Upper bound on waits for a slot's actor (a cold start imports torch on a loaded machine).
WAIT_S = 120.0


def _listening_ports() -> set:
    """The TCP addresses this process listens on."""
    psutil = pytest.importorskip("psutil", reason="reads this process's sockets with psutil")
    return {c.laddr for c in psutil.Process(os.getpid()).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def _reports(pool, worker) -> list:
    """What ``worker`` reports until it is not alive (at most :data:`WAIT_S`)."""
    got, deadline = [], time.monotonic() + WAIT_S
    while worker.alive() and time.monotonic() < deadline:
        got += [m for _, m in pool.receive([worker], 1.0)]
    return got


def _bad_run(tmp_path) -> Assignment:
    """An assignment whose job cannot even be read: the worker reports an error."""
    return Assignment("bad", '{"no such field": 1}', str(tmp_path), generation=1, rank=0, world=1, num_nodes=1,
                      store_path=None, checkpoint_meta=None, local_bsz=1, accum_steps=1, options=RuntimeOptions())


def test_slots_are_called_by_method_and_an_erring_or_killed_slot_is_a_lost_worker(two_nodes, tmp_path):
    from pollux_opt.backends.ray.nodes import RayNodes
    from pollux_opt.backends.ray.pool import RayWorkerPool

    _, ray = two_nodes
    before = _listening_ports()
    nodes = RayNodes(ray)
    a, b = (n.id for n in nodes.cluster().nodes)
    both = SimpleNamespace(placement={a: 1, b: 1})
    pool = RayWorkerPool(nodes)
    try:
        pool.add_node(a, 1)
        pool.add_node(b, 1)
        wa, wb = pool.regroup([], both, job_key="j")
        assert pool.idle_count == 0
        for w, node in ((wa, a), (wb, b)):
            assert w.pid > 0 and w.alive() and ray.get(w.actor.identity.remote()) == (w.pid, nodes.get(node).ray_id)
        assert _listening_ports() <= before  # no listener of the pool's own

        assert wb.send(RUN, _bad_run(tmp_path))
        (report,) = _reports(pool, wb)  # delivered, and the slot is then ended
        assert report[0] == ERROR and "unknown JobSpec fields" in report[1]["error"]
        assert wb.exitcode == 1 and not wb.send(RUN, _bad_run(tmp_path))
        pool.discard([wb])  # and its slot starts anew

        (wb,) = pool.regroup([], SimpleNamespace(placement={b: 1}), job_key="j")
        ray.kill(wb.actor, no_restart=True)  # as a crashed replica
        wb.join(WAIT_S)
        assert not wb.alive() and wb.exitcode == -9
        pool.discard([wb])
        pool.release([wa])
        assert pool.regroup([], SimpleNamespace(placement={a: 1}), job_key="j") == [wa]  # kept warm
        pool.release([wa])
    finally:
        pool.close()
    wa.join(WAIT_S)
    assert not wa.alive()


def test_a_node_with_gpus_offers_a_slot_per_gpu_each_holding_one(two_nodes):
    """Ray's test cluster declares GPUs that do not exist: placement and bookkeeping need no CUDA."""
    from pollux_opt.backends.ray.nodes import RayNodes
    from pollux_opt.backends.ray.pool import RayWorkerPool

    cluster, ray = two_nodes
    cluster.add_node(num_cpus=3, num_gpus=2)
    cluster.wait_for_nodes()
    nodes = RayNodes(ray)
    (gpu_node,) = [n for n in nodes.cluster().nodes if n.type == "gpu"]
    cpu_node = next(n for n in nodes.cluster().nodes if n.type == "cpu")
    assert gpu_node.cpus == 2 and nodes.get(gpu_node.id).gpus == 2  # two slots: one per GPU
    pool, workers = RayWorkerPool(nodes), []
    try:
        pool.add_node(gpu_node.id, gpu_node.cpus)
        pool.add_node(cpu_node.id, 1)
        workers = pool.regroup([], SimpleNamespace(placement={gpu_node.id: 2, cpu_node.id: 1}), job_key="g")
        seen = [ray.get(w.actor.visible_gpus.remote(), timeout=WAIT_S) for w in workers]
        assert sorted(seen[:2]) == ["0", "1"] and seen[2] in (None, "")  # one GPU each; none on a CPU node
        assert all(ray.get(w.actor.identity.remote())[1] == nodes.get(n).ray_id
                   for w, n in zip(workers, [gpu_node.id, gpu_node.id, cpu_node.id]))
    finally:
        for w in workers:
            w.end()  # held by the job: a job's workers are ended by the job
        pool.close()
