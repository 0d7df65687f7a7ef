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

**Connections.**  The supervisor's connection to a slot is one end of a
local pipe; a :class:`~pollux_opt.backends.ray.channel.Relay` carries its
messages to and from the actor by Ray method calls (no socket or listener
of the pool's own), and shuts the pipe down when the actor dies, so that the
supervisor sees a lost worker as for a local process.  A slot joins the idle
ones once its ``identity`` call (process id, Ray node) returns: a watcher
thread waits for those calls.

**Rendezvous**: rank 0's actor hosts a TCPStore on its node's IP and returns
its address and port (no shared file system needed); gloo binds to the
interface of the node's IP.  **Completion check**: a fresh zero-CPU actor
that never trained, on the scheduler's node (:meth:`RayWorkerPool.start_process`),
ended once joined.
Actors are owned by the scheduler (the Ray driver): they end with it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from multiprocessing import Pipe

from pollux_opt.backends.ray._ray import require_ray
from pollux_opt.backends.ray.actors import ACTOR_SLOTS, ActorProcess, ReplicaActor
from pollux_opt.backends.ray.channel import Relay
from pollux_opt.backends.ray.nodes import RayNodes
from pollux_opt.runtime.pool import WorkerHandle, WorkerPool
from pollux_opt.runtime.protocol import TCP_STORE_PREFIX

__all__ = ["CONNECT_TIMEOUT_S", "RayWorkerHandle", "RayWorkerPool"]

log = logging.getLogger(__name__)

#: Most seconds a replica waits for a slot of its node: to be started (a cold
#: actor imports torch: 2-30 s on a loaded 2-core machine) or released by the
#: job that held it.
CONNECT_TIMEOUT_S = 180.0
#: Seconds between checks while waiting for a slot.
_WAIT_POLL_S = 0.05
#: Most seconds the watcher waits on the starting slots' identities at a time
#: (slots started meanwhile join the wait after it).
_WATCH_POLL_S = 0.5
#: The process id reported for a worker that never started.
_NO_PID = -1


@dataclass(eq=False)
class RayWorkerHandle(WorkerHandle):
    """A slot actor (``process``: its :class:`ActorProcess`) and the supervisor's
    connection to it (``conn``, carried by ``relay``); ``node``: its scheduler node id."""

    node: str = ""
    relay: Relay | None = None

    def end(self) -> None:
        """Kill the actor and close the connection (the relay then ends)."""
        self.process.kill()
        if self.relay is not None:
            self.relay.stop()
        self.conn.close()


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
        self._cond = threading.Condition()
        self._starting: dict = {}  # identity ref -> (node, ActorProcess) of actors not yet up
        self._relays: list[Relay] = []  # of every slot that came up and may still run
        self._idle: dict[str, list[RayWorkerHandle]] = {}  # node -> idle slots
        self._ray_nodes: dict[int, str] = {}  # pid of a live slot -> the Ray node id it reported
        self._cancelled: set[str] = set()
        self._closed = False
        self._spawned = 0
        self.spares = self.max_idle = 0
        self._fresh = self._fresh_actor()
        self._watcher = threading.Thread(target=self._watch, name="pollux-ray-slots", daemon=True)
        self._watcher.start()

    # ------------------------------------------------------------ the slots
    def add_node(self, node: str, count: int) -> None:
        """Start ``count`` slot actors on ``node`` (they join the idle ones as they come up)."""
        for _ in range(count):
            self._start_slot(node)

    def _start_slot(self, node: str) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        info = self._nodes.get(node)
        if info is None or self._closed:
            return
        actor = self._actor_class.options(
            num_cpus=1, max_concurrency=ACTOR_SLOTS,
            scheduling_strategy=NodeAffinitySchedulingStrategy(info.ray_id, soft=False),
        ).remote()
        with self._cond:
            self._starting[actor.identity.remote()] = (node, ActorProcess(self._ray, actor, actor.serve.remote()))
            self._spawned += 1
            self._cond.notify_all()

    def _watch(self) -> None:
        """Register each starting slot as its identity comes (see :meth:`_register`), until closed."""
        ray = self._ray
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._starting or self._closed)
                if self._closed:
                    return
                refs = list(self._starting)
            ready, _ = ray.wait(refs, num_returns=1, timeout=_WATCH_POLL_S)
            for ref in ready:
                self._register(ref)

    def _register(self, ref) -> None:
        """The slot whose identity call ``ref`` finished joins its node's idle
        slots, with a relay for its connection; one that died starting is dropped."""
        try:
            pid, ray_node = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            with self._cond:
                entry = self._starting.pop(ref, None)
                self._cond.notify_all()
            if entry is not None:
                log.warning("a slot actor of node %s died starting: %s", entry[0], type(exc).__name__)
                entry[1].kill()
            return
        with self._cond:
            node, proc = self._starting.pop(ref, (None, None))
            if proc is None or self._closed:
                return
            proc.pid = pid
            relay = Relay(self._ray, proc.actor, name=f"pollux-ray-relay-{pid}")
            self._relays = [r for r in self._relays if r.running] + [relay]
            self._ray_nodes[pid] = ray_node
            self._idle.setdefault(node, []).append(RayWorkerHandle(proc, relay.conn, node=node, relay=relay))
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
            w.end()
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
        """End the idle and starting slots and the watcher (slots held by jobs
        are ended by the jobs), then wait for the relays of the ended slots."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle = [w for ws in self._idle.values() for w in ws]
            starting = [p for _, p in self._starting.values()]
            self._idle, self._starting = {}, {}
            relays = list(self._relays)
            self._cond.notify_all()
        self._watcher.join(timeout=2 * _WATCH_POLL_S + 1.0)
        for w in idle:
            w.end()
        for p in starting:
            p.kill()
        ActorProcess(self._ray, self._fresh, None).kill()
        for relay in relays:
            if not relay.running:
                relay.join(0)
            elif not relay.join():
                log.debug("a relay of the pool still runs (its slot is held by a job)")
