"""The supervisor's connection to a replica actor, over Ray actor method calls.

The runtime's supervisor talks to a worker through a ``multiprocessing``
connection (``send``, ``recv``, ``poll``, ``multiprocessing.connection.wait``;
the messages of :mod:`~pollux_opt.runtime.worker`).  For a worker hosted by a
Ray actor, the two ends are joined by Ray's own calls, with no socket of
their own:

* In the actor, :class:`WorkerChannel` is the worker's connection: the worker
  reads the commands the actor's ``command`` method puts in, and the actor's
  ``outbox`` method (a long poll) hands out what the worker sent.
* In the scheduler, a :class:`Relay` per actor holds a local pipe whose one end
  is the supervisor's connection, and two threads: *down* forwards each
  command to ``actor.command`` and waits for it (so commands arrive in
  order), *up* calls ``actor.outbox`` in a loop and writes each report into
  the pipe.  When the actor dies, or its worker ends and its reports are all
  delivered, the relay shuts its end down: the supervisor reads EOF, as from a
  local worker's pipe.  When the supervisor closes its connection, the relay
  hangs the actor's channel up: the worker reads EOF.

Messages travel as the pickled bytes a ``multiprocessing`` connection sends,
so they are copied when sent, as through a pipe.  A worker may end its process
at once after reporting an error; that report (and every report, when the
worker loop returns) is therefore *flushed*: the sender waits until the relay
has written it into the supervisor's pipe (:data:`FLUSH_TIMEOUT_S` at most).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections import deque
from multiprocessing import Pipe
from multiprocessing.reduction import ForkingPickler

__all__ = ["FINAL_REPORTS", "FLUSH_TIMEOUT_S", "OUTBOX_POLL_S", "Relay", "WorkerChannel"]

log = logging.getLogger(__name__)

#: Seconds one ``outbox`` call waits for a report before returning none (the
#: relay then asks again): short enough that a relay notices a stop quickly,
#: long enough that an idle actor costs about one call a second.
OUTBOX_POLL_S = 1.0
#: Most seconds a flushed report waits for the relay to deliver it (a relay
#: that is gone: the scheduler ended, and Ray ends its actors).
FLUSH_TIMEOUT_S = 10.0
#: Report kinds after which a worker may end its process at once
#: (:func:`~pollux_opt.runtime.worker.worker_main` leaves with ``os._exit``
#: after an error): they are flushed.
FINAL_REPORTS = frozenset({"error"})
#: Most seconds closing a relay waits for each of its threads.
_JOIN_S = 2 * OUTBOX_POLL_S + 1.0


class WorkerChannel:
    """Both ends of one worker's connection inside its actor (thread-safe).

    The worker's end is a connection's ``send``, ``recv``, ``poll`` and
    ``close``; the actor's end is :meth:`put` (a command in), :meth:`take`
    (reports out) and :meth:`hang_up` (the supervisor is gone).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._commands: deque[bytes] = deque()
        self._reports: deque[bytes] = deque()
        self._sent = 0       # reports the worker sent
        self._handed = 0     # reports handed out by take() so far
        self._delivered = 0  # reports the relay has written into the supervisor's pipe
        self._hung_up = False  # the supervisor's side is gone: the worker reads EOF
        self._closed = False   # the worker's side is closed: no more reports

    # ------------------------------------------------------- the worker's end
    def send(self, obj) -> None:
        """Send ``obj`` to the supervisor (BrokenPipeError once hung up); a
        report of a kind in :data:`FINAL_REPORTS` is flushed."""
        raw = bytes(ForkingPickler.dumps(obj))
        with self._cond:
            if self._hung_up or self._closed:
                raise BrokenPipeError("the supervisor's connection is closed")
            self._reports.append(raw)
            self._sent += 1
            self._cond.notify_all()
        if isinstance(obj, tuple) and obj and obj[0] in FINAL_REPORTS:
            self.flush()

    def recv(self):
        """The next command (blocks); EOFError once hung up and none is left."""
        with self._cond:
            self._cond.wait_for(lambda: self._commands or self._hung_up)
            if not self._commands:
                raise EOFError
            raw = self._commands.popleft()
        return ForkingPickler.loads(raw)

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether :meth:`recv` would not block, waiting up to ``timeout`` seconds (None: forever)."""
        with self._cond:
            return bool(self._cond.wait_for(lambda: self._commands or self._hung_up, timeout))

    def close(self) -> None:
        """The worker is done: :meth:`take` hands out what is left, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until every report sent so far is delivered (or the channel is
        hung up); whether they were."""
        with self._cond:
            target = self._sent
            return bool(self._cond.wait_for(lambda: self._delivered >= target or self._hung_up, timeout))

    # -------------------------------------------------------- the actor's end
    def put(self, raw: bytes) -> None:
        """A command (pickled) for the worker; dropped once the worker is done."""
        with self._cond:
            if not self._closed:
                self._commands.append(raw)
                self._cond.notify_all()

    def take(self, timeout: float) -> list[bytes] | None:
        """The reports (pickled) not yet handed out, waiting up to ``timeout``
        seconds for one; None once the worker is done and all are handed out.
        A call means its relay delivered those of the previous call."""
        with self._cond:
            self._delivered = self._handed
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._reports or self._closed or self._hung_up, timeout)
            if not self._reports and (self._closed or self._hung_up):
                return None
            batch = list(self._reports)
            self._reports.clear()
            self._handed += len(batch)
            return batch

    def hang_up(self) -> None:
        """The supervisor closed its connection: the worker reads EOF, its sends fail."""
        with self._cond:
            self._hung_up = True
            self._cond.notify_all()


class Relay:
    """The scheduler's side of one replica actor's connection (see the module docstring).

    Args:
        ray: the ``ray`` module, connected.
        actor: the actor (with ``command``, ``outbox`` and ``hang_up`` methods).
        name: names its threads.

    ``conn`` is the supervisor's connection.  :meth:`stop` ends the relay
    without waiting; :meth:`join` waits for its threads.
    """

    def __init__(self, ray, actor, name: str) -> None:
        self._ray, self._actor = ray, actor
        self.conn, self._end = Pipe(duplex=True)
        self._lock = threading.Lock()
        self._stopped = False
        self._threads = [threading.Thread(target=self._down, name=f"{name}-down", daemon=True),
                         threading.Thread(target=self._up, name=f"{name}-up", daemon=True)]
        for t in self._threads:
            t.start()

    def _down(self) -> None:
        """Commands from the supervisor to the actor, one call each, in order."""
        with self._relaying(self._threads[0].name):
            while True:
                raw = self._end.recv_bytes()
                self._ray.get(self._actor.command.remote(raw))

    def _up(self) -> None:
        """Reports from the actor to the supervisor, one long poll at a time."""
        with self._relaying(self._threads[1].name):
            while not self._stopped:
                batch = self._ray.get(self._actor.outbox.remote(OUTBOX_POLL_S))
                if batch is None:
                    break  # the worker ended and everything it sent is delivered
                for raw in batch:
                    self._end.send_bytes(raw)

    @contextlib.contextmanager
    def _relaying(self, name: str):
        """How a relay thread ends: the supervisor's side closed (the worker is
        hung up), the actor gone, or anything else (logged); the relay stops."""
        try:
            yield
        except (EOFError, OSError):
            if not self._stopped:  # the supervisor closed its connection
                self._call_quietly(self._actor.hang_up)
        except self._ray.exceptions.RayError as exc:
            log.debug("relay %s: the actor is gone (%s)", name, type(exc).__name__)
        except Exception:  # noqa: BLE001 - a relay must end, and the supervisor see EOF, whatever happened
            log.warning("relay %s failed", name, exc_info=True)
        finally:
            self.stop()

    def _call_quietly(self, method) -> None:
        try:
            self._ray.get(method.remote(), timeout=FLUSH_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the actor is gone: nothing left to tell it
            log.debug("could not reach the actor", exc_info=True)

    def stop(self) -> None:
        """Shut the relay's end down: the supervisor reads EOF, the threads end."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        try:
            # shutdown (not close) wakes the down thread's blocking read.
            with socket.socket(fileno=os.dup(self._end.fileno())) as s:
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed

    def join(self, timeout: float = _JOIN_S) -> bool:
        """Wait for the threads (after :meth:`stop`, or the actor's end); whether they ended.
        The relay's end of the pipe is closed once they have."""
        for t in self._threads:
            t.join(timeout)
        done = not any(t.is_alive() for t in self._threads)
        if done:
            self._end.close()
        return done

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)
