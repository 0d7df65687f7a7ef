"""The Ray actor a replica runs in (:class:`ReplicaActor`): a runtime worker
(the same :func:`~pollux_opt.runtime.worker.serve_assignment` and messages)
whose supervisor calls its methods instead of writing to a pipe.

:meth:`~ReplicaActor.serve` runs one assignment and streams its reports (a Ray
streaming generator, which the supervisor ``ray.wait`` waits on);
:meth:`~ReplicaActor.command` hands a ``STOP`` or ``BATCH`` to the assignment
it names by job id and generation (Ray may run a threaded actor's calls out
of order: one that overtakes its ``serve`` waits for it; a ``serve`` drops the
commands of every other assignment but the same job's later generations, which
actors shared by all jobs would otherwise hand to the wrong one); :meth:`~ReplicaActor.lifetime` returns only when the actor
dies, which is how an idle actor's death is seen.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import queue
import socket
import struct
import threading

__all__ = ["ACTOR_SLOTS", "ERROR_EXIT_CODE", "Link", "ReplicaActor", "interface_of"]

#: ``exitcode`` of an actor call that raised.
ERROR_EXIT_CODE = 1
#: Methods a replica actor runs at a time (``max_concurrency``): ``lifetime``,
#: ``serve``, a command, hosting a rendezvous store, and ``identity`` or ``run_target``.
ACTOR_SLOTS = 5
#: Linux ioctl that reads an interface's IPv4 address (``<linux/sockios.h>``).
_SIOCGIFADDR = 0x8915


class Link:
    """An assignment's end inside the actor, as :func:`~pollux_opt.runtime.worker.serve_assignment`
    needs one: the worker side reads commands with ``poll``/``recv`` and reports with
    ``send``, as over a pipe, so Ray's method calls are bridged by two queues here."""

    def __init__(self) -> None:
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.reports: queue.SimpleQueue = queue.SimpleQueue()

    def send(self, message: tuple) -> None:
        # Pickled now: a report is a copy taken when it is sent, as through a pipe.
        self.reports.put(pickle.dumps(message))

    def poll(self) -> bool:
        return not self.commands.empty()

    def recv(self) -> tuple:
        try:
            return self.commands.get_nowait()
        except queue.Empty:
            raise EOFError("no command") from None


class ReplicaActor:
    """One replica on a Ray node (decorated with ``ray.remote`` by the pool)."""

    def __init__(self) -> None:
        import ray

        from pollux_opt.runtime.device import GpuBinding
        from pollux_opt.runtime.worker import PartsCache, worker_setup

        # torch imported here, once: two methods importing it at the same time abort the process.
        self._torch, self._dist, self._all_cpus = worker_setup(interface_of(ray.util.get_node_ip_address()))
        self._cache = PartsCache()
        self._gpus = GpuBinding()  # Ray shows an actor holding a GPU only that one
        self._busy = threading.Lock()  # one assignment at a time (they share the cache)
        self._lock = threading.Lock()  # guards the links
        self._links: dict[tuple[str, int], Link] = {}  # by (job id, generation)
        self._stores: dict = {}

    def identity(self) -> tuple[int, str]:
        """``(process id, Ray node id)`` of this actor."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def visible_gpus(self) -> str | None:
        """The GPUs Ray shows this actor (``CUDA_VISIBLE_DEVICES``; None: Ray set none)."""
        return os.environ.get("CUDA_VISIBLE_DEVICES")

    def lifetime(self) -> None:
        """Return only when the actor dies (its caller then sees the error)."""
        threading.Event().wait()

    def serve(self, a):
        """Run the assignment ``a``, yielding its reports; the last is ``PAUSED`` or ``ERROR``."""
        key = (a.job_id, a.generation)
        with self._lock:
            self._links = {k: link for k, link in self._links.items() if k[0] == a.job_id and k[1] >= a.generation}
            link = self._links.setdefault(key, Link())
        threading.Thread(target=self._serve, args=(link, a), name=f"pollux-gen-{a.generation}", daemon=True).start()
        while (raw := link.reports.get()) is not None:
            yield pickle.loads(raw)

    def _serve(self, link: Link, a) -> None:
        from pollux_opt.runtime.protocol import ERROR, send
        from pollux_opt.runtime.worker import error_report, serve_assignment

        try:
            with self._busy:
                serve_assignment(link, a, self._cache, self._torch, self._dist, self._all_cpus, gpus=self._gpus)
        except BaseException as exc:  # noqa: BLE001 - reported; the supervisor then ends this actor
            send(link, ERROR, error_report(a, exc))
        finally:
            link.reports.put(None)

    def command(self, assignment: tuple[str, int], message: tuple) -> None:
        """A command for the assignment ``(job id, generation)`` (see the module docstring)."""
        with self._lock:
            self._links.setdefault(tuple(assignment), Link()).commands.put(message)

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


def interface_of(ip: str) -> str:
    """The name of this machine's network interface with IPv4 address ``ip``
    (what gloo binds to: ``GLOO_SOCKET_IFNAME``); ValueError naming ``ip`` if none has it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    raise ValueError(f"no network interface of this machine has the address ip={ip!r}")
