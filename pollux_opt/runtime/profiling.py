"""Measure a job's step times on chosen configurations, and score a throughput fit.

Used by the experiments (held-out MAPE of the throughput model, as Pollux
reports in section 5) and by the tests.  The job trains for real while it is
measured; its target is disabled so that it never completes mid-profile.
"""

from __future__ import annotations

import math
import os
import pickle
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from solvers import InvalidProblem

from pollux_opt.lifecycle import JobState
from pollux_opt.model import ThroughputParams, step_time
from pollux_opt.model.domains import Integer, check
from pollux_opt.records.files import safe_name
from pollux_opt.runtime.job import ElasticJob
from pollux_opt.agent.measurements import ConfigKey
from pollux_opt.runtime.pool import WorkerPool
from pollux_opt.runtime.report import Measurements, RuntimeOptions
from pollux_opt.runtime.spec import JobSpec

__all__ = ["heldout_error", "profile_throughput", "serve_in_process"]

#: A target no metric reaches (profiling must not complete the job).
_UNREACHABLE = 1e300
#: Measured steps per configuration and pass, and passes over the configurations.
_REPEATS = Integer(ge=1)


def profile_throughput(
    spec: JobSpec,
    configs: Sequence[tuple[int, int, int]],
    *,
    steps: int = 20,
    rounds: int = 1,
    workdir: str | Path | None = None,
    pool: WorkerPool | None = None,
    timeout_s: float = 120.0,
    gpus: Sequence[int] | None = None,
) -> Measurements:
    """Run ``spec`` on each ``(num_replicas, local_bsz, accum_steps)`` in turn, one
    node, ``steps`` measured steps (after warm-up) per visit, for ``rounds``
    passes over all configurations.

    Several short passes rather than one long one spread each configuration's
    steps over time, so that a burst of load from other processes stretches a
    few steps of every configuration (which the median ignores) instead of all
    steps of one.

    Args:
        spec: the job to measure (its target and evaluation are disabled).
        configs: configurations to measure, in order (changing K rescales).
        steps: measured steps per configuration and pass (>= 1);
            ``steps * rounds`` should not exceed the profile window (64).
        rounds: passes over ``configs`` (>= 1).
        workdir: where the profiling job lives (a temporary directory if None).
        pool: a shared :class:`WorkerPool`, or None for a private one.
        timeout_s: limit per configuration, seconds.
        gpus: the GPUs the replicas run on, replica ``i`` on ``gpus[i]`` (as
            torch numbers them); None: CPU cores.

    The replicas are not pinned to CPUs: on 2 cores a pinned replica cannot
    leave the core the measuring process is on (pinned, ratings-mf's held-out
    MAPE was 10.6-25.8 % in three runs, unpinned 4.4 % and 7.7 %).

    Returns:
        The measurements of the requested configurations (one row each).
    """
    if not configs:
        raise InvalidProblem("configs must list at least one (num_replicas, local_bsz, accum_steps)")
    if gpus is not None and max(k for k, _, _ in configs) > len(gpus):
        raise InvalidProblem(f"gpus must list a GPU for each replica of the largest configuration "
                             f"({max(k for k, _, _ in configs)}), got {list(gpus)!r}")
    steps = check("steps", steps, _REPEATS)
    rounds = check("rounds", rounds, _REPEATS)
    probe = spec.replace(
        target=_UNREACHABLE if spec.higher_is_better else -_UNREACHABLE, eval_every=_UNREACHABLE
    )
    options = RuntimeOptions(checkpoint_interval_s=3600.0, adapt_interval_s=3600.0, warmup_steps=2)
    with tempfile.TemporaryDirectory(prefix="pollux-profile-") as tmp:
        job = ElasticJob(probe, Path(workdir) if workdir is not None else Path(tmp) / safe_name("spec.name", spec.name),
                         options=options, pool=pool)
        try:
            visits = [(r, cfg) for r in range(1, rounds + 1) for cfg in configs]
            for i, (r, (k, m, s)) in enumerate(visits):
                key = ConfigKey(1, k, m, s)
                (job.rescale if i else job.start)(k, local_bsz=m, accum_steps=s,
                                                  gpus=None if gpus is None else list(gpus[:k]))
                done = job.wait(
                    timeout=timeout_s,
                    until=lambda rep, key=key, n=r * steps: rep.measurements.count_of(key) >= n
                    or rep.state is JobState.FAILED,
                )
                if done.state is JobState.FAILED:
                    raise RuntimeError(f"profiling job failed: {done.error}")
            job.stop()
            job.wait(timeout=timeout_s)
            rows = job.report().measurements
        finally:
            job.close()
    wanted = {(k, m, s) for k, m, s in configs}
    keep = np.array([(int(k), int(m), int(s)) in wanted for k, m, s in
                     zip(rows.num_replicas, rows.local_bsz, rows.accum_steps)], dtype=bool)
    return rows.take(keep)


def heldout_error(rows: Measurements, train: np.ndarray) -> tuple[ThroughputParams, np.ndarray, float]:
    """Fit the throughput model on ``rows[train]`` and predict the others.

    Args:
        rows: measured configurations.
        train: bool mask over rows, the fitting set (the rest is held out).

    Returns:
        (fitted params, predicted step times of the held-out rows in seconds,
        mean absolute percentage error on them in percent).
    """
    train = np.asarray(train, dtype=bool)
    if train.shape != (len(rows),) or train.all() or not train.any():
        raise InvalidProblem(f"train must be a bool mask of length {len(rows)} with both kinds, got {train!r}")
    params = rows.take(train).fit()
    test = rows.take(~train)
    predicted = step_time(params, test.num_nodes, test.num_replicas, test.local_bsz, test.accum_steps)
    measured = test.step_time
    mape = float(np.mean(np.abs(predicted - measured) / measured) * 100.0)
    return params, predicted, mape if math.isfinite(mape) else math.inf


def serve_in_process(spec: JobSpec, workdir: str | Path, *, local_bsz: int, accum_steps: int = 0,
                     options: RuntimeOptions | None = None, checkpoint: str | None = None,
                     generation: int = 1) -> list[tuple[str, dict]]:
    """Run one assignment of ``spec`` on one replica in this process: the worker's
    own :func:`~pollux_opt.runtime.worker.serve_assignment`, without a worker
    process, controller or pool (for tests and overhead measurements); no
    command reaches it.

    Args:
        spec: the job (builder protocol or a user's loop).
        workdir: its work directory (created).
        local_bsz, accum_steps: the batch configuration.
        options: e.g. a ``step_limit`` (default options otherwise).
        checkpoint: metadata path of the checkpoint to resume from (a
            ``"checkpoint"`` message's ``meta_path``), or None.
        generation: the assignment's generation.

    Returns:
        The worker's messages ``(kind, info)`` in order (``"resumed"``,
        ``"metrics"`` with the step rows, ``"checkpoint"``, ``"paused"``).

    Raises:
        whatever the job raises (the worker would report it as ``"error"``).
    """
    from pollux_opt.extras import TORCH_MISSING, require
    from pollux_opt.runtime.protocol import Assignment
    from pollux_opt.runtime.worker import PartsCache, serve_assignment

    torch = require("torch", TORCH_MISSING)
    import torch.distributed as dist

    messages: list[tuple[str, dict]] = []
    # Each message pickled and unpickled when it is sent, as a pipe delivers it.
    conn = SimpleNamespace(send=lambda message: messages.append(pickle.loads(pickle.dumps(message))),
                           poll=lambda: False)
    a = Assignment(job_id=Path(workdir).name, spec_json=spec.to_json(), workdir=str(Path(workdir).resolve()),
                   generation=generation, rank=0, world=1, num_nodes=1, store_path=None,
                   checkpoint_meta=checkpoint, local_bsz=local_bsz, accum_steps=accum_steps,
                   options=options or RuntimeOptions())
    serve_assignment(conn, a, PartsCache(), torch, dist, os.sched_getaffinity(0))
    return messages
