"""The Ray actor a replica runs in (:class:`ReplicaActor`), called by method.

A replica actor is a runtime worker hosted by Ray (the same assignment code,
:func:`~pollux_opt.runtime.worker.serve_assignment`, and messages,
:mod:`~pollux_opt.runtime.protocol`), whose supervisor calls its methods
instead of writing to a pipe:

* :meth:`~ReplicaActor.serve` runs one assignment and streams its reports
  (a Ray streaming generator: the supervisor ``ray.wait``\\ s on it);
* :meth:`~ReplicaActor.command` hands a ``STOP`` or ``BATCH`` to the
  assignment of its generation (Ray may run a threaded actor's calls out of
  order: a command carries its generation, so that one for an earlier
  generation is dropped and one that overtakes its ``serve`` waits for it);
* :meth:`~ReplicaActor.prepare`, :meth:`~ReplicaActor.host_store` (its job's
  TCP rendezvous), :meth:`~ReplicaActor.identity`,
  :meth:`~ReplicaActor.lifetime` (returns only when the actor dies: how an
  idle actor's death is seen) and :meth:`~ReplicaActor.run_target` (a fresh
  actor's completion check).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import threading

__all__ = ["ACTOR_SLOTS", "ERROR_EXIT_CODE", "Inbox", "ReplicaActor"]

log = logging.getLogger(__name__)

#: ``exitcode`` of an actor call that raised.
ERROR_EXIT_CODE = 1
#: Methods a replica actor runs at a time (``max_concurrency``): ``lifetime``,
#: ``serve``, a command, hosting a rendezvous store, and ``identity`` or ``prepare``.
ACTOR_SLOTS = 5


class Inbox:
    """The commands for an actor's assignments, by generation (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[int, tuple]] = []

    def put(self, generation: int, message: tuple) -> None:
        with self._lock:
            self._items.append((generation, message))

    def take(self, generation: int) -> tuple | None:
        """The next command of ``generation`` (those of earlier ones are dropped), or None."""
        with self._lock:
            self._items = [(g, m) for g, m in self._items if g >= generation]
            for i, (g, m) in enumerate(self._items):
                if g == generation:
                    del self._items[i]
                    return m
        return None


class _Link:
    """An assignment's connection inside the actor: the worker side's
    ``send``, ``poll`` and ``recv``; its reports come out of :meth:`reports`."""

    def __init__(self, inbox: Inbox, generation: int) -> None:
        self._inbox, self._generation = inbox, generation
        self._reports: queue.SimpleQueue = queue.SimpleQueue()
        self._next: tuple | None = None

    def send(self, message: tuple) -> None:
        # Pickled now: a report is a copy taken when it is sent, as through a pipe.
        self._reports.put(pickle.dumps(message))

    def poll(self) -> bool:
        if self._next is None:
            self._next = self._inbox.take(self._generation)
        return self._next is not None

    def recv(self) -> tuple:
        if not self.poll():
            raise EOFError("no command")
        message, self._next = self._next, None
        return message

    def close(self) -> None:
        self._reports.put(None)

    def reports(self):
        while (raw := self._reports.get()) is not None:
            yield pickle.loads(raw)


class ReplicaActor:
    """One replica on a Ray node (decorated with ``ray.remote`` by the pool)."""

    def __init__(self) -> None:
        import ray

        from pollux_opt.backends.ray.nodes import interface_of
        from pollux_opt.runtime.worker import PartsCache, worker_setup

        # torch imported here, once: two methods importing it at the same time abort the process.
        self._torch, self._dist, self._all_cpus = worker_setup(interface_of(ray.util.get_node_ip_address()))
        self._cache = PartsCache()
        self._busy = threading.Lock()  # one assignment or preparation at a time (they share the cache)
        self._inbox = Inbox()
        self._stores: dict = {}

    def identity(self) -> tuple[int, str]:
        """``(process id, Ray node id)`` of this actor."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def lifetime(self) -> None:
        """Return only when the actor dies (its caller then sees the error)."""
        threading.Event().wait()

    def serve(self, a):
        """Run the assignment ``a``, yielding its reports; the last is ``PAUSED`` or ``ERROR``."""
        link = _Link(self._inbox, a.generation)
        threading.Thread(target=self._serve, args=(link, a), name=f"pollux-gen-{a.generation}", daemon=True).start()
        yield from link.reports()

    def _serve(self, link: _Link, a) -> None:
        from pollux_opt.runtime.protocol import ERROR, send
        from pollux_opt.runtime.worker import error_report, serve_assignment

        try:
            with self._busy:
                serve_assignment(link, a, self._cache, self._torch, self._dist, self._all_cpus)
        except BaseException as exc:  # noqa: BLE001 - reported; the supervisor then ends this actor
            send(link, ERROR, error_report(a, exc))
        finally:
            link.close()

    def command(self, generation: int, message: tuple) -> None:
        """A command for the assignment of ``generation`` (see the module docstring)."""
        self._inbox.put(generation, message)

    def prepare(self, job_id: str, spec_json: str, workdir: str) -> None:
        """Build a job's parts ahead of an assignment."""
        from pollux_opt.runtime.worker import prepare_parts

        with self._busy:
            prepare_parts(self._cache, job_id, spec_json, workdir, self._torch)

    def host_store(self, generation: int) -> tuple[str, int]:
        """Host a new TCPStore (the rendezvous of ``generation``) on this node's IP;
        returns ``(ip, port)``.  Stores of earlier generations are dropped."""
        import ray

        ip = ray.util.get_node_ip_address()
        store = self._dist.TCPStore(ip, 0, None, is_master=True, wait_for_workers=False)
        self._stores = {generation: store}
        return ip, int(store.port)

    def run_target(self, target, args: tuple) -> int:
        """Run ``target(*args)`` (a fresh process's entry point); its exit status."""
        try:
            target(*args)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else ERROR_EXIT_CODE
        return 0
