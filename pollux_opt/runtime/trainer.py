"""The training loop of one assignment on one rank (:class:`Trainer`).

A step has three parts, which the builder protocol's loop (:meth:`Trainer.run`)
and a user's own loop (:mod:`~pollux_opt.runtime.user_loop`) both call:

* :meth:`Trainer.begin_step`: rank 0 broadcasts ``[stop_code, local_bsz,
  accum_steps]``, so that commands take effect at the same step boundary on
  every rank and no step is half-done when a checkpoint is taken;
* :meth:`Trainer.add_micro`, after each micro-batch's ``backward``;
* :meth:`Trainer.finish_step`: all-reduces the mean gradient, updates the
  gradient statistics and the AdaScale gain (:mod:`~pollux_opt.agent.stats`),
  applies the learning rate rule and, past the warm-up steps, records the
  step's times (:mod:`~pollux_opt.agent.measurements`); then
  :meth:`Trainer.after_step` (rank 0) evaluates, checkpoints, reports and
  applies the divergence rule (:mod:`~pollux_opt.runtime.divergence`).

**A lost peer loses no step.**  When a collective fails (a peer died, or the
group broke), the failed step changed no parameter, optimizer state or
statistic yet (buffers a forward pass updates, such as batch-norm statistics,
are put back from a copy taken before it), so rank 0 checkpoints its last
completed step before it leaves.  Only when rank 0 itself dies does the job
fall back to its previous checkpoint: at most ``checkpoint_interval_s``
seconds of training (or ``checkpoint_every_steps`` steps) are repeated.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Mapping

from pollux_opt.runtime.checkpoint import CheckpointInfo, checkpoint_dir, prune, save_checkpoint
from pollux_opt.runtime.device import broadcast_from_rank0, to_device
from pollux_opt.runtime.divergence import check_divergence
from pollux_opt.agent.measurements import ConfigKey, profile_to_json, record_step
from pollux_opt.agent.stats import adascale_gain, lr_factor, micro_batch_estimates
from pollux_opt.runtime.protocol import (
    BATCH, CHECKPOINT, CONTINUE, METRICS, STOP, STOP_LIMIT, STOP_PARENT, STOP_REQUEST, STOP_TARGET, Assignment,
    CollectiveError, StopTraining, collective, send,
)
from pollux_opt.runtime.spec import JobParts, JobSpec, grad_scaler
from pollux_opt.runtime.state import (
    EVAL_HISTORY_KEPT, EpochSampler, TrainingState, param_checksum, rng_state, step_seed,
)

__all__ = ["MIXED_SYNC_STEPS", "Trainer"]

logger = logging.getLogger("pollux_opt.runtime.worker")

#: Steps between re-synchronisations of the parameters of a job over GPUs and
#: CPU cores at once (or GPUs of several types): every rank applies the same
#: reduced gradient, but a GPU and a CPU round the update differently (fused
#: multiply-adds), so their parameters drift apart by rounding errors; rank 0's
#: are broadcast every so many steps and when the job pauses (whose report
#: compares the ranks' checksums).
MIXED_SYNC_STEPS = 50


class Trainer:
    """The training loop of one assignment on one rank.

    Args:
        base_lrs: the learning rates the rule scales, one per parameter group
            (the builder protocol: the optimizer's as built); None to scale the
            groups' current rates (a user's loop: its LR scheduler sets them,
            the rule scales them for the step, and they are put back after it).
        extra: more checkpointed objects, by name, each with ``state_dict()``
            and ``load_state_dict()`` (a user's LR scheduler, its own state).
        device: the replica's torch device (default: the CPU), where the model,
            its batches and the step's gradient sum live; the collectives' buffers
            live there under NCCL and in host memory under gloo.
    """

    def __init__(self, torch, dist, conn, a: Assignment, spec: JobSpec, parts: JobParts, base_lrs,
                 state: TrainingState, extra: Mapping[str, Any] | None = None, device=None):
        self.torch, self.dist, self.conn, self.a, self.spec, self.parts = torch, dist, conn, a, spec, parts
        self.base_lrs = base_lrs
        self.extra = dict(extra or {})
        self.state = state
        self.rank, self.world = a.rank, a.world
        self.m0 = spec.init_batch_size
        self.sampler = EpochSampler(torch, parts.train_size, spec.seed)
        self.params = [p for p in parts.model.parameters() if p.requires_grad]
        self.optimizer_step = parts.optimizer.step  # as built: a user's loop then wraps the attribute
        self.buffers = list(parts.model.buffers())
        self.buffers_before_step: list | None = None  # copies while a step is under way
        self.numel = sum(p.numel() for p in self.params)
        #: A gradient scaler of mixed precision (torch.amp.GradScaler), whose
        #: ``unscale_`` and ``update`` the trainer calls once per step (a
        #: user's loop's calls are taken over by the wrapper: see :mod:`pollux_opt.elastic`).
        self.scaler = grad_scaler(parts.scaler)
        if self.scaler is not None:
            self._unscale, self._scaler_update = self.scaler.unscale_, self.scaler.update
        self.device = torch.device("cpu") if device is None else device
        #: Where the collectives' buffers live (NCCL reduces device memory, gloo host memory).
        self.comm_device = self.device if a.backend == "nccl" else torch.device("cpu")
        self._one_device = self.comm_device == self.device  # nothing to copy between them (a CPU replica)
        self.vec = torch.zeros(self.numel + 2, dtype=torch.float32, device=self.comm_device)
        self.ctrl = torch.zeros(3, dtype=torch.int64, device=self.comm_device)
        self.config = (a.local_bsz, a.accum_steps)
        self.pending_config = self.config
        self.stop_requested = False
        self.parent_lost = False
        self.metric_ok = False  # the target is re-decided by an evaluation after each (re)start
        self.since_change = 0
        self.rows: list[tuple] = []
        self.last_report = time.monotonic()
        self.last_ckpt_time = time.monotonic()
        self.last_ckpt_step = state.step if a.checkpoint_meta else -1
        self._t_start = self._t_ctrl = self._t_micro = 0.0
        self._micro = self._losses = 0
        self._sqr_sum = self._loss_sum = 0.0

    # ------------------------------------------------------------------- a step
    def send_report(self, kind: str, **info) -> None:
        """Report ``kind`` with this rank's position and ``info``; a supervisor
        that is gone stops the training at the next step boundary."""
        state = self.state
        if not send(self.conn, kind, {"generation": self.a.generation, "rank": self.rank, "step": state.step,
                                      "progress": state.progress, "samples": state.samples, **info}):
            self.parent_lost = True

    def begin_step(self) -> tuple[int, int]:
        """Start a step at a step boundary: rank 0 takes the supervisor's commands
        sent since the last step and broadcasts the step's stop code and batch;
        returns the step's ``(local_bsz, accum_steps)``.

        Raises:
            StopTraining: the stop code says stop (nothing of a step was done).
            CollectiveError: the broadcast failed.
        """
        self._t_start = time.perf_counter()
        if self.rank == 0:
            try:
                while self.conn.poll():
                    msg = self.conn.recv()
                    if msg[0] == STOP:
                        self.stop_requested = True
                    elif msg[0] == BATCH:
                        self.pending_config = (int(msg[1]), int(msg[2]))
                        if msg[3] is not None:
                            self.state.params = msg[3]
            except (EOFError, OSError):
                self.parent_lost = True
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
        self._t_ctrl = time.perf_counter() - self._t_start
        if int(self.ctrl[0]) != CONTINUE:
            raise StopTraining(int(self.ctrl[0]))
        config = (int(self.ctrl[1]), int(self.ctrl[2]))
        if config != self.config:
            self.config = config
            self.since_change = 0
        # The CPU generator and the replica's GPU's: torch.manual_seed seeds every
        # accelerator generator, at about a millisecond per call.
        seed = step_seed(self.spec.seed, self.state.step, self.rank)
        self.torch.default_generator.manual_seed(seed)
        if self.device.type != "cpu":
            self.torch.cuda.manual_seed(seed)
        if self.buffers:
            self.buffers_before_step = [b.detach().clone() for b in self.buffers]
        self.vec.zero_()
        # A scaler's gradients are its loss scale times the true ones (the same scale on every rank).
        self._inv_scale = 1.0 if self.scaler is None else 1.0 / self.scaler.get_scale()
        self._micro = self._losses = 0
        self._sqr_sum = self._loss_sum = 0.0
        self._t_micro = time.perf_counter()
        return self.config

    def add_micro(self, loss=None) -> int:
        """Fold the gradient of one micro-batch (the parameters' ``grad``, from its
        mean ``loss``'s backward) into the step's sum, and clear it; returns
        the micro-batches folded in so far this step."""
        torch = self.torch
        acc = self.vec[: self.numel]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        true = flat if self._inv_scale == 1.0 else flat * self._inv_scale  # squared, a scaled one may overflow
        self._sqr_sum += float(true.dot(true))
        acc.add_(flat if self._one_device else flat.to(acc.device))
        if loss is not None:
            self._loss_sum += float(loss.detach())
            self._losses += 1
        for p in self.params:
            p.grad = None
        self._micro += 1
        return self._micro

    def finish_step(self, micro_bsz: int | None = None) -> None:
        """Reduce, update and account the step (see the module docstring);
        ``micro_bsz``: samples per micro-batch (default: the step's local batch),
        smaller in the short last step of a user's epoch, which is left out of
        the gradient statistics and the measurements."""
        state, micro = self.state, self._micro
        t_compute = time.perf_counter() - self._t_micro
        m_cfg, s = self.config
        m = m_cfg if micro_bsz is None else micro_bsz
        full = m == m_cfg and micro == s + 1
        vec, acc = self.vec, self.vec[: self.numel]
        acc.div_(micro)
        vec[self.numel] = self._sqr_sum
        vec[self.numel + 1] = self._loss_sum
        t_sync = time.perf_counter()
        if self.world > 1:
            collective(self.dist.all_reduce, vec)
            acc.div_(self.world)
        t_sync = time.perf_counter() - t_sync + self._t_ctrl

        n = self.world * micro
        batch = n * m
        self._set_grads(acc)
        mean_sqr = float(acc.dot(acc))
        applied = math.isfinite(mean_sqr)  # False: a scaler's overflow, the step is skipped on every rank
        scale = batch / self.m0
        est_sqr = est_var = math.nan
        if n >= 2 and full and applied:
            est_sqr, est_var = micro_batch_estimates(float(vec[self.numel]), mean_sqr, n, m, self.m0)
            state.ema.update(est_sqr, est_var, scale)
        gain = adascale_gain(state.ema.estimate(), scale)
        factor = lr_factor(self.spec.lr_scaling, gain, scale)
        self._update(factor, applied)
        self.buffers_before_step = None

        state.step += 1
        if self.a.mixed and state.step % MIXED_SYNC_STEPS == 0:
            self.sync_parameters()
        state.progress += gain if applied else 0.0
        state.samples += batch
        step_time = time.perf_counter() - self._t_start
        state.train_seconds += step_time
        self.since_change += 1
        if self.rank == 0:
            loss_mean = float(vec[self.numel + 1]) / n if self._losses else math.nan
            if self._losses and not math.isfinite(loss_mean):
                raise FloatingPointError(f"training loss is {loss_mean} at step {state.step}")
            if not applied and self.scaler is None:
                raise FloatingPointError(f"gradient's squared norm is {mean_sqr} at step {state.step}")
            if not applied:
                logger.info("step %d skipped: a non-finite gradient at loss scale %g", state.step,
                            1.0 / self._inv_scale)
            if self.since_change > self.a.options.warmup_steps and full:
                key = ConfigKey(self.a.num_nodes, self.world, m, s)
                record_step(state.profile, key, step_time, t_sync, t_compute)
                if self.a.node_type is not None:  # the same step, to the profile of the type it ran on
                    record_step(state.type_profiles.setdefault(self.a.node_type, {}), key, step_time, t_sync,
                                t_compute)
            self.rows.append(
                (self.a.generation, state.step, time.time(), self.world, m, s, step_time, t_compute, t_sync,
                 loss_mean, est_sqr, est_var, gain, factor, state.progress)
            )

    def _step(self) -> None:
        """One step of the builder protocol: ``world * (s + 1)`` micro-batches of
        ``m`` samples from the runtime's sample stream."""
        parts, state = self.parts, self.state
        m, s = self.begin_step()
        for j in range(s + 1):
            idx = self.sampler.take(state.samples + (self.rank * (s + 1) + j) * m, m)
            batch = parts.get_batch(idx)
            loss = parts.loss(parts.model, batch if self.device.type == "cpu" else to_device(batch, self.device))
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            self.add_micro(loss)
        self.finish_step()

    def _set_grads(self, acc) -> None:
        """The parameters' gradients: the reduced mean gradient ``acc``, unscaled
        in place by a scaler (once per step: the library records its overflow check)."""
        offset = 0
        for p in self.params:
            k = p.numel()
            # A view of the reduced buffer: the optimizer only reads it, and the
            # buffer is not reused before the grads are dropped in _update.
            view = acc[offset : offset + k].view_as(p)
            p.grad = view if self._one_device else view.to(p.device)
            offset += k
        if self.scaler is not None:
            self._unscale(self.parts.optimizer)
            if not self._one_device:  # the grads are copies of the host buffer: unscale it too
                acc.mul_(self._inv_scale)

    def _update(self, factor: float, finite: bool = True) -> None:
        """Apply the gradients with the learning rates scaled by ``factor``, only if
        ``finite``; update a scaler (which lowers its scale after an overflow)."""
        torch, parts = self.torch, self.parts
        if finite:
            if parts.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.params, parts.max_grad_norm)
            groups = parts.optimizer.param_groups
            bases = self.base_lrs if self.base_lrs is not None else [float(g["lr"]) for g in groups]
            for group, base in zip(groups, bases):
                group["lr"] = base * factor
            self.optimizer_step()
            if self.base_lrs is None:
                for group, base in zip(groups, bases):
                    group["lr"] = base  # the schedule's rate stays the schedule's
        if self.scaler is not None:
            self._scaler_update()
        for p in self.params:
            p.grad = None

    # ------------------------------------------------------- between steps (rank 0)
    def update_completion(self) -> None:
        """Mark the target reached when every completion criterion of the spec holds
        (epochs: a user's loop counts them, the builder protocol's stream in samples)."""
        spec, state = self.spec, self.state
        if spec.target is not None and not self.metric_ok:
            return
        epochs = float(state.epoch) if self.base_lrs is None else state.samples / self.parts.train_size
        state.target_reached = spec.counts_reached(state.progress, epochs)

    def _evaluate(self) -> None:
        state, spec, parts = self.state, self.spec, self.parts
        if state.progress < state.next_eval or parts.evaluate is None:
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
        self.metric_ok = spec.reached(metric)
        logger.info("step %d progress %.1f: %s = %.5g", state.step, state.progress, spec.metric, metric)

    def after_step(self) -> None:
        """Rank 0 between steps: evaluate, decide completion, checkpoint, report."""
        if self.rank != 0:
            return
        self._evaluate()
        self.update_completion()
        if self._checkpoint_due() and not self.state.target_reached:
            self.save()
        if time.monotonic() - self.last_report >= self.a.options.report_interval_s:
            opts = self.a.options
            check_divergence(self.state, [row[9] for row in self.rows], opts.divergence_factor,
                             opts.divergence_reports)
            self._report()

    def _report(self) -> None:
        self.last_report = time.monotonic()
        state, stats = self.state, self.state.ema.estimate()
        rows, self.rows = self.rows, []
        self.send_report(METRICS, metric=state.metric, eval_history=state.eval_history[-5:],
                         stats=None if stats is None else [stats[0], stats[1]], stats_steps=state.ema.count,
                         profile=state.profile, type_profiles=state.type_profiles, rows=rows,
                         config=list(self.config))

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
        if self.extra:
            payload["extra"] = {name: obj.state_dict() for name, obj in self.extra.items()}
        stats = state.ema.estimate()
        meta = {
            "job_id": self.a.job_id, "generation": self.a.generation, "time": time.time(),
            "progress": state.progress, "samples": state.samples, "metric": state.metric,
            "final": final, "num_replicas": self.world, "config": list(self.config),
            "checksum": param_checksum(parts.model), "profile": profile_to_json(state.profile),
            "type_profiles": {t: profile_to_json(p) for t, p in state.type_profiles.items()},
            "params": state.params,
            "stats": None if stats is None else [stats[0], stats[1]], "stats_steps": state.ema.count,
            "eval_history": state.eval_history, "train_seconds": state.train_seconds,
            "epoch": state.epoch,
        }
        directory = checkpoint_dir(Path(self.a.workdir))
        info = save_checkpoint(directory, state.step, payload, meta)
        prune(directory, self.a.options.keep_checkpoints)
        self.last_ckpt_time = time.monotonic()
        self.last_ckpt_step = state.step
        self.send_report(CHECKPOINT, meta_path=str(info.meta_path), final=final, checksum=meta["checksum"])
        return info

    def sync_parameters(self) -> None:
        """Every rank takes rank 0's parameters and buffers (a collective)."""
        with self.torch.no_grad():
            for tensor in self.params + self.buffers:
                broadcast_from_rank0(self.dist, tensor, self.a.backend, collective)

    def finish(self, code: int) -> int:
        """After stop ``code`` (every rank): rank 0 reports and checkpoints (final
        at the target); returns ``code``."""
        if self.a.mixed:
            self.sync_parameters()
        if self.rank == 0:
            self._report()
            if code == STOP_TARGET:
                self.save(final=True)
            elif self.last_ckpt_step != self.state.step:
                self.save()
        return code

    def leave(self, exc: StopTraining | CollectiveError) -> int:
        """Rank 0 reports and checkpoints on the way out: after a stop (returns
        its code), or after a failed collective (re-raised) the last completed
        step (see the module docstring), never raising an error of its own."""
        if isinstance(exc, StopTraining):
            return self.finish(exc.code)
        if self.rank == 0:
            try:
                if self.buffers_before_step is not None:
                    with self.torch.no_grad():
                        for buffer, saved in zip(self.buffers, self.buffers_before_step):
                            buffer.copy_(saved)
                    self.buffers_before_step = None
                self._report()
                if self.state.step > 0 and self.last_ckpt_step != self.state.step:
                    self.save(final=self.state.target_reached)
                    logger.info("checkpointed step %d after a failed collective", self.state.step)
            except Exception:  # noqa: BLE001 - the collective's failure is what gets reported
                logger.exception("could not checkpoint after a failed collective")
        raise exc

    def run(self) -> int:
        """The builder protocol: train until a stop code; returns it (see :meth:`leave`)."""
        while True:
            try:
                self._step()
                self.after_step()
            except (StopTraining, CollectiveError) as exc:
                return self.leave(exc)
