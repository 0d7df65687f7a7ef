"""A user's own training loop run as one assignment of an elastic job: the
worker side of :mod:`pollux_opt.elastic`, whose wrappers find the current
:class:`UserLoop` and drive the same :class:`~pollux_opt.runtime.trainer.Trainer`
as the builder protocol: ``ElasticDataParallel`` calls :meth:`UserLoop.attach`
(the checkpoint is loaded into the user's objects and the worker reports that
it trains), the data loader :meth:`UserLoop.begin_step`, the wrapped
``optimizer.step()`` :meth:`UserLoop.micro_done`.  A stop is raised at a step
boundary as :class:`Preempted`, after rank 0 checkpointed, back into the worker.

``main()`` returning ends the user's training: the job is complete if its
spec's completion criteria hold (rank 0 writes the final checkpoint), and
fails naming the criterion otherwise.  In the verification process
(:mod:`~pollux_opt.runtime.verify`) ``attach`` loads the final checkpoint,
evaluates it and ends ``main()`` with :class:`VerificationDone`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

from pollux_opt.runtime.protocol import STOP_TARGET, CollectiveError, StopTraining
from pollux_opt.runtime.spec import JobParts, JobSpec

__all__ = ["UserLoop", "Preempted", "VerificationDone", "current_loop", "run_user_loop"]

_local = threading.local()


def current_loop() -> "UserLoop | None":
    """The user loop of the entry running in this thread (None: a script run on its own)."""
    return getattr(_local, "user_loop", None)


class Preempted(BaseException):
    """Unwinds the user's loop at a step boundary, after rank 0's checkpoint (a
    ``BaseException``, so that the user's ``except Exception`` does not catch
    it): ``code``, the stop code, or ``error``, the collective that failed."""

    def __init__(self, code: int | None = None, error: CollectiveError | None = None) -> None:
        super().__init__(code if error is None else str(error))
        self.code, self.error = code, error


class VerificationDone(BaseException):
    """Ends ``main()`` in the verification process once the checkpoint was evaluated."""


class _DictState:
    """``state_dict`` / ``load_state_dict`` of a plain dict a script registers (updated in place)."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def state_dict(self) -> dict:
        return dict(self.data)

    def load_state_dict(self, state: dict) -> None:
        self.data.clear()
        self.data.update(state)


class _SchedulerState:
    """A script's LR scheduler in a checkpoint, without the ``step`` the wrapper
    puts on it (a scheduler's ``state_dict`` holds its instance attributes)."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler

    def state_dict(self) -> dict:
        return {k: v for k, v in self.scheduler.state_dict().items() if k != "step"}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


def checkpointed(scheduler=None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The extra objects a checkpoint holds, by name (see :class:`~pollux_opt.runtime.trainer.Trainer`)."""
    out: dict[str, Any] = {}
    if scheduler is not None:
        out["lr_scheduler"] = _SchedulerState(scheduler)
    for name, obj in (extra or {}).items():
        if isinstance(obj, dict):
            obj = _DictState(obj)
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"extra state {name!r} must be a dict or have state_dict() and load_state_dict(), "
                            f"got {type(obj).__name__}")
        out[f"user:{name}"] = obj
    return out


class UserLoop:
    """One assignment (or one verification) of a user's loop; see the module docstring.

    Args:
        spec: the job.
        attach_fn: ``(user_loop, parts, extra) -> Trainer | None``, what the
            worker (or the verification) does when the wrapper is created.
    """

    def __init__(self, spec: JobSpec, rank: int, world: int, attach_fn: Callable) -> None:
        self.spec, self.rank, self.world = spec, rank, world
        self._attach_fn = attach_fn
        self.trainer = None
        self.train_size: int | None = None
        self.plan: tuple[int, int, int] | None = None  # (local_bsz, accum_steps, micro-batch size) of the step

    # ----------------------------------------------------------- the wrapper
    def attach(self, model, optimizer, *, evaluate=None, scheduler=None, scaler=None, extra=None,
               max_grad_norm=None):
        """Bind the user's objects to the job (see the module docstring); returns the trainer."""
        if self.trainer is not None:
            raise RuntimeError("a job has one ElasticDataParallel; it was created twice")
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"ElasticDataParallel needs a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"ElasticDataParallel needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if evaluate is None and self.spec.target is not None:
            raise ValueError(f"job {self.spec.name!r} completes at a metric target ({self.spec.metric}), "
                             "so ElasticDataParallel needs evaluate=")
        parts = JobParts(model=model, optimizer=optimizer, train_size=self.train_size or 1, get_batch=None,
                         loss=None, evaluate=evaluate, scaler=scaler, max_grad_norm=max_grad_norm)
        self.trainer = self._attach_fn(self, parts, checkpointed(scheduler, extra))
        return self.trainer

    def attached(self):
        """The trainer; RuntimeError before the wrapper was created."""
        if self.trainer is None:
            raise RuntimeError("create the ElasticDataParallel before iterating an ElasticDataLoader "
                               "or remaining_epochs_until")
        return self.trainer

    # --------------------------------------------------------------- a step
    def _leave(self, exc: StopTraining | CollectiveError) -> Preempted:
        try:
            return Preempted(code=self.trainer.leave(exc))
        except CollectiveError as err:
            return Preempted(error=err)

    def begin_step(self, epoch_left: int) -> int:
        """Start a step with ``epoch_left`` samples left in the epoch; returns
        the step's micro-batch size (0: the epoch ends before this step)."""
        trainer = self.trainer or self.attached()
        try:
            m, s = trainer.begin_step()
        except (StopTraining, CollectiveError) as exc:
            raise self._leave(exc) from None
        micro = min(m, epoch_left // (self.world * (s + 1)))
        self.plan = (m, s, micro) if micro > 0 else None
        return micro

    def micro_done(self, loss=None) -> bool:
        """After one micro-batch's backward pass: fold its gradient in; on the
        step's last one, reduce and update.  Returns True if the step was applied."""
        trainer, plan = self.trainer or self.attached(), self.plan
        if plan is None:
            raise RuntimeError("optimizer.step() was called outside an ElasticDataLoader batch")
        m, s, micro = plan
        if trainer.add_micro(loss) <= s:
            return False
        self.plan = None
        try:
            trainer.finish_step(micro)
            trainer.state.epoch_pos += self.world * (s + 1) * micro
            trainer.after_step()
        except (StopTraining, CollectiveError) as exc:
            raise self._leave(exc) from None
        return True

    def end_epoch(self) -> None:
        """The loader ran out of samples for the current epoch."""
        trainer = self.attached()
        trainer.state.epoch += 1
        trainer.state.epoch_pos = 0
        if self.rank == 0:
            trainer.update_completion()

    def epochs_left(self, epochs: int) -> bool:
        """True while ``remaining_epochs_until(epochs)`` yields another epoch."""
        state = self.attached().state
        limit = epochs if self.spec.epochs is None else min(epochs, self.spec.epochs)
        return state.epoch < limit

    # -------------------------------------------------------------- the end
    def complete(self) -> int:
        """``main()`` returned: the final checkpoint if the spec's criteria hold (rank 0)."""
        trainer = self.attached()
        if self.rank == 0:
            trainer.update_completion()
            state = trainer.state
            if not state.target_reached:
                raise RuntimeError(
                    f"entry {self.spec.builder!r} returned at epoch {state.epoch}, step {state.step} before the "
                    f"job's completion criteria ({_criteria(self.spec)}) held"
                )
        return trainer.finish(STOP_TARGET)


def _criteria(spec: JobSpec) -> str:
    parts = []
    if spec.target is not None:
        parts.append(f"{spec.metric} {'>=' if spec.higher_is_better else '<='} {spec.target:g}")
    if spec.epochs is not None:
        parts.append(f"{spec.epochs} epochs")
    if spec.progress_target is not None:
        parts.append(f"progress {spec.progress_target:g}")
    return ", ".join(parts)


def run_user_loop(user_loop: UserLoop, fn: Callable[[], Any]) -> int:
    """Run the user's ``fn`` with ``user_loop`` current; returns the stop code.

    Raises:
        CollectiveError: a collective failed (rank 0 checkpointed its last step).
        RuntimeError: ``fn`` returned without creating the wrapper, or before its criteria.
    """
    _local.user_loop = user_loop
    try:
        try:
            fn()
        except Preempted as stop:
            if stop.error is not None:
                raise stop.error from None
            return stop.code
        except VerificationDone:
            return STOP_TARGET
        if user_loop.trainer is None:
            raise RuntimeError(f"entry {user_loop.spec.builder!r} returned without creating an ElasticDataParallel")
        return user_loop.complete()
    finally:
        _local.user_loop = None
