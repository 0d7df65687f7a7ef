"""The Ray pool's slots on the test cluster (see conftest.py), below a job: a
slot reports its process and node, its connection is Ray's calls (the
scheduler opens no listening socket for its workers), a slot whose worker
loop ends or whose actor is killed is a lost worker (EOF, not alive), and
closing the pool ends its slots and relays."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

#: Upper bound on waits for a slot's actor (a cold start imports torch on a loaded machine).
WAIT_S = 120.0


def _listening_ports() -> set:
    """The TCP addresses this process listens on."""
    psutil = pytest.importorskip("psutil", reason="reads this process's sockets with psutil")
    return {c.laddr for c in psutil.Process(os.getpid()).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def _lost(handle) -> bool:
    """The supervisor's view of a lost worker: EOF on its connection, then (joined) not alive."""
    assert handle.conn.poll(WAIT_S)
    with pytest.raises(EOFError):
        while True:
            handle.conn.recv()
    handle.process.join(WAIT_S)
    return not handle.alive() and handle.process.exitcode is not None


def _bad_run(tmp_path):
    """An assignment whose job cannot even be read: the worker reports an error and exits at once."""
    from pollux_opt.runtime.report import RuntimeOptions
    from pollux_opt.runtime.protocol import Assignment

    return ("run", Assignment("bad", '{"no such field": 1}', str(tmp_path), generation=0, rank=0, world=1,
                              num_nodes=1, store_path=None, checkpoint_meta=None, local_bsz=1, accum_steps=1,
                              options=RuntimeOptions()))


def test_slots_talk_over_ray_calls_and_an_ended_or_killed_slot_is_a_lost_worker(two_nodes, tmp_path):
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
        assert wa.alive() and wb.alive() and pool.idle_count == 0
        for w, node in ((wa, a), (wb, b)):
            assert w.conn.poll(WAIT_S)
            kind, info = w.conn.recv()
            assert kind == "hello" and info["pid"] == w.pid
            assert pool.ray_node_of(w.pid) == nodes.get(node).ray_id
        assert _listening_ports() <= before  # no listener of the pool's own

        wa.conn.send(("exit",))  # the worker loop ends: its actor's method returns
        assert _lost(wa) and wa.process.exitcode == 0
        wb.conn.send(_bad_run(tmp_path))
        assert wb.conn.poll(WAIT_S)
        kind, info = wb.conn.recv()  # delivered, though the worker leaves with os._exit right after it
        assert kind == "error" and "unknown JobSpec fields" in info["error"]
        assert _lost(wb)
        assert wa.relay.join() and wb.relay.join()
        pool.discard([wa, wb])  # and their slots start anew

        wa, wb = pool.regroup([], both, job_key="j")
        ray.kill(wb.process.actor, no_restart=True)  # as a crashed replica
        assert _lost(wb) and wb.process.exitcode == -9
        pool.discard([wb])
        pool.release([wa])
        assert pool.regroup([], SimpleNamespace(placement={a: 1}), job_key="j") == [wa]  # kept warm
        pool.release([wa])
    finally:
        pool.close()
    assert not wa.relay.running and not wa.alive()
