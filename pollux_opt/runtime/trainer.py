"""The training loop of one assignment on one rank (:class:`Trainer`), and the
state a checkpoint restores (:class:`TrainingState`).

Before each step rank 0 broadcasts a control vector ``[stop_code, local_bsz,
accum_steps]``, so that commands of the controller take effect at a step
boundary on every rank and no step is half-done when a checkpoint is taken.
Each step runs ``accum_steps + 1`` micro-batches of ``local_bsz`` samples per
replica, all-reduces the mean gradient, updates the gradient statistics and
the AdaScale gain (:mod:`~pollux_opt.runtime.stats`) and, past the warm-up
steps, adds its times to the measurement profile
(:mod:`~pollux_opt.runtime.measurements`).

**A lost peer loses no step.**  When a collective fails (a peer died, or the
group broke), rank 0 still holds the state after its last completed step: the
failed step changed no parameter, optimizer state or statistic yet (buffers a
forward pass updates, such as batch-norm statistics, are put back from a copy
taken before it).  It checkpoints that state before it leaves, and the job
resumes from there.  Only when rank 0 itself dies does the job fall back to
its previous checkpoint, repeating the steps since then: at most
``RuntimeOptions.checkpoint_interval_s`` seconds of training (or
``checkpoint_every_steps`` steps).
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pollux_opt.runtime.checkpoint import CheckpointInfo, checkpoint_dir, prune, save_checkpoint
from pollux_opt.runtime.measurements import ConfigKey, profile_from_json, profile_to_json, record_step
from pollux_opt.runtime.spec import JobParts, JobSpec
from pollux_opt.runtime.stats import GradStatsEMA, adascale_gain, lr_factor, micro_batch_estimates

if TYPE_CHECKING:
    from pollux_opt.runtime.worker import Assignment

__all__ = ["CollectiveError", "StopTraining", "Trainer", "TrainingState", "collective", "param_checksum",
           "restore_rng", "rng_state"]

logger = logging.getLogger("pollux_opt.runtime.worker")

#: Control codes broadcast by rank 0 before each step.
CONTINUE, STOP_REQUEST, STOP_TARGET, STOP_LIMIT, STOP_PARENT = 0, 1, 2, 3, 4
STOP_REASONS = {STOP_REQUEST: "request", STOP_TARGET: "target", STOP_LIMIT: "step_limit", STOP_PARENT: "parent_lost"}

#: Validation results kept in the run state (and checkpoint metadata).
EVAL_HISTORY_KEPT = 1000

#: Large primes mixing (seed, epoch) and (seed, step, rank) into RNG seeds.
_SEED_MIX_A, _SEED_MIX_B = 1_000_003, 7_919
_SEED_MOD = 2**63 - 1


@dataclass
class TrainingState:
    """Everything about training progress that a checkpoint restores."""

    step: int = 0
    progress: float = 0.0
    samples: int = 0
    train_seconds: float = 0.0
    next_eval: float = 0.0
    metric: float | None = None
    target_reached: bool = False
    eval_history: list = field(default_factory=list)
    profile: dict = field(default_factory=dict)  # ConfigKey -> aggregate (see measurements)
    ema: GradStatsEMA = field(default_factory=GradStatsEMA)
    params: dict | None = None

    def to_dict(self) -> dict:
        return {
            "step": self.step, "progress": self.progress, "samples": self.samples,
            "train_seconds": self.train_seconds, "next_eval": self.next_eval, "metric": self.metric,
            "target_reached": self.target_reached, "eval_history": list(self.eval_history),
            "profile": profile_to_json(self.profile), "ema": self.ema.state(), "params": self.params,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "TrainingState":
        state = cls()
        for key in ("step", "samples"):
            setattr(state, key, int(data[key]))
        for key in ("progress", "train_seconds", "next_eval"):
            setattr(state, key, float(data[key]))
        state.metric = data.get("metric")
        # Completion is re-decided by the next evaluation after a resume (a
        # final checkpoint is only resumed when its verification failed).
        state.target_reached = False
        state.eval_history = [list(row) for row in data.get("eval_history", [])]
        state.profile = profile_from_json(data.get("profile"))
        state.ema = GradStatsEMA.from_state(data["ema"])
        state.params = data.get("params")
        return state


class EpochSampler:
    """Seeded permutation per epoch; ``take(pos, count)`` is the sample stream at ``pos``."""

    def __init__(self, torch, size: int, seed: int) -> None:
        self._torch = torch
        self.size = size
        self.seed = seed
        self._epoch = -1
        self._perm = None

    def _permutation(self, epoch: int):
        if epoch != self._epoch:
            gen = self._torch.Generator().manual_seed((self.seed * _SEED_MIX_A + epoch) % _SEED_MOD)
            self._perm = self._torch.randperm(self.size, generator=gen)
            self._epoch = epoch
        return self._perm

    def take(self, pos: int, count: int):
        chunks = []
        while count > 0:
            epoch, offset = divmod(pos, self.size)
            n = min(count, self.size - offset)
            chunks.append(self._permutation(epoch)[offset : offset + n])
            pos += n
            count -= n
        return chunks[0] if len(chunks) == 1 else self._torch.cat(chunks)


def param_checksum(model) -> str:
    """SHA-256 (16 hex digits) of all parameters and buffers, in state_dict order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def rng_state(torch) -> dict:
    import numpy as np

    np_state = np.random.get_state(legacy=False)
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {"key": [int(x) for x in np_state["state"]["key"]], "pos": int(np_state["state"]["pos"])},
    }


def restore_rng(torch, state: dict) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": np.asarray(state["numpy"]["key"], dtype=np.uint32), "pos": state["numpy"]["pos"]},
            "has_gauss": 0,
            "gauss": 0.0,
        }
    )


class Trainer:
    """The training loop of one assignment on one rank."""

    def __init__(self, torch, dist, conn, a: Assignment, spec: JobSpec, parts: JobParts, base_lrs, state: TrainingState):
        self.torch, self.dist, self.conn, self.a, self.spec, self.parts = torch, dist, conn, a, spec, parts
        self.base_lrs = base_lrs
        self.state = state
        self.rank, self.world = a.rank, a.world
        self.m0 = spec.init_batch_size
        self.sampler = EpochSampler(torch, parts.train_size, spec.seed)
        self.params = [p for p in parts.model.parameters() if p.requires_grad]
        self.buffers = list(parts.model.buffers())
        self.buffers_before_step: list | None = None  # copies while a step is under way
        self.numel = sum(p.numel() for p in self.params)
        self.vec = torch.zeros(self.numel + 2, dtype=torch.float32)
        self.ctrl = torch.zeros(3, dtype=torch.int64)
        self.config = (a.local_bsz, a.accum_steps)
        self.pending_config = self.config
        self.stop_requested = False
        self.parent_lost = False
        self.since_change = 0
        self.rows: list[tuple] = []
        self.last_report = time.monotonic()
        self.last_ckpt_time = time.monotonic()
        self.last_ckpt_step = state.step if a.checkpoint_meta else -1

    # ------------------------------------------------------------ rank-0 control
    def _read_commands(self) -> None:
        conn = self.conn
        try:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "stop":
                    self.stop_requested = True
                elif msg[0] == "batch":
                    self.pending_config = (int(msg[1]), int(msg[2]))
                    if msg[3] is not None:
                        self.state.params = msg[3]
        except (EOFError, OSError):
            self.parent_lost = True

    def _decide(self) -> int:
        if self.rank == 0:
            self._read_commands()
            if self.parent_lost:
                code = STOP_PARENT
            elif self.state.target_reached:
                code = STOP_TARGET
            elif self.stop_requested:
                code = STOP_REQUEST
            elif self.a.options.step_limit is not None and self.state.step >= self.a.options.step_limit:
                code = STOP_LIMIT
            else:
                code = CONTINUE
            self.ctrl[0], self.ctrl[1], self.ctrl[2] = code, self.pending_config[0], self.pending_config[1]
        if self.world > 1:
            collective(self.dist.broadcast, self.ctrl, src=0)
        return int(self.ctrl[0])

    # ------------------------------------------------------------------- a step
    def _step(self) -> None:
        """One optimizer step of ``world * (s + 1)`` micro-batches of ``m`` samples."""
        torch, state = self.torch, self.state
        t_start = time.perf_counter()
        code = self._decide()
        t_ctrl = time.perf_counter() - t_start
        if code != CONTINUE:
            raise StopTraining(code)
        config = (int(self.ctrl[1]), int(self.ctrl[2]))
        if config != self.config:
            self.config = config
            self.since_change = 0
        m, s = self.config
        n = self.world * (s + 1)
        batch = n * m
        # Per-step seed (dropout etc.), so that a resumed run draws what an
        # uninterrupted one would.  The CPU generator only: torch.manual_seed
        # also seeds accelerator generators, at about a millisecond per call.
        torch.default_generator.manual_seed((self.spec.seed * _SEED_MIX_A + state.step * _SEED_MIX_B + self.rank) % _SEED_MOD)

        if self.buffers:
            self.buffers_before_step = [b.detach().clone() for b in self.buffers]
        t_compute = self._accumulate(m, s + 1)
        vec, acc = self.vec, self.vec[: self.numel]
        t_sync = time.perf_counter()
        if self.world > 1:
            collective(self.dist.all_reduce, vec)
            acc.div_(self.world)
        t_sync = time.perf_counter() - t_sync + t_ctrl

        mean_sqr = float(acc.dot(acc))
        scale = batch / self.m0
        est_sqr = est_var = math.nan
        if n >= 2:
            est_sqr, est_var = micro_batch_estimates(float(vec[self.numel]), mean_sqr, n, m, self.m0)
            state.ema.update(est_sqr, est_var, scale)
        gain = adascale_gain(state.ema.estimate(), scale)
        factor = lr_factor(self.spec.lr_scaling, gain, scale)
        self._update(acc, factor)
        self.buffers_before_step = None

        state.step += 1
        state.progress += gain
        state.samples += batch
        step_time = time.perf_counter() - t_start
        state.train_seconds += step_time
        self.since_change += 1
        if self.rank == 0:
            loss_mean = float(vec[self.numel + 1]) / n
            if not math.isfinite(loss_mean):
                raise FloatingPointError(f"training loss is {loss_mean} at step {state.step}")
            if self.since_change > self.a.options.warmup_steps:
                record_step(state.profile, ConfigKey(self.a.num_nodes, self.world, m, s), step_time, t_sync, t_compute)
            self.rows.append(
                (self.a.generation, state.step, time.time(), self.world, m, s, step_time, t_compute, t_sync,
                 loss_mean, est_sqr, est_var, gain, factor, state.progress)
            )

    def _accumulate(self, m: int, micro: int) -> float:
        """Run this rank's ``micro`` micro-batches of ``m`` samples: ``self.vec``
        then holds their mean gradient, the sum of their squared gradient norms
        and the sum of their losses.  Returns the seconds taken."""
        torch, state, parts = self.torch, self.state, self.parts
        vec = self.vec
        vec.zero_()
        acc = vec[: self.numel]
        sqr_sum = 0.0
        loss_sum = 0.0
        t_compute = time.perf_counter()
        for j in range(micro):
            idx = self.sampler.take(state.samples + (self.rank * micro + j) * m, m)
            loss = parts.loss(parts.model, parts.get_batch(idx))
            loss.backward()
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            sqr_sum += float(flat.dot(flat))
            acc.add_(flat)
            loss_sum += float(loss.detach())
            for p in self.params:
                p.grad = None
        acc.div_(micro)
        vec[self.numel] = sqr_sum
        vec[self.numel + 1] = loss_sum
        return time.perf_counter() - t_compute

    def _update(self, acc, factor: float) -> None:
        """Apply the reduced mean gradient ``acc`` with the learning rates scaled by ``factor``."""
        torch, parts = self.torch, self.parts
        offset = 0
        for p in self.params:
            k = p.numel()
            # A view of the reduced buffer: the optimizer only reads it, and the
            # buffer is not reused before the grads are dropped below.
            p.grad = acc[offset : offset + k].view_as(p)
            offset += k
        if parts.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, parts.max_grad_norm)
        for group, base in zip(parts.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor
        parts.optimizer.step()
        for p in self.params:
            p.grad = None

    # ------------------------------------------------------- between steps (rank 0)
    def _evaluate(self) -> None:
        state, spec, parts = self.state, self.spec, self.parts
        if state.progress < state.next_eval:
            return
        t0 = time.perf_counter()
        parts.model.eval()
        with self.torch.no_grad():
            metric = float(parts.evaluate(parts.model))
        parts.model.train()
        state.metric = metric
        state.eval_history.append([state.step, state.progress, metric, time.perf_counter() - t0])
        del state.eval_history[:-EVAL_HISTORY_KEPT]
        state.next_eval = (math.floor(state.progress / spec.eval_every) + 1) * spec.eval_every
        if spec.reached(metric):
            state.target_reached = True
        logger.info("step %d progress %.1f: %s = %.5g", state.step, state.progress, spec.metric, metric)

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_report < self.a.options.report_interval_s:
            return
        self.last_report = now
        stats = self.state.ema.estimate()
        info = {
            "generation": self.a.generation, "rank": 0, "step": self.state.step,
            "progress": self.state.progress, "samples": self.state.samples,
            "metric": self.state.metric, "eval_history": self.state.eval_history[-5:],
            "stats": None if stats is None else [stats[0], stats[1]], "stats_steps": self.state.ema.count,
            "profile": self.state.profile, "rows": self.rows, "config": list(self.config),
        }
        self.rows = []
        try:
            self.conn.send(("metrics", info))
        except (BrokenPipeError, EOFError, OSError):
            self.parent_lost = True

    def _checkpoint_due(self) -> bool:
        opts = self.a.options
        if opts.checkpoint_every_steps is not None and self.state.step % opts.checkpoint_every_steps == 0:
            return True
        return time.monotonic() - self.last_ckpt_time >= opts.checkpoint_interval_s

    def save(self, final: bool = False) -> CheckpointInfo:
        torch, parts, state = self.torch, self.parts, self.state
        payload = {
            "model": parts.model.state_dict(),
            "optimizer": parts.optimizer.state_dict(),
            "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
            "rng": rng_state(torch),
            "runtime": state.to_dict(),
            "config": list(self.config),
        }
        stats = state.ema.estimate()
        meta = {
            "job_id": self.a.job_id, "generation": self.a.generation, "time": time.time(),
            "progress": state.progress, "samples": state.samples, "metric": state.metric,
            "final": final, "num_replicas": self.world, "config": list(self.config),
            "checksum": param_checksum(parts.model), "profile": profile_to_json(state.profile),
            "params": state.params,
            "stats": None if stats is None else [stats[0], stats[1]], "stats_steps": state.ema.count,
            "eval_history": state.eval_history, "train_seconds": state.train_seconds,
        }
        directory = checkpoint_dir(Path(self.a.workdir))
        info = save_checkpoint(directory, state.step, payload, meta)
        prune(directory, self.a.options.keep_checkpoints)
        self.last_ckpt_time = time.monotonic()
        self.last_ckpt_step = state.step
        try:
            self.conn.send(("checkpoint", {
                "generation": self.a.generation, "rank": 0, "step": state.step, "meta_path": str(info.meta_path),
                "final": final, "checksum": meta["checksum"], "progress": state.progress,
            }))
        except (BrokenPipeError, EOFError, OSError):
            self.parent_lost = True
        return info

    def save_after_fault(self) -> None:
        """Rank 0, after a failed collective: report and checkpoint the last
        completed step (see the module docstring); never raises."""
        try:
            if self.buffers_before_step is not None:
                with self.torch.no_grad():
                    for buffer, saved in zip(self.buffers, self.buffers_before_step):
                        buffer.copy_(saved)
                self.buffers_before_step = None
            self._report(force=True)
            if self.state.step > 0 and self.last_ckpt_step != self.state.step:
                self.save(final=self.state.target_reached)
                logger.info("checkpointed step %d after a failed collective", self.state.step)
        except Exception:  # noqa: BLE001 - the collective's failure is what gets reported
            logger.exception("could not checkpoint after a failed collective")

    def run(self) -> int:
        """Train until a stop code; returns it.  Rank 0 checkpoints on the way
        out, also when a collective fails (then the CollectiveError propagates)."""
        while True:
            try:
                self._step()
            except StopTraining as stop:
                code = stop.code
                break
            except CollectiveError:
                if self.rank == 0:
                    self.save_after_fault()
                raise
            if self.rank == 0:
                self._evaluate()
                if self._checkpoint_due() and not self.state.target_reached:
                    self.save()
                self._report()
        if self.rank == 0:
            self._report(force=True)
            if code == STOP_TARGET:
                self.save(final=True)
            elif self.last_ckpt_step != self.state.step:
                self.save()
        return code


class CollectiveError(RuntimeError):
    """A collective operation failed: a peer died or the group broke.

    Reported to the controller as a symptom (``collective: True``), not as an
    error of the job's code, so that a killed peer leads to a restart rather
    than to failing the job.
    """


def collective(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - re-raised with its cause
        raise CollectiveError(f"{getattr(fn, '__name__', fn)}: {exc}") from exc


class StopTraining(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
