"""Worker "processes" that are Ray actors on the nodes an allocation names: :class:`RayWorkerPool`.

It implements the :class:`~pollux_opt.runtime.pool.WorkerPool` interface the
runtime's job supervisor uses, so that a Ray job is the runtime's own
:class:`~pollux_opt.runtime.job.ElasticJob` (supervision, checkpoints,
measurements, faults, fresh-process verification) with Ray doing placement,
process start and failure detection.

**Slots.**  Each CPU of each node the run uses is one long-lived
:class:`~pollux_opt.backends.ray.actors.ReplicaActor` holding one Ray CPU,
pinned to its node (``NodeAffinitySchedulingStrategy``, hard), started as the
node is seen (:meth:`RayWorkerPool.add_node`) and kept warm (process, torch,
and the parts of the job it last served) for the whole run, as the local
pool keeps its workers: a job's replica on a node is an idle slot of that
node serving its assignment.  :meth:`RayWorkerPool.regroup` keeps a job's
live replicas on the nodes its new placement still uses, then takes idle
slots (warm for the job first), waiting for one to be released where the node
has none idle yet; released replicas go back idle; a discarded (faulty) one is
ended and its slot started anew.  The run's CPUs are thus held by its
actors for as long as it runs: the scheduler, not Ray, shares them out.

**Rendezvous**: rank 0's actor hosts a TCPStore on its node's IP and returns
its address and port (no shared file system needed); gloo binds to the
interface of the node's IP.  **Completion check**: a fresh zero-CPU actor
that never trained, on the scheduler's node (:meth:`RayWorkerPool.start_process`),
ended once joined.
Actors are owned by the scheduler (the Ray driver): they end with it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Client, Listener

from pollux_opt.backends.ray._ray import require_ray
from pollux_opt.backends.ray.actors import ActorProcess, ReplicaActor
from pollux_opt.backends.ray.nodes import RayNodes
from pollux_opt.runtime.pool import WorkerHandle, WorkerPool
from pollux_opt.runtime.worker import TCP_STORE_PREFIX

__all__ = ["CONNECT_TIMEOUT_S", "RayWorkerHandle", "RayWorkerPool"]

log = logging.getLogger(__name__)

#: Most seconds a replica waits for a slot of its node: to be started (a cold
#: actor imports torch: 2-30 s on a loaded 2-core machine) or released by the
#: job that held it.
CONNECT_TIMEOUT_S = 180.0
#: Seconds between checks while waiting for a slot.
_WAIT_POLL_S = 0.05
#: The process id reported for a worker that never started.
_NO_PID = -1
#: Concurrent method slots of a replica actor: its worker loop, and hosting a rendezvous store.
_ACTOR_SLOTS = 2


@dataclass(eq=False)
class RayWorkerHandle(WorkerHandle):
    """A slot actor (``process``: its :class:`ActorProcess`) and the supervisor's
    connection to it; ``node``: its scheduler node id."""

    node: str = ""


def _dead_handle(node: str) -> RayWorkerHandle:
    """A worker that never started (its node is gone, or no slot came in time):
    the supervisor sees a lost worker and restarts the job."""
    ours, theirs = Pipe()
    theirs.close()
    proc = ActorProcess(require_ray(), None, None, pid=_NO_PID)
    proc.kill()
    return RayWorkerHandle(proc, ours, node=node)


class RayWorkerPool(WorkerPool):
    """The slot actors of one Ray run (see the module docstring).

    Args:
        nodes: the run's view of the Ray cluster (scheduler node id -> Ray node).
        connect_timeout_s: see :data:`CONNECT_TIMEOUT_S`.
    """

    def __init__(self, nodes: RayNodes, *, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        # The local pool's process machinery (start method, fork server) does not apply.
        self._ray = ray = require_ray()
        self._nodes = nodes
        self._timeout = float(connect_timeout_s)
        self._actor_class = ray.remote(ReplicaActor)
        self._authkey = secrets.token_bytes(32)
        self._listener = Listener((ray.util.get_node_ip_address(), 0), authkey=self._authkey)
        self.address = self._listener.address
        self._cond = threading.Condition()
        self._starting: dict[str, tuple] = {}  # token -> (node, ActorProcess) of actors not yet connected
        self._idle: dict[str, list[RayWorkerHandle]] = {}  # node -> idle slots
        self._ray_nodes: dict[int, str] = {}  # pid of a live slot -> the Ray node id it reported
        self._cancelled: set[str] = set()
        self._closed = False
        self._spawned = 0
        self.spares = self.max_idle = 0
        self._fresh = self._fresh_actor()
        self._accepter = threading.Thread(target=self._accept, name="pollux-ray-accept", daemon=True)
        self._accepter.start()

    # ------------------------------------------------------------ the slots
    def add_node(self, node: str, count: int) -> None:
        """Start ``count`` slot actors on ``node`` (they join the idle ones as they connect)."""
        for _ in range(count):
            self._start_slot(node)

    def _start_slot(self, node: str) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        info = self._nodes.get(node)
        if info is None or self._closed:
            return
        actor = self._actor_class.options(
            num_cpus=1, max_concurrency=_ACTOR_SLOTS,
            scheduling_strategy=NodeAffinitySchedulingStrategy(info.ray_id, soft=False),
        ).remote()
        token = uuid.uuid4().hex
        with self._cond:
            self._starting[token] = (node, ActorProcess(self._ray, actor, actor.serve.remote(
                self.address, self._authkey, token)))
            self._spawned += 1

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
                token, pid, ray_node = conn.recv()
            except Exception as exc:  # noqa: BLE001 - a stranger, a slot that died connecting, or the close
                if not self._closed:
                    log.warning("refused a connection to the worker listener: %s", exc)
                continue
            with self._cond:
                node, proc = self._starting.pop(token, (None, None))
                if proc is None:
                    conn.close()
                    continue
                proc.pid = pid
                self._ray_nodes[pid] = ray_node
                self._idle.setdefault(node, []).append(RayWorkerHandle(proc, conn, node=node))
                self._cond.notify_all()

    def _take(self, node: str, job_key: str | None) -> RayWorkerHandle:
        """An idle slot of ``node`` (one warm for ``job_key`` first), waiting for one
        to connect or be released; a dead worker where none comes (see :meth:`_node_gone`)."""
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while True:
                idle = self._idle.get(node, [])
                idle[:] = [w for w in idle if w.alive()]
                if idle:
                    idle.sort(key=lambda w: w.job_key != job_key)
                    return idle.pop(0)
                if time.monotonic() > deadline or self._closed or job_key in self._cancelled:
                    break
                if self._nodes.get(node) is None or not self._starting_on(node) and not self._nodes.alive(node):
                    break
                self._cond.wait(_WAIT_POLL_S)
        if not self._nodes.alive(node):
            return self._node_gone(job_key, node)
        log.warning("no slot of node %s came for job %s within %.0f s", node, job_key, self._timeout)
        return _dead_handle(node)

    def _starting_on(self, node: str) -> bool:
        return any(n == node and p.is_alive() for n, p in self._starting.values())

    def _node_gone(self, job_key: str | None, node: str) -> RayWorkerHandle:
        """A replica for ``node``, which left the cluster: wait (up to the
        connect timeout) until the backend cancels the job's launch
        (:meth:`cancel`), so that the job's supervisor does not spend its fault
        restarts on a node that is gone, then a dead worker."""
        log.warning("node %s is not in the Ray cluster: job %s waits to be placed elsewhere", node, job_key)
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while job_key not in self._cancelled and time.monotonic() < deadline and not self._closed:
                self._cond.wait(_WAIT_POLL_S)
        return _dead_handle(node)

    def cancel(self, job_key: str) -> None:
        """Cut short the launches of ``job_key`` that wait for a slot (a node that is gone)."""
        with self._cond:
            self._cancelled.add(job_key)
            self._cond.notify_all()

    def uncancel(self, job_key: str) -> None:
        """Let ``job_key`` launch again (after :meth:`cancel`, once its supervisor ended)."""
        with self._cond:
            self._cancelled.discard(job_key)

    # ---------------------------------------------------------- the pool API
    def regroup(self, workers: list[WorkerHandle], alloc, job_key: str | None = None) -> list[WorkerHandle]:
        """The workers, in rank order (node by node, as ``alloc.placement`` lists
        them), of a job's next generation: its live workers on each node first,
        then idle slots there; the others are released."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        wanted = [node for node, k in alloc.placement.items() for _ in range(k)]
        spare = [w for w in workers if w.alive()]
        chosen: list[WorkerHandle | None] = []
        for node in wanted:
            match = next((w for w in spare if getattr(w, "node", None) == node), None)
            if match is not None:
                spare.remove(match)
            chosen.append(match)
        self.release([w for w in workers if w not in chosen])
        out = [w if w is not None else self._take(node, job_key) for node, w in zip(wanted, chosen)]
        for w in out:
            w.job_key = job_key
        return out

    def rendezvous(self, workers: list[WorkerHandle], workdir, generation: int) -> str:
        """``tcp://ip:port`` of a TCPStore rank 0's actor hosts for ``generation``
        (an unreachable address where rank 0 is gone: its peers then fail to form
        the group, and the lost rank 0 restarts the job)."""
        try:
            ip, port = self._ray.get(workers[0].process.actor.host_store.remote(generation), timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - a dead or unreachable rank 0 is a fault, handled as one
            log.warning("rank 0 could not host the rendezvous of generation %d: %s", generation, exc)
            ip, port = "127.0.0.1", 1
        return f"{TCP_STORE_PREFIX}{ip}:{port}"

    def acquire(self, count: int, job_key: str | None = None) -> list[WorkerHandle]:
        raise NotImplementedError("a Ray replica needs its node: use regroup")

    def release(self, workers: list[WorkerHandle]) -> None:
        """Return live ``workers`` to their nodes' idle slots; dead ones are replaced."""
        dead = []
        with self._cond:
            for w in workers:
                if w.alive() and not self._closed:
                    self._idle.setdefault(w.node, []).append(w)
                else:
                    dead.append(w)
            self._cond.notify_all()
        self.discard(dead)

    def discard(self, workers: list[WorkerHandle], graceful: bool = False) -> None:
        """End ``workers`` (faulty, or their job failed) and start their slots anew."""
        for w in workers:
            w.process.kill()
            w.conn.close()
            self._ray_nodes.pop(w.process.pid, None)
            if w.process.actor is not None and self._nodes.alive(w.node):
                self._start_slot(w.node)

    def ray_node_of(self, pid: int) -> str | None:
        """The Ray node id the live slot with process id ``pid`` runs on, as it reported (None: none)."""
        return self._ray_nodes.get(pid)

    def warm(self, count: int | None = None) -> None:
        """Slots are started per node (:meth:`add_node`)."""

    def prepare(self, job_key: str, spec_json: str, workdir: str, count: int = 1) -> int:
        return 0

    def start_process(self, target, args: tuple, name: str) -> ActorProcess:
        """Run ``target(*args)`` in a fresh actor that never trained, on the
        scheduler's node (zero CPUs: like the local check, it holds none of the
        job's cores; and that node leaves only with the scheduler); it is ended
        once joined.  The actor was started ahead (torch imported), and the next
        one is started now."""
        with self._cond:
            actor, self._fresh = self._fresh, self._fresh_actor()
        return ActorProcess(self._ray, actor, actor.run_target.remote(target, args))

    def _fresh_actor(self):
        """A new zero-CPU actor on the scheduler's node (for :meth:`start_process`)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = self._ray.get_runtime_context().get_node_id()
        self._spawned += 1
        return self._actor_class.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote()

    @property
    def idle_count(self) -> int:
        with self._cond:
            return sum(len(v) for v in self._idle.values())

    @property
    def spawned(self) -> int:
        return self._spawned

    def close(self) -> None:
        """End the idle and starting slots and stop accepting (slots held by jobs are ended by the jobs)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle = [w for ws in self._idle.values() for w in ws]
            starting = [p for _, p in self._starting.values()]
            self._idle, self._starting = {}, {}
            self._cond.notify_all()
        for w in idle:
            w.process.kill()
            w.conn.close()
        for p in starting:
            p.kill()
        ActorProcess(self._ray, self._fresh, None).kill()
        try:
            Client(self.address, authkey=self._authkey).close()  # wakes the accept thread
        except OSError:
            pass
        self._listener.close()
        self._accepter.join(timeout=5.0)
