"""Keep your training loop: make an ordinary PyTorch script an elastic pollux-opt job.

Four things of a script are wrapped; the loop stays the script's::

    import pollux_opt.elastic as elastic

    loader = elastic.ElasticDataLoader(train_set, batch_size=32, shuffle=True)   # was DataLoader
    model = elastic.ElasticDataParallel(model, optimizer, scheduler=scheduler,
                                        evaluate=lambda m: accuracy(m, test_set))
    for epoch in elastic.remaining_epochs_until(EPOCHS):                          # was range(EPOCHS)
        for x, y in loader:
            optimizer.zero_grad()
            model.backward(loss_fn(model(x), y))                                  # was loss.backward()
            optimizer.step()
        scheduler.step()

* :class:`ElasticDataParallel` wraps the model and its optimizer: it measures
  each step's compute and synchronisation time and the gradient statistics
  (the gradient noise scale behind statistical efficiency), averages the
  gradients of all replicas, and applies the job's learning-rate rule to the
  rate the script's LR scheduler sets (the schedule sets the base rate, the
  rule scales it for each step; the scheduler's own rate is never
  overwritten).  It checkpoints the model, the optimizer, the scheduler, a
  grad scaler and any ``extra`` state, and restores them when the job resumes.
* :class:`ElasticDataLoader` wraps a map-style ``torch.utils.data.Dataset``:
  the job owns the global batch (chosen for goodput, or pinned by the
  scheduler) and each replica's share of it, and resumes mid-epoch at the
  exact sample; the script's ``collate_fn``, ``num_workers`` and other
  ``DataLoader`` options are kept.  It yields *micro-batches*: a step of
  ``accum_steps + 1`` micro-batches per replica is applied by the optimizer
  step after the last one.  An epoch takes each sample at most once; its
  short last step has ``floor(left / micro_batches)`` samples per micro-batch,
  so fewer samples than the step's micro-batches are left out.
* :func:`remaining_epochs_until` replaces ``range(epochs)``: after a restart
  it yields the epochs not yet completed.
* :func:`device` is the replica's device (a GPU, or the CPU): the wrapper
  moves the model there and the loader its batches, so a script's own
  ``.to(device)`` calls find them there already; ``evaluate`` gets the model
  on it.
* ``model.backward(loss)`` is ``loss.backward()`` that also reports the
  loss (for ``steps.csv`` and the divergence rule of
  :mod:`pollux_opt.runtime.divergence`); ``loss.backward()`` works too.
* Mixed precision: give the ``torch.amp.GradScaler`` as ``scaler=``.  Then
  ``model.backward(loss)`` scales the loss itself (pass it unscaled), and the
  usual ``scaler.scale(loss).backward(); scaler.step(optimizer);
  scaler.update()`` works too: in a job the runtime unscales the *reduced*
  gradient once per step, skips a step whose gradient overflowed on every
  replica alike and updates the scale then, so ``scaler.step`` is the
  wrapped ``optimizer.step()`` and ``scaler.update()`` does nothing.  Clip
  with ``max_grad_norm=`` rather than ``scaler.unscale_`` and your own clip.

Run on its own (``python script.py``), nothing changes: the loader is a
``DataLoader``, the wrapper calls the model, the epochs are ``range(epochs)``.
Run by pollux-opt (a workload file's ``"entry": "script.py:main"``, see
``docs/user-jobs.md``), ``main()`` runs in each of the job's worker processes
(and once more in a fresh process to verify completion), and a rescale or
stop checkpoints at a step boundary and ends ``main()``; the next generation
of workers calls it again and resumes.  Code after the loop runs once the
job's completion criteria (metric target, epochs or progress) are met.

Rules for the script: one ElasticDataLoader for training, iterated inside
``remaining_epochs_until``; create the ElasticDataParallel before iterating;
``optimizer.step()`` once per batch; an LR scheduler stepped per batch
advances once per applied optimizer step.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from pollux_opt.runtime.spec import grad_scaler
from pollux_opt.runtime.user_loop import current_loop

__all__ = ["ElasticDataLoader", "ElasticDataParallel", "device", "in_job", "job_config", "remaining_epochs_until"]


def in_job() -> bool:
    """True when the script runs as a pollux-opt job (False: on its own)."""
    return current_loop() is not None


def device():
    """The ``torch.device`` of this replica: its GPU, or the CPU.  On its own:
    the first GPU where torch sees one, else the CPU."""
    import torch

    user_loop = current_loop()
    if user_loop is not None:
        return user_loop.device if user_loop.device is not None else torch.device("cpu")
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def job_config() -> dict:
    """The job spec's ``config`` (a workload job's ``spec.config``); ``{}`` on its own."""
    user_loop = current_loop()
    return {} if user_loop is None else dict(user_loop.spec.config)


class ElasticDataParallel:
    """The model and optimizer of a job (see the module docstring).

    Calls and attributes go to the model (``model(x)``, ``model.train()``,
    ``model.state_dict()``).

    Args:
        model: a ``torch.nn.Module``.
        optimizer: a ``torch.optim.Optimizer`` over its parameters, with the
            learning rate tuned for the job's M0 (``init_batch_size``).
        evaluate: ``model -> float``, the validation metric (deterministic);
            required when the job completes at a metric target.
        scheduler: the script's LR scheduler (checkpointed).
        scaler: a gradient scaler (``torch.amp.GradScaler``: see the module
            docstring) or anything with ``state_dict`` (checkpointed).
        extra: more state to checkpoint, by name: dicts (restored in place) or
            objects with ``state_dict()`` and ``load_state_dict()``.
        max_grad_norm: optional clip of the averaged gradient's norm.
    """

    def __init__(self, model, optimizer, *, evaluate: Callable[[Any], float] | None = None, scheduler=None,
                 scaler=None, extra: Mapping[str, Any] | None = None, max_grad_norm: float | None = None) -> None:
        amp = grad_scaler(scaler)
        self.__dict__.update(module=model, optimizer=optimizer, _loss=None, _loop=current_loop(), _amp=amp)
        user_loop = self._loop
        if user_loop is None:
            return
        user_loop.attach(model, optimizer, evaluate=evaluate, scheduler=scheduler, scaler=scaler,
                                 extra=extra, max_grad_norm=max_grad_norm)
        real_step = optimizer.step  # the trainer keeps it
        state = self.__dict__
        micro_done = user_loop.micro_done

        def step(closure=None):
            if closure is not None:
                raise ValueError("optimizer.step(closure) is not supported in a pollux-opt job")
            loss, state["_loss"] = state["_loss"], None
            micro_done(loss)

        if hasattr(real_step, "_wrapped_by_lr_sched"):
            step._wrapped_by_lr_sched = True  # torch's LR schedulers check that they wrapped optimizer.step
        optimizer.step = step
        optimizer.zero_grad = _zero_grad(optimizer)
        if scheduler is not None:
            real = scheduler.step

            def scheduler_step(*args, **kwargs):
                if user_loop.plan is not None:
                    return None  # between the micro-batches of a step: the step is not applied yet
                return real(*args, **kwargs)

            scheduler.step = scheduler_step
        if amp is not None:
            _take_over_scaler(amp, optimizer)

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["module"], name)

    def backward(self, loss) -> None:
        """``loss.backward()``, reporting the (mean) loss of the micro-batch; with a
        gradient scaler, of the loss it scales."""
        self.__dict__["_loss"] = loss.detach()
        amp = self.__dict__["_amp"]
        (loss if amp is None else amp.scale(loss)).backward()


def _take_over_scaler(scaler, optimizer) -> None:
    """A job's runtime unscales, skips and updates once per step (the trainer
    kept the scaler's own methods): the script's per-batch calls are taken over."""

    def step(opt, *args, **kwargs):
        if opt is not optimizer:
            raise ValueError("scaler.step() must be given the optimizer of the ElasticDataParallel")
        return opt.step()

    def unscale_(opt):
        raise RuntimeError("in a pollux-opt job the runtime unscales the reduced gradient once per step: clip with "
                           "ElasticDataParallel(max_grad_norm=...) instead of scaler.unscale_()")

    scaler.step, scaler.update, scaler.unscale_ = step, lambda new_scale=None: None, unscale_


def _zero_grad(optimizer):
    """``optimizer.zero_grad`` without its profiler bookkeeping (about 0.3 ms
    per call on a small model): the wrapper already drops each micro-batch's
    gradients, so a script's call per batch finds nothing to clear."""
    real = optimizer.zero_grad
    params = [p for group in optimizer.param_groups for p in group["params"]]

    def zero_grad(set_to_none: bool = True) -> None:
        if not set_to_none:
            return real(set_to_none=False)
        for p in params:
            p.grad = None
        return None

    return zero_grad


class ElasticDataLoader:
    """A data loader over a map-style dataset whose batch the job owns (see the module docstring).

    Args:
        dataset: a map-style ``torch.utils.data.Dataset`` (``len`` and ``[i]``).
        batch_size: the script's batch size (used when run on its own; in a
            job, the job's batch configuration decides).
        shuffle: a seeded permutation per epoch (the job's seed and the epoch).
        collate_fn, num_workers, **loader_kwargs: passed to ``DataLoader``.
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, *, collate_fn=None,
                 num_workers: int = 0, **loader_kwargs) -> None:
        self.dataset, self.batch_size, self.shuffle = dataset, batch_size, shuffle
        self.loader_kwargs = dict(loader_kwargs, collate_fn=collate_fn, num_workers=num_workers)
        user_loop = current_loop()
        if user_loop is not None:
            user_loop.train_size = len(dataset)

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def __iter__(self) -> Iterator:
        user_loop = current_loop()
        if user_loop is None:
            from torch.utils.data import DataLoader

            return iter(DataLoader(self.dataset, batch_size=self.batch_size, shuffle=self.shuffle,
                                   **self.loader_kwargs))
        from pollux_opt.runtime.user_loop import epoch_batches

        return epoch_batches(user_loop, self.dataset, self.shuffle, self.loader_kwargs)


def remaining_epochs_until(epochs: int) -> Iterator[int]:
    """The epochs ``0 .. epochs - 1`` not completed yet (all of them on a fresh start).

    In a job whose spec sets ``epochs``, the spec's number is the limit if it is smaller.
    """
    user_loop = current_loop()
    if user_loop is None:
        yield from range(epochs)
        return
    while user_loop.epochs_left(epochs):
        yield user_loop.trainer.state.epoch
