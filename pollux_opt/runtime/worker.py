"""Worker processes: one per replica, one CPU thread each, kept warm between assignments.

A worker (:func:`worker_main`) imports torch once, then serves *assignments*
from its controller (the messages of :mod:`~pollux_opt.runtime.protocol`):
build (or reuse) the job's parts on the replica's device (a CPU core, or the
one GPU the process is bound to: :mod:`~pollux_opt.runtime.device`), join a
process group of ``world`` workers (NCCL where every replica has a GPU, else
gloo), load the checkpoint, train (:mod:`~pollux_opt.runtime.trainer`) until
told to stop or until the target or step limit, checkpoint, leave the group
and wait for the next assignment.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import random
import time
import traceback
from datetime import timedelta
from pathlib import Path

from pollux_opt.runtime.checkpoint import WriterLock, list_checkpoints, load_payload
from pollux_opt.runtime.device import GpuBinding, broadcast_from_rank0
from pollux_opt.runtime.entry import LOOP, entry_protocol
from pollux_opt.runtime.lifeline import ORPHAN_GRACE_S, Lifeline, ProcessIdentity
from pollux_opt.extras import TORCH_MISSING, require
from pollux_opt.runtime.protocol import (
    ERROR, EXIT, PAUSED, PREPARE, RESUMED, RUN, STOP_PARENT, STOP_REASONS, TCP_STORE_PREFIX, Assignment,
    CollectiveError, collective, send,
)
from pollux_opt.runtime.spec import BuildContext, JobParts, JobSpec, resolve_builder
from pollux_opt.runtime.state import TrainingState, param_checksum, restore_rng
from pollux_opt.runtime.trainer import Trainer
from pollux_opt.runtime.user_loop import UserLoop, run_user_loop

__all__ = ["WRITER_WAIT_S", "PartsCache", "error_report", "prepare_parts", "serve_assignment", "worker_main",
           "worker_setup"]

logger = logging.getLogger("pollux_opt.runtime.worker")

#: Most seconds rank 0 (and a controller choosing a checkpoint) waits for a
#: previous writer of the job's checkpoints to let go: a rank 0 orphaned by a
#: killed scheduler ends within ORPHAN_GRACE_S (and a poll); twice that is a margin.
WRITER_WAIT_S = 2 * ORPHAN_GRACE_S
#: The network interface gloo binds its sockets to: Linux's loopback, so that a
#: job's collectives listen on 127.0.0.1 only and never on a reachable address
#: (all of a job's workers run on this machine).  Set whatever the environment says.
GLOO_INTERFACE = "lo"
class PartsCache:
    """The parts built for the last job this worker served (reused on rescale)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.parts: JobParts | None = None
        self.base_lrs: list[float] = []

    def get(self, key: tuple, spec: JobSpec, workdir: Path, torch, reuse: bool) -> tuple[JobParts, list[float]]:
        if reuse and self.key == key and self.parts is not None:
            return self.parts, self.base_lrs
        self.key = self.parts = None
        torch.manual_seed(spec.seed)
        random.seed(spec.seed)
        build = resolve_builder(spec.builder, spec.import_dir)
        parts = build(BuildContext(seed=spec.seed, config=dict(spec.config), workdir=workdir))
        if not isinstance(parts, JobParts):
            raise TypeError(f"builder {spec.builder!r} must return JobParts, got {type(parts).__name__}")
        parts.check(spec.builder)
        self.base_lrs = [float(group["lr"]) for group in parts.optimizer.param_groups]
        self.key, self.parts = key, parts
        return parts, self.base_lrs


class _Launch:
    """One assignment being set up and trained: the timings its "resumed" report gives."""

    def __init__(self, conn, a: Assignment, torch, dist, received: float, device) -> None:
        self.conn, self.a, self.torch, self.dist, self.received = conn, a, torch, dist, received
        self.device = device
        self.spec = JobSpec.from_json(a.spec_json)
        self.info = None  # the checkpoint to resume from (None: a fresh start)
        if a.checkpoint_meta is not None:
            wanted = Path(a.checkpoint_meta)
            self.info = next((c for c in list_checkpoints(wanted.parent) if c.meta_path == wanted), None)
            if self.info is None:
                raise FileNotFoundError(f"checkpoint metadata {wanted} is missing")
        self.t_build = self.t_group = 0.0

    def join_group(self) -> None:
        a, dist = self.a, self.dist
        t = time.perf_counter()
        if a.world > 1:
            store = rendezvous_store(dist, a)
            collective(
                dist.init_process_group, a.backend, store=store, rank=a.rank, world_size=a.world,
                timeout=timedelta(seconds=a.options.collective_timeout_s),
            )
        self.t_group = time.perf_counter() - t

    def trainer(self, parts: JobParts, base_lrs, extra: dict | None = None) -> Trainer:
        """Load the checkpoint into ``parts`` and the ``extra`` objects (by name;
        a fresh start: every rank takes rank 0's parameters), make the trainer,
        wait for every rank and report "resumed"."""
        a, torch, info = self.a, self.torch, self.info
        t = time.perf_counter()
        if info is None:
            if a.world > 1:
                with torch.no_grad():
                    for tensor in list(parts.model.parameters()) + list(parts.model.buffers()):
                        broadcast_from_rank0(self.dist, tensor, a.backend, collective)
            state = TrainingState(next_eval=self.spec.eval_every)
        else:
            state = load_state(torch, parts, load_payload(info), extra)
        if a.params is not None:
            state.params = a.params
        t_load = time.perf_counter() - t
        trainer = Trainer(torch, self.dist, self.conn, a, self.spec, parts, base_lrs, state, extra, self.device)
        if a.world > 1:
            collective(self.dist.barrier)
        trainer.send_report(RESUMED, checksum=param_checksum(parts.model), pid=os.getpid(),
                            from_checkpoint=None if self.info is None else self.info.step,
                            train_size=parts.train_size, build_s=self.t_build, group_s=self.t_group, load_s=t_load,
                            received=self.received)
        return trainer

    def train(self, cache: PartsCache, saving) -> tuple[int, Trainer]:
        """Build (or reuse) the parts and train them, or run a user's own loop
        (:mod:`~pollux_opt.runtime.user_loop`); returns ``(stop code, trainer)``.
        ``saving``: the context of the training itself (rank 0 checkpoints on
        its way out, also when orphaned)."""
        a, spec, torch = self.a, self.spec, self.torch
        fn = resolve_builder(spec.builder, spec.import_dir)
        if entry_protocol(fn) != LOOP:
            t0 = time.perf_counter()
            parts, base_lrs = cache.get((a.job_id, a.workdir, a.spec_json), spec, Path(a.workdir), torch,
                                        reuse=self.info is not None)
            parts.model.to(self.device)  # in place: the optimizer keeps its parameters
            self.t_build = time.perf_counter() - t0
            self.join_group()
            trainer = self.trainer(parts, base_lrs)
            with saving:
                return trainer.run(), trainer
        self.join_group()
        t0 = time.perf_counter()

        def attach(user_loop, parts, extra):
            self.t_build = time.perf_counter() - t0  # the user's setup until the wrapper
            return self.trainer(parts, None, extra)

        user_loop = UserLoop(spec, a.rank, a.world, attach, self.device)
        torch.manual_seed(spec.seed)
        random.seed(spec.seed)
        with saving:
            return run_user_loop(user_loop, fn), user_loop.trainer


def serve_assignment(conn, a: Assignment, cache: PartsCache, torch, dist, all_cpus,
                     lifeline: Lifeline | None = None, gpus: GpuBinding | None = None) -> bool:
    """Run one assignment; returns False if the controller is gone.  ``lifeline``:
    the pool process's, which gives an orphaned rank 0 its grace to checkpoint;
    ``gpus``: the process's GPU binding (one per process)."""
    received = time.time()
    workdir = Path(a.workdir)
    log_dir = workdir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"worker-rank{a.rank}.log"
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(process)d gen{a.generation} %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    writer = WriterLock(workdir)
    # The job's own prints go to the same log (appended, a line at a time), so
    # that its output is kept per job and rank across rescales and restarts.
    prints = contextlib.ExitStack()
    out = prints.enter_context(open(log_path, "a", buffering=1, encoding="utf-8", errors="replace"))
    prints.enter_context(contextlib.redirect_stdout(out))
    prints.enter_context(contextlib.redirect_stderr(out))
    try:
        if a.rank == 0 and not writer.acquire(WRITER_WAIT_S):
            logger.warning("another process still holds %s; writing checkpoints without it", writer.path)
        try:
            os.sched_setaffinity(0, {a.cpu} if a.cpu is not None else all_cpus)
        except (AttributeError, OSError, ValueError):  # pragma: no cover - non-Linux or bad cpu id
            logger.warning("could not set CPU affinity to %s", a.cpu)
        if a.cgroup is not None:
            # Into its node's CPU quota (all threads); an OSError fails the
            # assignment: a replica of a throttled node must not train unthrottled.
            Path(a.cgroup, "cgroup.procs").write_text(str(os.getpid()))
        saving = lifeline.saving_state() if lifeline is not None and a.rank == 0 else contextlib.nullcontext()
        device = (gpus or GpuBinding()).device(torch, a.gpu)
        code, trainer = _Launch(conn, a, torch, dist, received, device).train(cache, saving)
        writer.release()  # before PAUSED: the controller may launch the next writer then
        checksum = param_checksum(trainer.parts.model)
        if a.world > 1:
            dist.destroy_process_group()
        logger.info("paused at step %d (%s)", trainer.state.step, STOP_REASONS.get(code, code))
        trainer.send_report(PAUSED, reason=STOP_REASONS.get(code, code), checksum=checksum,
                            metric=trainer.state.metric)
        return code != STOP_PARENT and not trainer.parent_lost
    except BaseException:
        # Into this job's worker log, while its handler is attached (the
        # controller records the error and traceback in the job's events).
        logger.exception("assignment failed")
        raise
    finally:
        writer.release()
        root.removeHandler(handler)
        handler.close()
        prints.close()


def load_state(torch, parts: JobParts, payload: dict, extra: dict | None = None) -> TrainingState:
    """Restore a checkpoint's ``payload`` (read onto the CPU) into ``parts`` and
    the ``extra`` objects (by name) on whatever device they live: each tensor is
    copied to its parameter's device (the optimizer's state follows its
    parameters), the RNG of the process's device too; returns the training state."""
    parts.model.load_state_dict(payload["model"])
    parts.optimizer.load_state_dict(payload["optimizer"])
    if parts.scaler is not None and payload.get("scaler") is not None:
        parts.scaler.load_state_dict(payload["scaler"])
    saved = payload.get("extra") or {}
    for name, obj in (extra or {}).items():
        if name in saved:
            obj.load_state_dict(saved[name])
    restore_rng(torch, payload["rng"])
    return TrainingState.from_dict(payload["runtime"])


def prepare_parts(cache: PartsCache, job_id: str, spec_json: str, workdir: str, torch) -> None:
    """Build a job's parts ahead of an assignment (a warm spare for a later scale-up)."""
    try:
        spec = JobSpec.from_json(spec_json)
        if entry_protocol(resolve_builder(spec.builder, spec.import_dir)) == LOOP:
            return  # a user's loop builds its objects itself; importing its module is the warm-up
        cache.get((job_id, workdir, spec_json), spec, Path(workdir), torch, reuse=True)
    except Exception:  # noqa: BLE001 - the real assignment will build again and report
        logging.getLogger().exception("preparing job %s failed", job_id)
        cache.key = cache.parts = None


def rendezvous_store(dist, a: Assignment):
    """The store ``a``'s process group forms through: a client of the TCPStore at
    ``tcp://host:port`` (one a pool hosts for workers on several machines), else
    a FileStore at the path ``a.store_path``."""
    if a.store_path.startswith(TCP_STORE_PREFIX):
        host, _, port = a.store_path[len(TCP_STORE_PREFIX):].rpartition(":")
        return dist.TCPStore(host, int(port), a.world, is_master=False,
                             timeout=timedelta(seconds=a.options.collective_timeout_s))
    return dist.FileStore(a.store_path, a.world)


def worker_setup(gloo_interface: str = GLOO_INTERFACE):
    """Make this process a worker: one compute thread, collectives bound to
    ``gloo_interface``, torch imported; returns ``(torch, torch.distributed, all_cpus)``."""
    os.environ["GLOO_SOCKET_IFNAME"] = gloo_interface
    # One thread per worker: before torch creates its OpenMP pool.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    torch = require("torch", TORCH_MISSING)
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # pragma: no cover - already set
        pass
    import torch.distributed as dist

    try:
        all_cpus = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - non-Linux
        all_cpus = None
    return torch, dist, all_cpus


def error_report(a: Assignment, exc: BaseException) -> dict:
    """The ``ERROR`` report of assignment ``a``, which raised ``exc`` (call in its ``except``)."""
    return {"generation": a.generation, "rank": a.rank, "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(), "collective": isinstance(exc, CollectiveError)}


def worker_main(conn, scheduler: ProcessIdentity) -> None:
    """Entry point of a pool's worker process (see the module docstring), which
    ends itself once its scheduler ``scheduler`` is gone (its :class:`Lifeline`)."""
    lifeline = Lifeline(scheduler).start()
    # A pool worker is a daemon (it ends with its scheduler); a user's
    # DataLoader with num_workers > 0 starts children, which multiprocessing
    # refuses in a daemon.  They end with this process.
    multiprocessing.current_process()._config["daemon"] = False
    torch, dist, all_cpus = worker_setup()
    cache = PartsCache()
    gpus = GpuBinding()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == EXIT:
            return
        if msg[0] == PREPARE:
            prepare_parts(cache, msg[1], msg[2], msg[3], torch)
            continue
        if msg[0] != RUN:
            continue  # a late command for a finished assignment
        a: Assignment = msg[1]
        try:
            alive = serve_assignment(conn, a, cache, torch, dist, all_cpus, lifeline, gpus)
        except BaseException as exc:  # noqa: BLE001 - reported to the controller, then exit
            send(conn, ERROR, error_report(a, exc))
            # The process group may be half-formed and peers blocked in it: do
            # not run interpreter teardown (atexit, gloo destructors); leave now.
            os._exit(1)
        if not alive:
            return
