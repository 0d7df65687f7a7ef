"""One real run on a Ray cluster (:func:`run_ray_workload`): the local backend's
:func:`~pollux_opt.backends.local.run.run_workload` (run directory, lock, stop
signals, resume, summary) with the :class:`~pollux_opt.backends.ray.backend.RayBackend`.

``run_dir/ray.json`` records the run's checkpoint directory, so that a resumed
run finds its jobs' work directories.  The scheduler is the Ray driver: the
replica actors of its jobs are owned by it and end with it (killed or
stopped); a resumed run re-opens each unfinished job from its newest good
checkpoint, as on the local backend.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

from solvers import InvalidProblem

from pollux_opt.backends.local.run import DEFAULT_INTERVAL_S, run_workload
from pollux_opt.backends.ray.backend import RayBackend
from pollux_opt.backends.ray.nodes import RayNodes
from pollux_opt.extras import require
from pollux_opt.records.files import atomic_write_json
from pollux_opt.workloads.job import Workload

__all__ = ["RAY_CONFIG_FILE", "RAY_MISSING", "connect", "run_ray_workload"]

log = logging.getLogger(__name__)

#: The Ray run's own settings in its run directory.
RAY_CONFIG_FILE = "ray.json"
#: What to do where Ray is not installed.
RAY_MISSING = "the Ray backend needs Ray: pip install 'pollux-opt[ray]'"


def connect(address: str | None):
    """The ``ray`` module, connected to ``address`` (a running cluster, e.g.
    ``HOST:6379`` or ``auto``), or to a new local Ray instance if None; returns
    ``(ray, started)``, ``started`` true where this call connected (its caller
    disconnects).  Already connected: that connection is used.

    Raises:
        InvalidProblem: no cluster could be joined at ``address``, with the likely
            cause: its token authentication refused this machine, or no head answered.
    """
    ray = require("ray", RAY_MISSING)
    if ray.is_initialized():
        return ray, False
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except ConnectionError as exc:
        # Ray raises a traceback whose cause, where there is one, says why; a user
        # needs one line naming the address and what to set (see docs/ray.md).
        if _refused_token(exc, ray.exceptions.AuthenticationError):
            why = ("its token authentication refused this machine: set RAY_AUTH_MODE=token here as on "
                   "its nodes, with the cluster's token in ~/.ray/auth_token (or RAY_AUTH_TOKEN)")
        else:
            why = ("no Ray head answered: is it started (ray start --head) and reachable from here? "
                   "A cluster with token authentication also needs RAY_AUTH_MODE=token here")
        raise InvalidProblem(f"could not connect to the Ray cluster at address={address!r}: {why}") from None
    return ray, True


def _refused_token(exc: BaseException, auth_error: type) -> bool:
    """Whether ``exc`` was raised from Ray's ``auth_error`` (an exception of that
    type, or one carrying its traceback as text, as Ray's GCS client does)."""
    while exc is not None:
        if isinstance(exc, auth_error) or auth_error.__name__ in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _checkpoint_dir(run_dir: Path, checkpoint_dir: str | os.PathLike | None) -> str | None:
    """The run's checkpoint directory: the one recorded in ``ray.json`` (which a
    different ``checkpoint_dir`` may not contradict), else ``checkpoint_dir`` (recorded)."""
    import json

    path = run_dir / RAY_CONFIG_FILE
    given = None if checkpoint_dir is None else str(Path(checkpoint_dir).resolve())
    if path.exists():
        stored = json.loads(path.read_text()).get("checkpoint_dir")
        if given is not None and given != stored:
            raise InvalidProblem(f"run directory {str(run_dir)!r} keeps its checkpoints in {stored!r}, "
                                 f"not checkpoint_dir={given!r}")
        return stored
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"checkpoint_dir": given})
    return given


def run_ray_workload(
    run_dir: str | os.PathLike,
    workload: Workload | None = None,
    policy: str | None = None,
    *,
    address: str | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    interval: float = DEFAULT_INTERVAL_S,
    runtime_options: Mapping[str, Any] | None = None,
    progress: bool = True,
    backend_kwargs: Mapping[str, Any] | None = None,
    repair: bool = False,
) -> dict:
    """Run (or resume) one policy on one workload on a Ray cluster; return the summary.

    Args:
        run_dir, workload, policy, interval, runtime_options, progress, repair:
            as for :func:`~pollux_opt.backends.local.run.run_workload`.
        address: the Ray cluster (None: start a local Ray instance for the run).
        checkpoint_dir: a directory every Ray node sees at the same path (a
            shared file system), for the jobs' work directories; None: the run
            directory (enough where every node runs on this machine).
        backend_kwargs: extra keyword arguments of :class:`RayBackend` (tests).

    Raises:
        InvalidProblem: as :func:`run_workload`; also a Ray cluster without CPUs,
            or a ``checkpoint_dir`` other than the resumed run's.
        ImportError: Ray is not installed.
    """
    run_dir = Path(run_dir)
    ckpt = _checkpoint_dir(run_dir, checkpoint_dir)
    ray, started = connect(address)
    try:
        nodes = RayNodes(ray)
        cluster = nodes.cluster()
        if cluster is None:
            raise InvalidProblem(f"the Ray cluster at address={address!r} has no node with CPUs")
        kwargs = {"nodes": nodes, "checkpoint_dir": ckpt, **dict(backend_kwargs or {})}
        return run_workload(run_dir, workload, policy, cluster=cluster, interval=interval, pin_cpus=False,
                            runtime_options=runtime_options, progress=progress, backend_kwargs=kwargs,
                            repair=repair, backend_class=RayBackend)
    finally:
        if started:
            ray.shutdown()
