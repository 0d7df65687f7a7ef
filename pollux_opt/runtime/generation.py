"""One generation of a job's workers (:class:`Generation`): the workers launched
together on one allocation, the reports they send until every rank trains
(``RESUMED``) or has left (``PAUSED``), and which of them to blame when one is
lost.  The job's controller (:mod:`~pollux_opt.runtime.controller`) makes one
per launch and decides what each completed set of reports means for the job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pollux_opt.model import BatchConfig
from pollux_opt.runtime.allocation import WorkerAllocation
from pollux_opt.runtime.checkpoint import CheckpointInfo
from pollux_opt.runtime.device import collective_backend
from pollux_opt.runtime.pool import Worker, WorkerPool
from pollux_opt.runtime.protocol import ERROR, PAUSED, RESUMED, RUN, Assignment
from pollux_opt.runtime.report import RuntimeOptions

__all__ = ["FAULT_GRACE_S", "SURVIVOR_EXIT_S", "Generation"]

#: Seconds to wait, after workers exited reporting only failed collectives, for
#: the cause (a dead peer or a job error) to show before restarting anyway.
FAULT_GRACE_S = 2.0
#: Most seconds the other workers of a generation that lost one get to end by
#: themselves (their collectives fail at once; rank 0 then checkpoints its last
#: completed step, milliseconds for the built-in jobs) before they are killed.
SURVIVOR_EXIT_S = 5.0


@dataclass
class Generation:
    """One launch of a job's workers (written by the supervisor thread only).

    Attributes:
        number: the number its workers' reports carry (0: none launched yet).
        workers: its workers by rank (emptied once released or ended).
        kind: why it was launched: ``start``, ``rescale`` or ``restart``.
        t0: when the oldest request it serves was made (``time.monotonic``
            seconds): its start or rescale time counts from then.
        wall: when it was launched (Unix seconds).
        resume_from: the checkpoint it resumes from (None: from scratch).
        previous_pause: rank 0's ``PAUSED`` report of the generation a rescale replaces.
        pausing: it was asked to checkpoint and leave.
        resumed, paused: the ``RESUMED`` and ``PAUSED`` reports so far, by rank.
        collective_errors: reports of a failed collective, by rank.  A worker
            that dies is the cause of a fault; its peers then see their
            collectives fail and exit reporting that (symptoms).
    """

    number: int = 0
    workers: list[Worker] = field(default_factory=list)
    kind: str = "start"
    t0: float = 0.0
    wall: float = 0.0
    resume_from: CheckpointInfo | None = None
    previous_pause: dict | None = None
    pausing: bool = False
    resumed: dict[int, dict] = field(default_factory=dict)
    paused: dict[int, dict] = field(default_factory=dict)
    collective_errors: dict[int, dict] = field(default_factory=dict)
    #: When only symptoms were first seen (``time.monotonic`` seconds).
    first_symptom: float | None = None

    @classmethod
    def launch(cls, pool: WorkerPool, previous: Generation, alloc: WorkerAllocation, config: BatchConfig,
               kind: str, t0: float, resume_from: CheckpointInfo | None, *, job_id: str, spec_json: str,
               workdir: str, options: RuntimeOptions, params: dict | None) -> Generation:
        """The generation after ``previous`` on ``alloc``: the live workers of
        ``previous`` and new ones from ``pool``, each sent its
        :class:`~pollux_opt.runtime.protocol.Assignment` (the keywords: the
        fields every rank shares)."""
        gen = cls(previous.number + 1, pool.regroup(previous.workers, alloc, job_key=job_id), kind, t0,
                  time.time(), resume_from, previous.paused.get(0))
        store = pool.rendezvous(gen.workers, workdir, gen.number) if alloc.num_replicas > 1 else None
        rank_nodes, rank_gpus = alloc.rank_nodes(), alloc.rank_gpus()
        backend = collective_backend(rank_gpus)
        gpu_types = {(alloc.node_types or {}).get(n) for n, g in zip(rank_nodes, rank_gpus) if g is not None}
        mixed = len({g is None for g in rank_gpus}) > 1 or len(gpu_types) > 1
        for rank, w in enumerate(gen.workers):
            w.job_key = job_id
            a = Assignment(
                generation=gen.number, rank=rank, world=alloc.num_replicas, num_nodes=alloc.num_nodes,
                store_path=None if store is None else str(store),
                checkpoint_meta=None if resume_from is None else str(resume_from.meta_path),
                local_bsz=config.local_bsz, accum_steps=config.accum_steps,
                cpu=None if alloc.cpus is None else alloc.cpus[rank], node_type=alloc.node_type,
                cgroup=None if alloc.cgroups is None else alloc.cgroups[rank_nodes[rank]],
                gpu=rank_gpus[rank], backend=backend, mixed=mixed,
                job_id=job_id, spec_json=spec_json, workdir=workdir, options=options, params=params,
            )
            w.send(RUN, a)  # a worker gone is noticed as a lost worker
        return gen

    def take(self, rank: int, kind: str, info: dict) -> tuple[str, dict] | None:
        """What rank ``rank``'s report ``(kind, info)`` of an ``RESUMED``, ``PAUSED``
        or ``ERROR`` kind completes: ``(RESUMED, rank 0's report)`` once every
        rank trains, ``(PAUSED, rank 0's report)`` once every rank has left, or
        ``(ERROR, {"error": why, ...details})`` when the job must fail; None
        while nothing is complete (a failed collective is only a symptom)."""
        if kind == ERROR and info.get("collective"):
            self.collective_errors[info["rank"]] = info
        elif kind == ERROR:
            return ERROR, {"error": f"rank {info['rank']}: {info['error']}", "rank": info["rank"],
                           "traceback": info["traceback"]}
        elif kind in (RESUMED, PAUSED):
            reports = self.resumed if kind == RESUMED else self.paused
            reports[rank] = info
            if len(reports) < len(self.workers):
                return None
            checksums = {r["checksum"] for r in reports.values()}
            expected = None if kind == PAUSED or self.resume_from is None else self.resume_from.meta.get("checksum")
            if len(checksums) != 1 or (expected is not None and checksums != {expected}):
                return ERROR, {"error": f"workers {kind} with inconsistent parameters: {sorted(checksums)}"
                               + ("" if kind == PAUSED else f" vs checkpoint {expected}")}
            return kind, reports[0]
        return None

    def resumed_details(self, alloc: WorkerAllocation, config: BatchConfig, pids: tuple[int, ...],
                        seconds: float) -> dict:
        """Details of the event recording that every rank trains, ``seconds`` after the request."""
        info0, ranks = self.resumed[0], sorted(self.resumed)
        details = {
            "seconds": seconds, "step": info0["step"], "progress": info0["progress"], "checksum": info0["checksum"],
            "from_checkpoint": info0["from_checkpoint"], "placement": dict(alloc.placement),
            "num_replicas": alloc.num_replicas, "pids": list(pids), "config": [config.local_bsz, config.accum_steps],
            # Where the time went, per rank: waiting for the worker to take the
            # assignment (busy or still starting), building, joining the group, loading.
            "queue_s": [self.resumed[r]["received"] - self.wall for r in ranks],
            **{phase: [self.resumed[r][phase] for r in ranks] for phase in ("build_s", "group_s", "load_s")},
            "checkpoint_checksum": None if self.resume_from is None else self.resume_from.meta.get("checksum"),
        }
        if self.kind == "rescale" and self.previous_pause is not None:
            details["paused_step"] = self.previous_pause["step"]
            details["paused_checksum"] = self.previous_pause["checksum"]
        return details

    def lost(self) -> tuple[int, Worker] | None:
        """The (rank, worker) to blame for a fault, or None while no worker has
        exited (or only symptoms have, within :data:`FAULT_GRACE_S`)."""
        dead = [(rank, w) for rank, w in enumerate(self.workers) if not w.alive()]
        if not dead:
            return None
        causes = [(rank, w) for rank, w in dead if rank not in self.collective_errors]
        if not causes:
            now = time.monotonic()
            if self.first_symptom is None:
                self.first_symptom = now
            if now - self.first_symptom < FAULT_GRACE_S:
                return None
            causes = dead
        return causes[0]

    def await_survivors(self, lost_rank: int) -> None:
        """Wait up to :data:`SURVIVOR_EXIT_S` for the workers other than
        ``lost_rank`` to end by themselves."""
        deadline = time.monotonic() + SURVIVOR_EXIT_S
        for rank, w in enumerate(self.workers):
            if rank != lost_rank:
                w.join(max(deadline - time.monotonic(), 0.0))
