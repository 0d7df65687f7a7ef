"""A pool of warm worker processes (torch already imported), shared by jobs,
and :class:`Worker`, what a job's supervisor uses of one worker.

A supervisor sends its workers commands (:meth:`Worker.send`) and gets their
reports from its pool (:meth:`WorkerPool.receive`), in the messages of
:mod:`~pollux_opt.runtime.protocol`; a local worker is a process and a pipe
(:class:`WorkerHandle`), a Ray one an actor (:mod:`pollux_opt.backends.ray.pool`).

Spawning a worker costs about two seconds of one core (interpreter start and
``import torch``), more than the whole rescale budget, so the pool keeps
``spares`` idle workers ready, and workers released by a job stay idle with
that job's model and data still built, for the same job to reuse.  Every
process a pool starts runs under a :class:`~pollux_opt.runtime.lifeline.Lifeline`
(it ignores SIGINT and ends itself once the pool's owner is gone); the fork
server preloads :mod:`~pollux_opt.runtime.forkserver_boot`.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Protocol

from solvers import InvalidProblem

from pollux_opt.model.domains import Choice, Integer, check
from pollux_opt.runtime.lifeline import own_temp_dir, pool_process_main, process_identity, sweep_temp_dirs
from pollux_opt.runtime.protocol import EXIT, PREPARE, send
from pollux_opt.runtime.worker import worker_main

__all__ = ["Worker", "WorkerHandle", "WorkerPool", "serves"]

logger = logging.getLogger("pollux_opt.runtime")

#: The fork server's preload list: one module, which imports torch and the
#: workers' code under a parent-death signal (see its docstring).
FORKSERVER_PRELOAD = ("pollux_opt.runtime.forkserver_boot",)
#: Idle workers a pool keeps (spares, and at most ``max_idle``).
_IDLE_WORKERS = Integer(ge=0)
#: Seconds a terminated worker gets to exit before it is killed.
TERMINATE_GRACE_S = 2.0


class Worker(Protocol):
    """One worker, as its job's supervisor sees it (reports come through its
    pool's ``receive``); ``exitcode``: None while it runs, its exit status once it ended."""

    job_key: str | None

    @property
    def pid(self) -> int: ...

    @property
    def exitcode(self) -> int | None: ...

    def alive(self) -> bool: ...

    def send(self, *message) -> bool:
        """Send a command (see the protocol); False where the worker is gone."""

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (None: forever) for the worker to end."""


@dataclass(eq=False)
class WorkerHandle:
    """One worker process and the controller's end of its pipe (a :class:`Worker`)."""

    process: mp.process.BaseProcess
    conn: Connection
    created: float = field(default_factory=time.monotonic)
    #: job_id of the parts the worker has built (warm for that job), if any.
    job_key: str | None = None
    #: The GPU the process is bound to once it served one (it serves no other
    #: GPU, nor CPU replicas: it holds a CUDA context there); None: not bound.
    gpu: int | None = None

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def alive(self) -> bool:
        return self.process.is_alive()

    def send(self, *message) -> bool:
        return send(self.conn, *message)

    def join(self, timeout: float | None = None) -> None:
        self.process.join(timeout)


def serves(worker: WorkerHandle, gpu: int | None) -> bool:
    """Whether ``worker`` can serve a replica on GPU ``gpu`` (None: CPU cores):
    a process bound to a GPU serves only that one; an unbound one serves any,
    and is bound by the first GPU it serves (:class:`~pollux_opt.runtime.device.GpuBinding`)."""
    return worker.gpu == gpu or (worker.gpu is None and gpu is not None)


class WorkerPool:
    """Warm worker processes for one or more :class:`ElasticJob` handles (thread-safe).

    Args:
        spares: idle workers kept ready (spawned in the background) beyond
            those jobs hold.
        max_idle: most idle workers kept; more are shut down on release.
        start_method: multiprocessing start method.  The default,
            "forkserver" where available, forks workers from a server process
            that has imported torch once (:mod:`~pollux_opt.runtime.forkserver_boot`),
            so a cold worker costs tens of milliseconds instead of seconds;
            "spawn" starts each interpreter afresh (portable, slower).

    :meth:`close` (or leaving a ``with`` block) ends its idle processes; workers
    held by jobs are ended by the jobs.  A new pool removes the temporary
    folders ended pools left behind.
    """

    def __init__(self, spares: int = 1, *, max_idle: int | None = None, start_method: str | None = None) -> None:
        spares = check("spares", spares, _IDLE_WORKERS)
        max_idle = check("max_idle", max(spares, 2) if max_idle is None else max_idle, _IDLE_WORKERS)
        if max_idle < spares:
            raise InvalidProblem(f"max_idle must be >= spares ({spares}), got {max_idle!r}")
        methods = mp.get_all_start_methods()
        if start_method is None:
            start_method = "forkserver" if "forkserver" in methods else "spawn"
        # Forking a process that runs supervisor threads is unsafe.
        check("start_method", start_method, Choice(tuple(m for m in methods if m != "fork")))
        self._ctx = mp.get_context(start_method)
        sweep_temp_dirs()
        own_temp_dir()
        #: This process, which the pool's processes watch (they end once it is gone).
        self.owner = process_identity()
        if start_method == "forkserver":
            # The server imports these once; every worker is forked with them loaded.
            self._ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        self.start_method = start_method
        self.spares = spares
        self.max_idle = max_idle
        self._idle: list[WorkerHandle] = []
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ spawning
    def _spawn(self) -> WorkerHandle:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=worker_main, args=(child, self.owner),
                                    name="pollux-worker", daemon=True)
        process.start()
        child.close()
        logger.debug("spawned worker pid %d", process.pid)
        return WorkerHandle(process, parent)

    def start_process(self, target, args: tuple, name: str) -> mp.process.BaseProcess:
        """Start ``target(*args)`` in a new process of the pool's start method
        (forked from the fork server: torch imported, no job's state); not a
        pool worker.  ``target`` must be a top-level function, ``args`` picklable."""
        process = self._ctx.Process(target=pool_process_main, args=(self.owner, target, args), name=name,
                                    daemon=True)
        process.start()
        return process

    def warm(self, count: int | None = None) -> None:
        """Make sure at least ``count`` (default ``spares``) idle workers exist or are starting."""
        with self._lock:
            self._prune_locked()
            while not self._closed and len(self._idle) < (self.spares if count is None else count):
                self._idle.append(self._spawn())

    def _prune_locked(self) -> None:
        dead = [w for w in self._idle if not w.alive()]
        for w in dead:
            self._idle.remove(w)
            w.conn.close()

    # ------------------------------------------------------------ acquire/release
    def acquire(self, count: int, job_key: str | None = None, gpu: int | None = None) -> list[WorkerHandle]:
        """``count`` workers for a job's replicas on GPU ``gpu`` (None: on CPU
        cores): idle ones that can serve it (:func:`serves`) and are warm for
        ``job_key`` first, then other such idle ones (bound to ``gpu`` before
        unbound ones), then newly spawned ones (which start in the background;
        messages sent to them wait in their pipe).  Then spares are replenished."""
        if self._closed:
            raise RuntimeError("the worker pool is closed")
        with self._lock:
            self._prune_locked()
            fitting = sorted((w for w in self._idle if serves(w, gpu)),
                             key=lambda w: (w.job_key != job_key, w.gpu != gpu, w.created))
            taken = fitting[:count]
            self._idle = [w for w in self._idle if w not in taken]
            while len(taken) < count:
                taken.append(self._spawn())
            # Spares for any replica: workers bound to a GPU serve only that GPU.
            while sum(1 for w in self._idle if w.gpu is None) < self.spares:
                self._idle.append(self._spawn())
        return taken

    def release(self, workers: list[WorkerHandle]) -> None:
        """Return healthy idle workers to the pool (extra ones beyond max_idle end)."""
        surplus = []
        with self._lock:
            for w in workers:
                if self._closed or not w.alive():
                    surplus.append(w)
                else:
                    self._idle.append(w)
            self._prune_locked()
            # Keep the workers warm for the most jobs: drop the oldest first.
            self._idle.sort(key=lambda w: w.created, reverse=True)
            while len(self._idle) > self.max_idle:
                surplus.append(self._idle.pop())
        self.discard(surplus, graceful=True)

    def discard(self, workers: list[WorkerHandle], graceful: bool = False) -> None:
        """End workers: ask idle ones to exit (graceful), else terminate, then kill."""
        for w in workers:
            if graceful and w.alive():
                w.send(EXIT)
            elif w.alive():
                w.process.terminate()
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for w in workers:
            w.process.join(max(deadline - time.monotonic(), 0.0))
            if w.process.is_alive():
                w.process.kill()
                w.process.join(TERMINATE_GRACE_S)
            w.conn.close()

    @staticmethod
    def receive(workers: list[WorkerHandle], timeout: float) -> list[tuple[WorkerHandle, tuple]]:
        """The reports ``workers`` sent, each with its sender, in order per
        worker, waiting up to ``timeout`` seconds for one; a worker that ended
        sends none (the supervisor sees it is not alive)."""
        senders = {w.conn: w for w in workers}
        out = []
        for conn in wait(list(senders), timeout=timeout):
            try:
                while conn.poll():
                    out.append((senders[conn], conn.recv()))
            except (EOFError, OSError):
                pass  # the process ended
        return out

    def regroup(self, workers: list[WorkerHandle], alloc, job_key: str | None = None) -> list[WorkerHandle]:
        """The workers, in rank order, of a job's next generation on ``alloc`` (a
        ``WorkerAllocation``): for each rank a live current worker on its GPU or
        CPU cores, else (a GPU rank) an idle worker already bound to its GPU
        (its CUDA context is up), else a live current worker that can serve it,
        else an acquired one; the other current workers are released.  Every
        worker of this pool runs on this machine, so the placement's nodes do
        not matter here, its GPUs do."""
        live = [w for w in workers if w.alive()]
        chosen: list[WorkerHandle | None] = []
        for gpu in alloc.rank_gpus():
            w = next((w for w in live if w.gpu == gpu), None)
            if w is None and gpu is not None:
                w = self.take_bound(gpu, job_key)
            if w is None:
                w = next((w for w in live if serves(w, gpu)), None)
            if w in live:
                live.remove(w)
            chosen.append(w)
        surplus = [w for w in workers if w not in chosen]
        if surplus:
            self.release(surplus)
        out = []
        for w, gpu in zip(chosen, alloc.rank_gpus()):
            w = w if w is not None else self.acquire(1, job_key=job_key, gpu=gpu)[0]
            if gpu is not None:
                w.gpu = gpu  # bound by the assignment it is about to serve
            out.append(w)
        return out

    def take_bound(self, gpu: int, job_key: str | None = None) -> WorkerHandle | None:
        """An idle worker bound to GPU ``gpu`` (one warm for ``job_key`` first), taken; None if none."""
        with self._lock:
            self._prune_locked()
            bound = sorted((w for w in self._idle if w.gpu == gpu), key=lambda w: (w.job_key != job_key, w.created))
            if bound:
                self._idle.remove(bound[0])
            return bound[0] if bound else None

    def rendezvous(self, workers: list[WorkerHandle], workdir, generation: int) -> str:
        """Where ``workers`` (more than one) form generation ``generation``'s gloo
        group: a new FileStore file in the job's work directory (``store_path``)."""
        rdzv = Path(workdir) / "rendezvous"
        rdzv.mkdir(exist_ok=True)
        store = rdzv / f"gen-{generation}"
        store.unlink(missing_ok=True)
        return str(store)

    def prepare(self, job_key: str, spec_json: str, workdir: str, count: int = 1) -> int:
        """Have up to ``count`` idle workers build a job's parts ahead of time, so
        that the job's next scale-up skips the build.  Only workers warm for no
        job are used (never one warm for another job), and none if ``count``
        workers are already warm for this one.  Returns how many were asked."""
        asked = 0
        with self._lock:
            self._prune_locked()
            warm = sum(1 for w in self._idle if w.job_key == job_key)
            for w in self._idle:
                if warm + asked >= count:
                    break
                if w.job_key is None:
                    if not w.send(PREPARE, job_key, spec_json, workdir):
                        continue
                    w.job_key = job_key
                    asked += 1
        return asked

    def close(self) -> None:
        """End all idle workers; further acquires fail."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        self.discard(idle, graceful=True)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
