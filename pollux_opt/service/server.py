"""``pollux-opt serve``: the scheduler as a long-running service.

:func:`serve` is a real run (:func:`pollux_opt.backends.local.run.run_workload`,
or its Ray twin) whose jobs come from an open queue instead of a workload
file: the same lock, scheduler loop, policies, backends, event log and
resume.  :class:`Service` adds what a service needs around that run:

* the queue: clients' submissions and requests in ``<state>/service.db``
  (:class:`~pollux_opt.service.db.OpenSource`);
* the index of the event log in the same database
  (:class:`~pollux_opt.service.db.EventIndex`), rebuilt from the log when the
  service starts and updated with every event the run writes;
* the HTTP API (:func:`pollux_opt.service.app.make_app`), served by uvicorn on
  a thread of its own while the scheduler loop runs in the main thread (which
  keeps the stop signals: the first SIGINT or SIGTERM checkpoints and stops
  the jobs, and the next ``serve`` on the same state directory resumes them).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Iterator, Mapping

from solvers import InvalidProblem

from pollux_opt.backends.local.handle import STOP_GRACE_S
from pollux_opt.backends.local.rundir import CONFIG_FILE
from pollux_opt.backends.local.run import DEFAULT_INTERVAL_S
from pollux_opt.extras import SERVICE_MISSING, require
from pollux_opt.model.domains import Integer, Real, check
from pollux_opt.service.client import DEFAULT_HOST, DEFAULT_PORT, token_in_file
from pollux_opt.service.db import DB_FILE, EventIndex, OpenSource, Store
from pollux_opt.workloads.job import Workload

__all__ = ["LOOPBACK_HOSTS", "Service", "port_taken", "serve"]

log = logging.getLogger(__name__)

#: Host names that reach this machine only.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
#: Seconds the HTTP server gets to start listening, and to finish its answers when the service stops.
HTTP_START_S, HTTP_STOP_S = 30.0, 5.0
#: The policy of a new service (a resumed one keeps its own).
DEFAULT_POLICY = "pollux"
_PORT = Integer(ge=1, le=65535)
_GRACE = Real(ge=0, unit="seconds")


def port_taken(host: str, port: int) -> bool:
    """True if something listens on ``host:port`` already (a server could not bind it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class Service:
    """The service around one run (see the module docstring): what
    ``run_workload(service=...)`` calls to attach its queue and index, and to
    serve the API while its loop runs.

    ``open_queue``: the run's jobs come from the API's submissions (``pollux-opt
    serve``); otherwise from the run's workload, and the API and dashboard only
    watch it (``pollux-opt demo``): submissions and requests are refused.
    """

    def __init__(self, *, host: str, port: int, token: str | None, open_queue: bool = True) -> None:
        self.host, self.port, self.token, self.open_queue = host, port, token, open_queue
        self.store: Store | None = None
        self.index: EventIndex | None = None
        self.source: OpenSource | None = None
        self.url = f"http://{host}:{port}"

    def attach(self, run_dir: Path, cfg: Mapping, history: list[dict]):
        """Open the database of ``run_dir``, rebuild its index from ``history``
        (the whole event log) and return the source the backend takes its jobs
        from: the open queue, or the run's workload."""
        path = Path(run_dir) / DB_FILE
        self.run_dir, self.cluster = Path(run_dir), list(cfg["cluster"])
        self.store = Store(path)
        self.index = EventIndex(path, cfg["started_unix"])
        self.index.rebuild(history)
        if not self.open_queue:
            return Workload.from_json(cfg["workload"])
        self.source = OpenSource(path, cfg["started_unix"])
        return self.source

    def index_event(self, event: dict) -> None:
        """Fold an event the run just wrote into the index."""
        self.index.apply(event)

    def close(self) -> None:
        """Close the database (once the run has written its last event)."""
        for part in (self.source, self.index, self.store):
            if part is not None:
                part.close()

    @contextlib.contextmanager
    def serving(self, backend) -> Iterator[None]:
        """Serve the HTTP API for the ``with`` block (``backend``: the run's, for
        its jobs' work directories)."""
        uvicorn = require("uvicorn", SERVICE_MISSING)
        from pollux_opt.service.app import make_app

        app = make_app(self.store, state_dir=self.run_dir, cluster=self.cluster, workdir=backend.job_dir,
                       token=self.token, notify=self.source.notify if self.source is not None else None)
        # Open streams (a followed log, the event stream) end with the server rather than hold it up.
        config = uvicorn.Config(app, host=self.host, port=self.port, lifespan="off", access_log=False,
                                log_level="warning", log_config=None, timeout_graceful_shutdown=HTTP_STOP_S / 2)
        server = uvicorn.Server(config)
        # What is loaded by now (libraries, the rebuilt index) lives as long as the service: kept out of the
        # collector's full passes, which otherwise stop every thread, the API's answers included, for tens of
        # milliseconds each (70-80 ms on a 2-vCPU machine during a burst of submissions; 12-26 ms once frozen).
        gc.collect()
        gc.freeze()
        thread = threading.Thread(target=server.run, name="pollux-http", daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + HTTP_START_S
            while not server.started and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            if not server.started:
                raise InvalidProblem(f"could not serve on {self.url}: is the port in use by another program? "
                                     f"(choose another with --port)")
            log.warning("pollux-opt serving on %s (state in %s)", self.url, self.run_dir)
            yield
        finally:
            server.should_exit = True
            thread.join(HTTP_STOP_S)
            gc.unfreeze()  # back to the collector: a demo serves one run after another in one process


def serve(
    state_dir: str | os.PathLike,
    *,
    backend: str = "local",
    ray_address: str | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    cluster=None,
    policy: str | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token_file: str | os.PathLike | None = None,
    cancel_grace_s: float = STOP_GRACE_S,
    progress: bool = False,
    backend_kwargs: Mapping | None = None,
    autoscale=None,
    node_cpus: int | None = None,
) -> None:
    """Run the scheduler as a service on ``state_dir`` until a stop signal (see the module docstring).

    Args:
        state_dir: the service's state (database, event log, jobs' work
            directories); one service per directory (its lock), and a new
            service on a directory resumes the one before.
        backend: ``"local"`` (this machine's CPUs) or ``"ray"`` (a Ray cluster's
            nodes at ``ray_address``; ``checkpoint_dir`` as for ``run --backend ray``).
        cluster: this machine's nodes (as for ``run_workload``; local only).
        policy: the scheduling policy of a new state directory (default
            ``pollux``); a resumed one keeps its own.
        interval: seconds between scheduling rounds (a submission or a job's
            end also starts one).
        host, port: where the HTTP API listens; a host other than this
            machine's loopback needs ``token_file``.
        token_file: a file holding the bearer token every request but ``/healthz`` must carry.
        cancel_grace_s: seconds a cancelled job gets to checkpoint before it is ended.
        progress: show the run's live progress table.
        autoscale, node_cpus: with backend ``"ray"``, size the Ray cluster with
            its autoscaler (as for :func:`~pollux_opt.backends.ray.run_ray_workload`).
        backend_kwargs: extra keyword arguments of the backend (tests).

    Raises:
        InvalidProblem: a bad argument, a state directory in use or holding a
            workload run, or a port that cannot be served.
        RunInterrupted: a stop signal stopped the service after checkpointing its jobs.
    """
    require("fastapi", SERVICE_MISSING)
    require("uvicorn", SERVICE_MISSING)
    check("port", port, _PORT)
    check("cancel_grace_s", cancel_grace_s, _GRACE)
    token = None if token_file is None else token_in_file(token_file)
    if host not in LOOPBACK_HOSTS and token is None:
        raise InvalidProblem(f"host {host!r} is reachable from other machines: give --token-file (a file holding "
                             f"the bearer token clients must send), or serve on {DEFAULT_HOST}")
    state_dir = Path(state_dir)
    if policy is None and not (state_dir / CONFIG_FILE).exists():
        policy = DEFAULT_POLICY
    service = Service(host=host, port=port, token=token)
    kwargs = {"cancel_grace_s": float(cancel_grace_s), **dict(backend_kwargs or {})}
    if backend == "ray":
        from pollux_opt.backends.ray import run_ray_workload

        if cluster is not None:
            raise InvalidProblem("cluster does not apply with backend 'ray': the cluster is Ray's nodes")
        run_ray_workload(state_dir, None, policy, address=ray_address, checkpoint_dir=checkpoint_dir,
                         interval=interval, progress=progress, backend_kwargs=kwargs, service=service,
                         autoscale=autoscale, node_cpus=node_cpus)
    elif backend == "local":
        from pollux_opt.backends.local import run_workload

        if ray_address is not None or checkpoint_dir is not None or autoscale is not None:
            raise InvalidProblem("ray_address, checkpoint_dir and autoscale need backend 'ray'")
        run_workload(state_dir, None, policy, cluster=cluster, interval=interval, progress=progress,
                     backend_kwargs=kwargs, service=service)
    else:
        raise InvalidProblem(f"backend must be 'local' or 'ray', got {backend!r}")
