"""The Ray actors a Ray run's jobs run in: one :class:`ReplicaActor` per replica
(and a fresh one per completion check), and :class:`ActorProcess`, the view of
an actor the runtime's job supervisor takes for a worker process.

A replica actor is the runtime's worker process
(:func:`pollux_opt.runtime.worker.worker_main`) hosted by Ray: its worker loop
(:meth:`ReplicaActor.serve`) reads and writes a
:class:`~pollux_opt.backends.ray.channel.WorkerChannel`, which the scheduler's
relay fills and empties through the actor's :meth:`~ReplicaActor.command` and
:meth:`~ReplicaActor.outbox` methods (the runtime's own worker protocol, so
that the supervisor reads it exactly as a local worker's pipe).  Ray places it
(one CPU, on the node the allocation names), starts it, carries its messages
and reports its death.  It is a threaded actor (:data:`ACTOR_SLOTS` methods at
a time): besides its worker loop, it takes commands, hands out reports, tells
who it is, and hosts its job's TCP rendezvous store while it trains.
"""

from __future__ import annotations

import logging
import os

__all__ = ["ACTOR_SLOTS", "ActorProcess", "ReplicaActor", "actor_exit_code"]

log = logging.getLogger(__name__)

#: ``exitcode`` of an actor Ray reports dead (killed, its node gone): as for a
#: process ended by SIGKILL.
DEAD_EXIT_CODE = -9
#: ``exitcode`` of an actor whose method raised.
ERROR_EXIT_CODE = 1
#: Environment variables that size a process's compute thread pools.
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: Methods a replica actor runs at a time (``max_concurrency``): its worker
#: loop, a command, the outbox's long poll, hosting a rendezvous store, and
#: :meth:`ReplicaActor.identity` or :meth:`ReplicaActor.hang_up`.
ACTOR_SLOTS = 5


class ReplicaActor:
    """One worker process on a Ray node (decorated with ``ray.remote`` by the pool)."""

    def __init__(self) -> None:
        # One thread per replica, before torch creates its thread pools; and torch
        # imported here, once, since two methods importing it at the same time
        # (the worker loop and hosting a store) abort the process.
        for var in _THREAD_VARS:
            os.environ[var] = "1"
        import torch.distributed  # noqa: F401

        from pollux_opt.backends.ray.channel import WorkerChannel

        self._stores: dict = {}
        self._channel = WorkerChannel()

    def identity(self) -> tuple[int, str]:
        """``(process id, Ray node id)`` of this actor."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def host_store(self, generation: int) -> tuple[str, int]:
        """Host a new TCPStore (the rendezvous of ``generation``) on this node's IP;
        returns ``(ip, port)``.  Stores of earlier generations are dropped."""
        import ray
        import torch.distributed as dist

        ip = ray.util.get_node_ip_address()
        store = dist.TCPStore(ip, 0, None, is_master=True, wait_for_workers=False)
        self._stores = {generation: store}
        return ip, int(store.port)

    def serve(self) -> int:
        """Run the worker loop on this actor's channel; returns 0 when it ends
        (after the reports it sent are delivered)."""
        import ray

        from pollux_opt.backends.ray.nodes import interface_of
        from pollux_opt.runtime.worker import worker_main

        try:
            worker_main(self._channel, gloo_interface=interface_of(ray.util.get_node_ip_address()))
        finally:
            self._channel.flush()
            self._channel.close()
        return 0

    def command(self, raw: bytes) -> None:
        """Pass a command (pickled) from the supervisor to the worker loop."""
        self._channel.put(raw)

    def outbox(self, timeout_s: float) -> list[bytes] | None:
        """The worker loop's reports (pickled) since the last call, waiting up to
        ``timeout_s`` seconds for one; None once the loop has ended and all are out."""
        return self._channel.take(timeout_s)

    def hang_up(self) -> None:
        """The supervisor closed its connection: the worker loop reads EOF."""
        self._channel.hang_up()

    def run_target(self, target, args: tuple) -> int:
        """Run ``target(*args)`` (a fresh process's entry point); its exit status."""
        try:
            target(*args)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else ERROR_EXIT_CODE
        return 0


def actor_exit_code(ray, ref) -> int:
    """The exit status of a finished actor method's ``ref`` (see the constants)."""
    try:
        return int(ray.get(ref))
    except ray.exceptions.RayActorError:
        return DEAD_EXIT_CODE
    except ray.exceptions.RayError:
        return ERROR_EXIT_CODE


class ActorProcess:
    """A Ray actor as the ``multiprocessing`` process the supervisor expects
    (``is_alive``, ``exitcode``, ``join``, ``terminate``, ``kill``, ``pid``).

    The actor counts as alive while ``ref`` (its long-running method) has not
    finished; a finished actor is ended (its CPU goes back to Ray).
    """

    def __init__(self, ray, actor, ref, pid: int | None = None) -> None:
        self._ray, self.actor, self.ref, self.pid = ray, actor, ref, pid
        self._ended = False

    def is_alive(self) -> bool:
        if self._ended:
            return False
        ready, _ = self._ray.wait([self.ref], timeout=0)
        return not ready

    @property
    def exitcode(self) -> int | None:
        if self.is_alive():
            return None
        if self.ref is None or (self._ended and not self._ray.wait([self.ref], timeout=0)[0]):
            return DEAD_EXIT_CODE
        return actor_exit_code(self._ray, self.ref)

    def join(self, timeout: float | None = None) -> None:
        if self.ref is not None:
            self._ray.wait([self.ref], timeout=timeout)
        if not self.is_alive():
            self.kill()

    def terminate(self) -> None:
        self.kill()

    def kill(self) -> None:
        if not self._ended:
            self._ended = True
            try:
                self._ray.kill(self.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone, or Ray shutting down
                log.debug("could not kill actor %s", self.actor, exc_info=True)
