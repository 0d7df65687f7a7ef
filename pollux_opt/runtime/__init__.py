"""Elastic training-job runtime: real torch jobs on CPU cores that change their
number of workers and their batch size without losing progress (the job side of
Pollux's executor, the "PolluxAgent"; AdaptDL ships the same as a library).

torch is imported lazily: this package imports without it, and starting a job
without it raises ImportError with ``pip install 'pollux-opt[jobs]'``.

Control surface for a scheduler
===============================

One :class:`ElasticJob` handle per job; every method returns at once (a
supervisor thread per job does the work), so one scheduler thread can drive
many jobs::

    pool = WorkerPool(spares=2)                     # warm workers shared by all jobs
    job = ElasticJob("digits-cnn", "runs/j1", pool=pool)   # or a JobSpec
    job.start(1)                                    # K=1 replica on 1 node
    job.rescale({"n0": 2})                          # placement {node: replicas}
    r = job.report()                                # JobReport snapshot, never blocks
    r.state, r.progress, r.num_replicas, r.batch_size, r.restart_delay
    model = r.goodput_model()                       # GoodputModel or None (no data yet)
    model.speedup(num_nodes, num_replicas)          # what the allocator maximises
    job.stop(); job.wait(); job.close(); pool.close()

Signatures:

* ``ElasticJob(spec: JobSpec | str, workdir, *, job_id=None, options=None, pool=None)``
* ``ElasticJob.from_workdir(workdir, *, pool=None) -> ElasticJob`` (resume after
  a scheduler restart: everything lives in the work directory)
* ``start(replicas: int | {node: int} = 1, num_nodes=None, *, cpus=None, local_bsz=None, accum_steps=None)``
* ``rescale(replicas, num_nodes=None, *, cpus=None, local_bsz=None, accum_steps=None)``
  (``local_bsz``/``accum_steps``: a user's own batch, e.g. to profile it; the
  same placement and CPUs with another one switch the batch without a restart)
* ``stop()``, ``cancel()``, ``close()``, ``poll() -> JobState``, ``report() -> JobReport``,
  ``wait(timeout=None, until=None) -> JobReport``, ``step_log() -> pandas.DataFrame``
* ``WorkerPool(spares=1, *, max_idle=None, start_method=None)`` with
  ``warm(count)``, ``prepare(job_key, spec_json, workdir)``, ``close()``
  (forkserver by default: workers fork from a server that imported torch once)
* ``profile_throughput(spec, configs, *, steps, rounds, workdir, pool) -> Measurements``
  and ``heldout_error(measurements, train_mask)`` (in :mod:`pollux_opt.runtime`)
* ``JobSpec(name, builder, init_batch_size, max_batch_size, target=None, epochs=None,
  progress_target=None, ...)`` (at least one completion criterion),
  ``register_job(spec)``, ``training_job(**fields)`` (decorator), ``get_job(name)``,
  ``job_names()``; builders return :class:`JobParts`
* a user's own training loop instead of a builder: :mod:`pollux_opt.elastic`
  (``ElasticDataLoader``, ``ElasticDataParallel``, ``remaining_epochs_until``),
  named by an entry (:mod:`~pollux_opt.runtime.entry`, ``docs/user-jobs.md``)
* ``declare_builder_modules(modules)``: let workload files and resumed
  ``job.json`` files name builders of these modules (what a file may run: the
  trust model of :mod:`pollux_opt.runtime.spec`)
* ``RuntimeOptions(fixed_batch_size=None, checkpoint_interval_s=10, ...)``:
  ``fixed_batch_size`` is the "fixed" mode (user's total batch, no
  adaptation) needed by the throughput-only and fixed baseline policies.

States (:class:`JobState`, with its one table of legal changes, in
:mod:`pollux_opt.lifecycle`): ``queued`` -> ``rescaling`` (acquiring
workers, loading the checkpoint) -> ``running`` <-> ``rescaling``; once the
target is reached the job stays ``running`` while its final checkpoint is
re-evaluated in a fresh process forked from the pool's fork server (holding
no core of the job), then ``succeeded``.  ``queued`` again after ``stop()``
or a step limit (resume with ``start``); ``cancelled`` after ``cancel()``;
``failed`` with ``report().error`` when job code raises, its loss diverges
(:mod:`~pollux_opt.runtime.divergence`) or faults exceed ``max_restarts``.
A job holds cores while ``running`` or ``rescaling``
(``JobState.holds_workers``), except while verifying (an empty
``report().placement``).

What a job does
===============

Modules: :mod:`~pollux_opt.runtime.job` (the handle),
:mod:`~pollux_opt.runtime.controller` and :mod:`~pollux_opt.runtime.intake`
(its supervisor thread),
:mod:`~pollux_opt.runtime.status`, :mod:`~pollux_opt.runtime.journal`,
:mod:`~pollux_opt.runtime.protocol` (the messages between them),
:mod:`~pollux_opt.runtime.worker`, :mod:`~pollux_opt.runtime.trainer` and :mod:`~pollux_opt.runtime.state` (the
worker processes; :mod:`~pollux_opt.runtime.user_loop` and
:mod:`~pollux_opt.runtime.elastic_data` for a user's loop),
:mod:`~pollux_opt.runtime.divergence` (the divergence rule); the job agent
they run, shared with the simulator, is :mod:`pollux_opt.agent`.

* K replicas = K worker processes, one thread each, all-reducing
  gradients with ``torch.distributed`` (gloo); "nodes" are logical (recorded for
  the throughput model's inter-node terms).  Workers are kept warm in a
  :class:`WorkerPool` with torch imported and, for the job they last served,
  model and data built; a rescale keeps the surviving workers.
* Each step records compute and sync seconds, and unbiased estimates of
  |G|^2 and of the gradient variance at M0 from the per-replica (and
  per-micro-batch) gradients, smoothed; with one replica the local batch runs
  as two micro-batches (see :mod:`~pollux_opt.agent.stats` and
  :func:`~pollux_opt.agent.batch.choose_batch`).
* Progress is counted in M0-equivalent iterations (sum of AdaScale gains).
* The job agent (:class:`~pollux_opt.agent.agent.JobAgent`, shared with the
  simulator) fits :class:`ThroughputParams` online to the job's own step times
  (priors until data exist).  The job picks local batch and accumulation
  with its :class:`GoodputModel` for the current allocation, and re-picks
  them as measurements arrive (:func:`~pollux_opt.agent.batch.choose_batch`;
  a scheduler decides only where and on how many replicas).  The learning rate
  follows the job's rule (AdaScale for SGD, square root for Adam).
* Rescale = finish the step, atomic checkpoint (temp, fsync, rename, with a
  SHA-256 checked on load and fallback to the previous good one), re-form the
  group, resume; its wall time is measured and reported as the restart delay.
* A killed worker makes the job restart from its newest good checkpoint
  (event ``worker_lost`` then ``restarted``): for a killed peer of rank 0 that
  is the last completed step, which rank 0 checkpoints when its collective
  fails; a killed rank 0 repeats the steps since its previous checkpoint (at
  most ``checkpoint_interval_s`` of training).  A raising job fails with the
  error, peers are ended rather than left blocked.  Pool processes ignore
  SIGINT and end themselves once their scheduler is gone
  (:mod:`~pollux_opt.runtime.lifeline`).

Work directory layout (everything a job writes)::

    job.json            spec, options, job id
    state.json          state (a JobState value), verifying (true while the final
                        checkpoint is checked), rescale times, restarts, final metric (atomic)
    events.jsonl        one JSON event per line
    steps.csv           per-step measurements of rank 0
    verification.json   result of the fresh-process evaluation
    checkpoints/        ckpt-<step>.pt + ckpt-<step>.json
    logs/               worker-rank<r>.log, verify.log
    rendezvous/         gloo FileStore files
"""

from __future__ import annotations

from pollux_opt.lifecycle import JobState
from pollux_opt.runtime.job import ElasticJob
from pollux_opt.runtime.pool import WorkerPool
from pollux_opt.runtime.profiling import heldout_error, profile_throughput
from pollux_opt.runtime.entry import get_job, job_names, register_job, training_job
from pollux_opt.runtime.report import Event, JobReport, Measurements, RuntimeOptions
from pollux_opt.runtime.spec import LR_SCALING_RULES, BuildContext, JobParts, JobSpec
from pollux_opt.runtime.spec import declare_builder_modules
from pollux_opt.runtime.lazy_torch import TORCH_MISSING

__all__ = [
    "LR_SCALING_RULES",
    "TORCH_MISSING",
    "BuildContext",
    "ElasticJob",
    "Event",
    "JobParts",
    "JobReport",
    "JobSpec",
    "JobState",
    "Measurements",
    "RuntimeOptions",
    "WorkerPool",
    "declare_builder_modules",
    "get_job",
    "heldout_error",
    "job_names",
    "profile_throughput",
    "register_job",
    "training_job",
]
