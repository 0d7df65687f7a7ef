"""A Ray run's replicas: actors on the nodes an allocation names (:class:`RayWorkerPool`),
each a :class:`~pollux_opt.runtime.pool.Worker` of its job's supervisor (:class:`RayWorker`).

The pool has the local pool's interface, so that a Ray job is the runtime's own
:class:`~pollux_opt.runtime.job.ElasticJob` with Ray doing placement, process
start, messages and failure detection (docs/ray.md, "How jobs run on Ray").
Each CPU of each node is one slot (each GPU, on a node with GPUs): a long-lived
:class:`~pollux_opt.backends.ray.actors.ReplicaActor` pinned to its node,
started as the node is seen (:meth:`RayWorkerPool.add_node`) and kept warm.  A
job's next generation keeps its live replicas on the nodes its placement still
uses, then takes idle slots there (warm for the job first), waiting for one to
be released; a discarded replica is ended and its slot started anew.  A
replica whose actor died is a lost worker; one that reported an error is
ended, as a local worker exits after its error report.
"""

from __future__ import annotations

import logging
import threading
import time

from pollux_opt.backends.ray.actors import ACTOR_SLOTS, ERROR_EXIT_CODE, ReplicaActor
from pollux_opt.runtime.pool import WorkerPool
from pollux_opt.runtime.protocol import ERROR, RUN, TCP_STORE_PREFIX

__all__ = ["CONNECT_TIMEOUT_S", "ActorCall", "RayWorker", "RayWorkerPool"]

log = logging.getLogger(__name__)

#: Most seconds a replica waits for a slot of its node to be released by the
#: job that holds it, or for its actor to start (a cold actor imports torch:
#: 2-30 s on a loaded 2-core machine).
CONNECT_TIMEOUT_S = 180.0
#: ``exitcode`` of an actor Ray reports dead (killed, its node gone): as for a
#: process ended by SIGKILL.
DEAD_EXIT_CODE = -9
#: Seconds between checks while waiting for a slot.
_WAIT_POLL_S = 0.05
#: The process id of a replica whose actor never started.
_NO_PID = -1


def _kill(ray, actor) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone, or Ray shutting down
        log.debug("could not kill actor %s", actor, exc_info=True)


class RayWorker:
    """One slot actor as a supervisor's :class:`~pollux_opt.runtime.pool.Worker`;
    ``node``: its scheduler node id (``actor`` None: a replica that never
    started, already ended)."""

    def __init__(self, ray, actor, node: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
        self._ray, self.actor, self.node, self._timeout = ray, actor, node, timeout
        self.job_key: str | None = None
        self.exitcode: int | None = None if actor is not None else DEAD_EXIT_CODE
        self._pid: int | None = None if actor is not None else _NO_PID
        self._identity = actor.identity.remote() if actor is not None else None
        self._lifetime = actor.lifetime.remote() if actor is not None else None
        self._assignment: tuple[str, int] | None = None  # (job id, generation) of the last RUN
        self.stream = None  # the reports of the current assignment (a Ray streaming generator)
        self._arrived: list[tuple] = []  # reports fetched from the stream, not yet handed out

    @property
    def pid(self) -> int:
        """The actor's process id (waits for the actor to start; -1 where it never did)."""
        if self._pid is None:
            try:
                self._pid = self._ray.get(self._identity, timeout=self._timeout)[0]
            except Exception as exc:  # noqa: BLE001 - died starting, or too slow: a lost worker
                log.warning("a slot actor of node %s did not start: %s", self.node, type(exc).__name__)
                self._pid = _NO_PID
                self.end()
        return self._pid

    def started(self) -> bool:
        """Whether the actor is up (without waiting; one that died starting is ended)."""
        if self._pid is None and self._ray.wait([self._identity], timeout=0)[0]:
            self.pid  # noqa: B018 - resolves it, or ends the slot
        return self._pid is not None and self.exitcode is None

    def alive(self) -> bool:
        if self.exitcode is None and self._ray.wait([self._lifetime], timeout=0)[0]:
            self.end()  # lifetime returns only when the actor died
        return self.exitcode is None

    def send(self, *message) -> bool:
        if not self.alive():
            return False
        if message[0] == RUN:
            self._assignment = (message[1].job_id, message[1].generation)
            self.stream = self.actor.serve.options(num_returns="streaming").remote(message[1])
        else:
            self.actor.command.remote(self._assignment, message)
        return True

    def reports(self) -> list[tuple]:
        """The reports of the current assignment that have arrived (without waiting)."""
        self._fetch()
        out, self._arrived = self._arrived, []
        return out

    def _fetch(self) -> None:
        while self.stream is not None and self._ray.wait([self.stream], timeout=0)[0]:
            try:
                message = self._ray.get(next(self.stream))
            except StopIteration:
                self.stream = None
                break
            except self._ray.exceptions.RayError:
                self.stream = None
                self.end()  # the actor died
                break
            self._arrived.append(message)
            if message[0] == ERROR:
                self.end(ERROR_EXIT_CODE)  # its process group may be half-formed: never reused

    def join(self, timeout: float | None = None) -> None:
        """Wait until the actor died or reported an error (then it is ended), at most ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.alive():
            self._fetch()
            left = None if deadline is None else deadline - time.monotonic()
            if self.exitcode is not None or left is not None and left <= 0:
                return
            waits = [self._lifetime] + ([self.stream] if self.stream is not None else [])
            self._ray.wait(waits, num_returns=1, timeout=left)

    def end(self, code: int = DEAD_EXIT_CODE) -> None:
        """Kill the actor (``code``: the exit status it gets, if it had none)."""
        if self.exitcode is None:
            self.exitcode = code
        if self.actor is not None:
            _kill(self._ray, self.actor)


class ActorCall:
    """A method call of an actor as the ``multiprocessing`` process the
    completion check expects (``is_alive``, ``join``, ``exitcode``, ``kill``);
    the actor is ended once the call is joined."""

    def __init__(self, ray, actor, ref) -> None:
        self._ray, self._actor, self._ref = ray, actor, ref

    def is_alive(self) -> bool:
        return not self._ray.wait([self._ref], timeout=0)[0]

    def join(self, timeout: float | None = None) -> None:
        self._ray.wait([self._ref], timeout=timeout)
        if not self.is_alive():
            self.kill()

    @property
    def exitcode(self) -> int | None:
        if self.is_alive():
            return None
        try:
            return int(self._ray.get(self._ref))
        except self._ray.exceptions.RayActorError:
            return DEAD_EXIT_CODE
        except self._ray.exceptions.RayError:
            return ERROR_EXIT_CODE

    def kill(self) -> None:
        _kill(self._ray, self._actor)


class RayWorkerPool(WorkerPool):
    """The slot actors of one Ray run (see the module docstring); the local
    pool's process machinery (start method, fork server, spares) does not apply.

    Args:
        nodes: the run's :class:`~pollux_opt.backends.ray.nodes.RayNodes` (scheduler node id -> Ray node).
        connect_timeout_s: see :data:`CONNECT_TIMEOUT_S`.
    """

    def __init__(self, nodes, *, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self._ray = nodes.ray
        self._nodes = nodes
        self._timeout = float(connect_timeout_s)
        self._actor_class = self._ray.remote(ReplicaActor)
        self._cond = threading.Condition()
        self._idle: dict[str, list[RayWorker]] = {}  # node -> idle slots (started or starting)
        self._retired: set[str] = set()  # nodes being given back: no idle slot kept there
        self._cancelled: set[str] = set()
        self._closed = False
        self._fresh = self._fresh_actor()

    # ------------------------------------------------------------ the slots
    def add_node(self, node: str, count: int) -> None:
        """Start ``count`` slot actors on ``node`` (idle; handed out once up)."""
        with self._cond:
            self._retired.discard(node)
        for _ in range(count):
            self._start_slot(node)

    def retire_node(self, node: str) -> None:
        """Keep no idle slot on ``node`` (ended now, and as jobs release theirs), so
        that it holds no Ray resources once its jobs have moved off and Ray's
        autoscaler can remove it; :meth:`add_node` takes it back."""
        with self._cond:
            self._retired.add(node)
            idle = self._idle.pop(node, [])
        for w in idle:
            w.end()

    def _start_slot(self, node: str) -> None:
        info = self._nodes.get(node)
        if info is None or self._closed or node in self._retired:
            return
        actor = self._new_actor(1, info.ray_id, soft=False, gpus=1 if info.gpus else 0)
        with self._cond:
            slot = RayWorker(self._ray, actor, node, self._timeout)
            self._idle.setdefault(node, []).append(slot)
            self._cond.notify_all()

    def _new_actor(self, cpus: int, ray_node: str, soft: bool, gpus: int = 0):
        """A new replica actor holding ``cpus`` Ray CPUs and ``gpus`` GPUs (Ray then
        shows it only those: ``CUDA_VISIBLE_DEVICES``) on the Ray node ``ray_node``
        (``soft``: elsewhere where that node cannot take it)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self._actor_class.options(
            num_cpus=cpus, num_gpus=gpus, max_concurrency=ACTOR_SLOTS,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node, soft=soft),
        ).remote()

    def _take(self, node: str, job_key: str | None) -> RayWorker:
        """An idle slot of ``node`` that is up (one warm for ``job_key`` first),
        waiting for one to start or be released; a dead worker where none comes
        (see :meth:`_node_gone`).  A slot dying as it starts (its node leaving)
        is never handed out: it would cost the job a fault restart."""
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while True:
                idle = self._idle.get(node, [])
                idle[:] = [w for w in idle if w.alive()]
                up = sorted((w for w in idle if w.started()), key=lambda w: w.job_key != job_key)
                if up:
                    idle.remove(up[0])
                    return up[0]
                if time.monotonic() > deadline or self._closed or job_key in self._cancelled:
                    break
                if self._nodes.get(node) is None or not idle and not self._nodes.alive(node):
                    break
                self._cond.wait(_WAIT_POLL_S)
        if not self._nodes.alive(node):
            return self._node_gone(job_key, node)
        log.warning("no slot of node %s came for job %s within %.0f s", node, job_key, self._timeout)
        return RayWorker(self._ray, None, node)

    def _node_gone(self, job_key: str | None, node: str) -> RayWorker:
        """A replica for ``node``, which left the cluster: wait (up to the
        connect timeout) until the backend cancels the job's launch
        (:meth:`cancel`), so that the job's supervisor does not spend its fault
        restarts on a node that is gone, then a dead worker."""
        log.warning("node %s is not in the Ray cluster: job %s waits to be placed elsewhere", node, job_key)
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while job_key not in self._cancelled and time.monotonic() < deadline and not self._closed:
                self._cond.wait(_WAIT_POLL_S)
        return RayWorker(self._ray, None, node)

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
    def receive(self, workers: list[RayWorker], timeout: float) -> list[tuple[RayWorker, tuple]]:
        """The reports ``workers`` sent, each with its sender, waiting up to
        ``timeout`` seconds for one (as :meth:`WorkerPool.receive`)."""
        streams = [w.stream for w in workers if w.stream is not None]
        if streams:
            self._ray.wait(streams, num_returns=1, timeout=timeout)
        else:
            time.sleep(timeout)
        return [(w, message) for w in workers for message in w.reports()]

    def regroup(self, workers: list[RayWorker], alloc, job_key: str | None = None) -> list[RayWorker]:
        """The workers, in rank order (node by node, as ``alloc.placement`` lists
        them), of a job's next generation: its live workers on each node first,
        then idle slots there; the others are released."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        wanted = [node for node, k in alloc.placement.items() for _ in range(k)]
        spare = [w for w in workers if w.alive()]
        chosen: list[RayWorker | None] = []
        for node in wanted:
            match = next((w for w in spare if w.node == node), None)
            if match is not None:
                spare.remove(match)
            chosen.append(match)
        self.release([w for w in workers if w not in chosen])
        out = [w if w is not None else self._take(node, job_key) for node, w in zip(wanted, chosen)]
        for w in out:
            w.job_key = job_key
        return out

    def rendezvous(self, workers: list[RayWorker], workdir, generation: int) -> str:
        """``tcp://ip:port`` of a TCPStore rank 0's actor hosts for ``generation``
        (an unreachable address where rank 0 is gone: its peers then fail to form
        the group, and the lost rank 0 restarts the job)."""
        try:
            ip, port = self._ray.get(workers[0].actor.host_store.remote(generation), timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - a dead or unreachable rank 0 is a fault, handled as one
            log.warning("rank 0 could not host the rendezvous of generation %d: %s", generation, exc)
            ip, port = "127.0.0.1", 1
        return f"{TCP_STORE_PREFIX}{ip}:{port}"

    def release(self, workers: list[RayWorker]) -> None:
        """Return live ``workers`` to their nodes' idle slots; dead ones are replaced."""
        dead = []
        with self._cond:
            for w in workers:
                if w.alive() and not self._closed and w.node not in self._retired:
                    self._idle.setdefault(w.node, []).append(w)
                else:
                    dead.append(w)
            self._cond.notify_all()
        self.discard(dead)

    def discard(self, workers: list[RayWorker], graceful: bool = False) -> None:
        """End ``workers`` (faulty, or their job failed) and start their slots anew."""
        for w in workers:
            w.end()
            if w.actor is not None and self._nodes.alive(w.node):
                self._start_slot(w.node)

    def prepare(self, job_key: str, spec_json: str, workdir: str, count: int = 1) -> int:
        """Every slot keeps the parts of the job it last served; none is asked to build ahead."""
        return 0

    def start_process(self, target, args: tuple, name: str) -> ActorCall:
        """Run ``target(*args)`` in a fresh actor that never trained, on the
        scheduler's node (zero CPUs: like the local check, it holds none of the
        job's cores; and that node leaves only with the scheduler); it is ended
        once joined.  The actor was started ahead (torch imported; a new one
        where that one died, its node gone), and the next one is started now."""
        with self._cond:
            fresh = self._fresh if self._fresh.alive() else self._fresh_actor()
            self._fresh = self._fresh_actor()
        return ActorCall(self._ray, fresh.actor, fresh.actor.run_target.remote(target, args))

    def _fresh_actor(self) -> RayWorker:
        """A new zero-CPU actor on the scheduler's node, where it can (for :meth:`start_process`)."""
        here = self._ray.get_runtime_context().get_node_id()
        return RayWorker(self._ray, self._new_actor(0, here, soft=True), "", self._timeout)

    @property
    def idle_count(self) -> int:
        with self._cond:
            return sum(len(v) for v in self._idle.values())

    def close(self) -> None:
        """End the idle slots and the ready fresh actor (slots held by jobs are ended by the jobs)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            idle = [w for ws in self._idle.values() for w in ws]
            self._idle = {}
            self._cond.notify_all()
        for w in idle:
            w.end()
        self._fresh.end()
