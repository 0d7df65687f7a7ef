"""The run directory of a real run, and its configuration::

    run_dir/config.json     policy, workload, cluster (node types, CPU quotas), interval, start time (written once)
    run_dir/events.jsonl    the event log (see pollux_opt.records.events)
    run_dir/summary.json    metrics (pollux_opt.records.metrics), written at the end
    run_dir/jobs/<id>/      each job's work directory (checkpoints, logs)
    run_dir/scheduler.lock  held by the running scheduler (:func:`hold_run_lock`)

``config.json`` is what makes a run resumable: a second run on the same
directory takes its configuration from it (the clock from its recorded start
time, so that JCTs include an outage) instead of from its arguments.

**One scheduler per run directory.**  :func:`hold_run_lock` holds an
exclusive ``fcntl.flock`` on ``scheduler.lock`` (holding the scheduler's pid)
for the whole run, so that two schedulers never interleave one event log.  The
kernel drops it when the holder ends, however it ends (SIGKILL included), so a
stale lock file never blocks a resume; the processes the run starts do not
inherit it (the pool's fork server is spawned fresh).  Without ``fcntl``
(Windows) no lock is taken.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from solvers import InvalidProblem

from pollux_opt.backends.local.nodes import default_cluster
from pollux_opt.model import Cluster, Node
from pollux_opt.model.cluster import DEFAULT_NODE_TYPE
from pollux_opt.model.domains import check
from pollux_opt.records.files import atomic_write_json
from pollux_opt.scheduling.loop import ROUND_INTERVAL
from pollux_opt.workloads.job import Workload

__all__ = [
    "CONFIG_FILE", "EVENTS_FILE", "LOCK_FILE", "SUMMARY_FILE", "cluster_from_json", "cluster_to_json",
    "hold_run_lock", "load_run_config", "open_run_config",
]

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
LOCK_FILE = "scheduler.lock"
EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"
#: Version of the ``config.json`` layout.
CONFIG_VERSION = 1
#: Keys a resumed run reads from its ``config.json``.
_CONFIG_KEYS = ("policy", "workload", "cluster", "interval_s")


def load_run_config(run_dir: str | os.PathLike) -> dict:
    """The ``config.json`` of a run directory."""
    from pollux_opt.model.validate import read_json

    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise InvalidProblem(f"run directory {str(run_dir)!r} has no {CONFIG_FILE}")
    cfg = read_json(path, "run config")
    missing = [k for k in _CONFIG_KEYS if not isinstance(cfg, dict) or k not in cfg]
    if missing:
        raise InvalidProblem(f"run config {str(path)!r} is incomplete: it lacks {missing} (it is written "
                             f"when a run starts; start the run in a new directory)")
    return cfg


def cluster_to_json(cluster: Cluster) -> list[dict]:
    """The cluster as ``[{"id": node id, "cpus": CPUs}, ...]``, with ``"type"`` on
    every node of a cluster described by node types."""
    if all(n.type == DEFAULT_NODE_TYPE for n in cluster.nodes):
        return [{"id": n.id, "cpus": n.cpus} for n in cluster.nodes]
    return [{"id": n.id, "cpus": n.cpus, "type": n.type} for n in cluster.nodes]


def cluster_from_json(data: list[dict]) -> Cluster:
    """Inverse of :func:`cluster_to_json`."""
    try:
        return Cluster(tuple(Node(str(n["id"]), n["cpus"], n.get("type", DEFAULT_NODE_TYPE)) for n in data))
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidProblem(f"bad cluster in run config: {data!r}") from exc


def open_run_config(
    run_dir: str | os.PathLike,
    workload: Workload | None,
    policy: str | None,
    *,
    cluster: Cluster | None,
    interval: float,
    pin_cpus: bool,
    runtime_options: Mapping[str, Any] | None,
    cpu_quota: Mapping[str, float] | None = None,
    open_queue: bool = False,
    gpu_types: Sequence[str] = (),
) -> tuple[dict, bool]:
    """The run's configuration and whether it resumes an earlier run.

    A directory with a ``config.json`` resumes: ``workload`` and ``policy``, if
    given, must match it.  Otherwise both are required (a service's run,
    ``open_queue``, has no workload: its ``"workload"`` is null) and a new
    ``config.json`` is written from the arguments (``cluster`` None: this
    machine, one node), stamped with the current Unix time as the run's start;
    ``cpu_quota`` (``{node type: fraction}`` of the throttled types) and
    ``gpu_types`` (the types whose slots are GPUs) only where there is one.

    Raises:
        InvalidProblem: a mismatch with the stored run (a service's state for a
            workload run or the other way round included), a new run without a
            workload or policy, an unknown policy, or a bad interval.
    """
    from pollux_opt.scheduling.policies import make_policy

    run_dir = Path(run_dir)
    if (run_dir / CONFIG_FILE).exists():
        cfg = load_run_config(run_dir)
        if open_queue != (cfg["workload"] is None):
            held, use = (("a workload run", "pollux-opt run --out") if cfg["workload"] is not None
                         else ("a service's state", "pollux-opt serve --state"))
            raise InvalidProblem(f"run directory {str(run_dir)!r} holds {held}; resume it with {use} "
                                 f"{str(run_dir)!r}, or use another directory")
        if policy is not None and policy != cfg["policy"]:
            raise InvalidProblem(f"run directory {str(run_dir)!r} holds a {cfg['policy']!r} run, not {policy!r}")
        if workload is not None and workload.to_json() != cfg["workload"]:
            raise InvalidProblem(f"run directory {str(run_dir)!r} holds a different workload "
                                 f"({cfg['workload']['name']!r}); use another directory")
        return cfg, True
    if (workload is None and not open_queue) or policy is None:
        raise InvalidProblem(f"run directory {str(run_dir)!r} is new: give a workload and a policy")
    make_policy(policy)  # an unknown name, or a policy that needs the simulator, is refused here
    if workload is not None:
        workload.check()  # unknown kinds, or a submitted batch no policy could run, before anything is written
    check("interval", interval, ROUND_INTERVAL)
    cluster = cluster or default_cluster()
    cfg = {
        "version": CONFIG_VERSION, "policy": policy, "workload": None if workload is None else workload.to_json(),
        "cluster": cluster_to_json(cluster), "interval_s": float(interval), "pin_cpus": bool(pin_cpus),
        "runtime_options": dict(runtime_options or {}), "started_unix": time.time(),
    }
    for name, listed in (("cpu_quota", cpu_quota or {}), ("gpu_types", gpu_types)):
        unknown = sorted(set(listed) - set(cluster.types))
        if unknown:
            raise InvalidProblem(f"{name} names node type {unknown[0]!r}, which the cluster lacks "
                                 f"(types: {list(cluster.types)})")
    if cpu_quota:
        cfg["cpu_quota"] = {t: float(q) for t, q in cpu_quota.items()}
    if gpu_types:
        cfg["gpu_types"] = list(gpu_types)
    atomic_write_json(run_dir / CONFIG_FILE, cfg)
    return cfg, False


@contextlib.contextmanager
def hold_run_lock(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold the run directory's lock for the duration of the ``with`` block (see the module docstring).

    Raises:
        InvalidProblem: another process holds it (a scheduler running on this directory).
    """
    path = Path(run_dir) / LOCK_FILE
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        log.warning("no fcntl here: run directory %s is not locked against a second scheduler", run_dir)
        yield path
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()  # the holder wrote its pid
            holder = f"process {holder}" if holder.isdigit() else "another process"
            raise InvalidProblem(
                f"run directory {str(run_dir)!r} is in use by another scheduler ({holder} holds "
                f"{LOCK_FILE}); wait for it to end, or stop it (Ctrl-C) and rerun, or use another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield path
    finally:
        os.close(fd)  # drops the lock (the file stays: removing it would race a new holder)
