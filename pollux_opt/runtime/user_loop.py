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

**Sample order** (:func:`epoch_batches`).  An epoch is a permutation of the
dataset (seeded by the job's seed and the epoch,
:class:`~pollux_opt.runtime.state.EpochSampler`, or the identity without
``shuffle``).  A step at position ``pos`` of the epoch with ``n = world *
(accum_steps + 1)`` micro-batches of ``b`` samples takes the permutation's
``[pos, pos + n * b)``; micro-batch ``j`` of rank ``r`` starts at ``pos + (r *
(accum_steps + 1) + j) * b``, the layout of the builder protocol's steps.  The
epoch's short last step uses ``b = floor(left / n)``; when that is 0, the epoch
ends.  The position is checkpointed, so a resumed job, on any number of
replicas, continues with the next sample: none is seen twice, none skipped but
those left at an epoch's end.  The index lists (:class:`StepBatches`, replaced
when a step brings another batch configuration) feed a ``DataLoader`` as its
``batch_sampler``, or, without worker processes or other options, are fetched
in this thread as the ``DataLoader`` would (``dataset.__getitems__(indices)``
if the dataset has it, else one ``dataset[i]`` per index, then ``collate_fn``)
without its iterator's bookkeeping (about a tenth of a millisecond per batch).
"""

from __future__ import annotations

from contextvars import ContextVar
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Mapping

from pollux_opt.runtime.device import to_device
from pollux_opt.runtime.protocol import STOP_TARGET, CollectiveError, StopTraining
from pollux_opt.runtime.spec import JobParts, JobSpec
from pollux_opt.runtime.state import EpochSampler

__all__ = ["Preempted", "StepBatches", "UserLoop", "VerificationDone", "current_loop", "epoch_batches",
           "micro_size", "run_user_loop"]

#: ``ElasticDataLoader`` options that the in-thread fetch serves (any other needs a ``DataLoader``).
_DIRECT_OPTIONS = frozenset({"collate_fn", "num_workers", "drop_last"})

#: The user loop of the entry running in this thread (None: a script run on its own).
_CURRENT: ContextVar[UserLoop | None] = ContextVar("pollux_opt_user_loop", default=None)


def current_loop() -> UserLoop | None:
    """The user loop of the entry running in this thread (None: a script run on its own)."""
    return _CURRENT.get()


class Preempted(BaseException):
    """Unwinds the user's loop at a step boundary, after rank 0's checkpoint (a
    ``BaseException``, so that the user's ``except Exception`` does not catch
    it): ``code``, the stop code, or ``error``, the collective that failed."""

    def __init__(self, code: int | None = None, error: CollectiveError | None = None) -> None:
        super().__init__(code if error is None else str(error))
        self.code, self.error = code, error


class VerificationDone(BaseException):
    """Ends ``main()`` in the verification process once the checkpoint was evaluated."""


def _dict_state(data: dict) -> SimpleNamespace:
    """``state_dict`` / ``load_state_dict`` of a plain dict a script registers (restored in place)."""

    def load(state: dict) -> None:
        data.clear()
        data.update(state)

    return SimpleNamespace(state_dict=lambda: dict(data), load_state_dict=load)


def checkpointed(scheduler=None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The extra objects a checkpoint holds, by name (see :class:`~pollux_opt.runtime.trainer.Trainer`)."""
    out: dict[str, Any] = {}
    if scheduler is not None:
        # Without the ``step`` the wrapper puts on it (its state_dict holds its instance attributes).
        out["lr_scheduler"] = SimpleNamespace(
            state_dict=lambda: {k: v for k, v in scheduler.state_dict().items() if k != "step"},
            load_state_dict=scheduler.load_state_dict)
    for name, obj in (extra or {}).items():
        if isinstance(obj, dict):
            obj = _dict_state(obj)
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"extra state {name!r} must be a dict or have state_dict() and load_state_dict(), "
                            f"got {type(obj).__name__}")
        out[f"user:{name}"] = obj
    return out


class UserLoop:
    """One assignment (or one verification) of a user's loop; ``attach_fn``:
    ``(user_loop, parts, extra) -> Trainer``, what the worker (or the
    verification) does when the wrapper is created; ``device``: the replica's
    torch device (None: the CPU), where the wrapper moves the model and the
    loader its batches."""

    def __init__(self, spec: JobSpec, rank: int, world: int, attach_fn: Callable, device=None) -> None:
        self.spec, self.rank, self.world = spec, rank, world
        self.device = device
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
        if self.device is not None:
            model.to(self.device)  # in place: the optimizer keeps its parameters
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
        micro = micro_size(epoch_left, self.world, m, s)
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
    token = _CURRENT.set(user_loop)
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
        _CURRENT.reset(token)


# ------------------------------------------------------------ sample order
def micro_size(left: int, world: int, local_bsz: int, accum_steps: int) -> int:
    """Samples per micro-batch of a step with ``left`` samples left in the epoch (0: the epoch ends)."""
    return min(local_bsz, left // (world * (accum_steps + 1)))


class StepBatches:
    """Index lists of one rank's micro-batches, step after step, from ``start``
    to the epoch's end, for one batch configuration (a ``batch_sampler``)."""

    def __init__(self, order, start: int, world: int, rank: int, local_bsz: int, accum_steps: int) -> None:
        self.order, self.start, self.world, self.rank = order, start, world, rank
        self.local_bsz, self.accum_steps = local_bsz, accum_steps

    def __iter__(self) -> Iterator[list[int]]:
        # A NumPy view of the order: its slices and lists cost a fraction of a tensor's.
        order = self.order.numpy()
        pos, size, micro_n = self.start, len(order), self.accum_steps + 1
        while True:
            b = micro_size(size - pos, self.world, self.local_bsz, self.accum_steps)
            if b == 0:
                return
            first = pos + self.rank * micro_n * b
            for _ in range(micro_n):
                yield order[first : first + b].tolist()
                first += b
            pos += self.world * micro_n * b


def epoch_batches(user_loop: UserLoop, dataset, shuffle: bool, loader_kwargs: Mapping[str, Any]) -> Iterator:
    """The micro-batches of the rest of the current epoch on this rank (see the module docstring)."""
    import torch
    from torch.utils.data import DataLoader, default_collate

    state = user_loop.attached().state
    size = len(dataset)
    order = EpochSampler(torch, size, user_loop.spec.seed).permutation(state.epoch) if shuffle else torch.arange(size)
    collate = loader_kwargs.get("collate_fn") or default_collate
    getitems = getattr(dataset, "__getitems__", None)
    kwargs = {k: v for k, v in loader_kwargs.items() if k != "drop_last"}  # with a batch_sampler, the sampler's

    def direct(batches: StepBatches) -> Iterator:
        return (collate(getitems(idx) if getitems else [dataset[i] for i in idx]) for idx in batches)

    def loader(batches: StepBatches) -> Iterator:
        # Its own generator: a DataLoader draws a seed when it starts, which must
        # not shift the step's seeded stream (dropout) of the script.
        return iter(DataLoader(dataset, batch_sampler=batches, generator=torch.Generator(), **kwargs))

    in_thread = not loader_kwargs.get("num_workers") and {k for k, v in loader_kwargs.items() if v} <= _DIRECT_OPTIONS
    return _batches(user_loop, size, order, direct if in_thread else loader)


def _batches(user_loop: UserLoop, size: int, order, fetch: Callable[[StepBatches], Iterator]) -> Iterator:
    """Begin each step of the rest of the epoch and yield its micro-batches from
    ``fetch`` over :class:`StepBatches`, replaced when a step brings another
    batch configuration; end the epoch after its last step."""
    state = user_loop.trainer.state
    device = None if user_loop.device is None or user_loop.device.type == "cpu" else user_loop.device
    it, expected = None, None
    while True:
        b = user_loop.begin_step(size - state.epoch_pos)
        if b == 0:
            user_loop.end_epoch()
            return
        m, s, _ = user_loop.plan
        if it is None or expected != (state.epoch_pos, m, s):
            it = fetch(StepBatches(order, state.epoch_pos, user_loop.world, user_loop.rank, m, s))
        expected = (state.epoch_pos + user_loop.world * (s + 1) * b, m, s)
        for _ in range(s + 1):
            yield next(it) if device is None else to_device(next(it), device)
        if user_loop.plan is not None:
            raise RuntimeError("call optimizer.step() once for every batch of an ElasticDataLoader")
