"""The sample order of :class:`pollux_opt.elastic.ElasticDataLoader` in a job:
which samples each replica's micro-batches of each step hold.

An epoch is a permutation of the dataset (seeded by the job's seed and the
epoch, :class:`~pollux_opt.runtime.state.EpochSampler`, or the identity
without ``shuffle``).  A step at position ``pos`` of the epoch with ``n =
world * (accum_steps + 1)`` micro-batches of ``b`` samples takes the
permutation's ``[pos, pos + n * b)``; micro-batch ``j`` of rank ``r`` is the
slice starting at ``pos + (r * (accum_steps + 1) + j) * b``, the layout of the
builder protocol's steps.  The epoch's short last step uses ``b =
floor(left / n)`` and, when that is 0, the epoch ends.  The position is part
of the checkpointed state, so a resumed job, on any number of replicas,
continues with the next sample: none is seen twice, none skipped but those
left at an epoch's end.

The index lists are made by a ``batch_sampler`` of a ``torch.utils.data.DataLoader``
(so ``collate_fn``, ``num_workers`` and the other options work as usual,
worker processes prefetching); it assumes the batch configuration of the step
it starts at, and is replaced when a step brings another configuration.
Without worker processes or other options the batches are fetched as the
``DataLoader`` would (``dataset.__getitems__(indices)`` if the dataset has
it, else one ``dataset[i]`` per index, then ``collate_fn``) without its
iterator, whose bookkeeping per batch costs about a tenth of a millisecond.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from pollux_opt.runtime.state import EpochSampler

__all__ = ["StepBatches", "epoch_batches", "micro_size"]

#: ``ElasticDataLoader`` options that the in-thread fetch serves (any other needs a ``DataLoader``).
_DIRECT_OPTIONS = frozenset({"collate_fn", "num_workers", "drop_last"})


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


def _is_direct(loader_kwargs: Mapping[str, Any]) -> bool:
    """True when the in-thread fetch serves these ``ElasticDataLoader`` options (see the module docstring)."""
    return not loader_kwargs.get("num_workers") and set(k for k, v in loader_kwargs.items() if v) <= _DIRECT_OPTIONS


def _loader(dataset, sampler: StepBatches, loader_kwargs: Mapping[str, Any]) -> Iterator:
    import torch
    from torch.utils.data import DataLoader

    kwargs = {k: v for k, v in loader_kwargs.items() if k != "drop_last"}  # with a batch_sampler, the sampler's
    # Its own generator: a DataLoader draws a seed when it starts, which must
    # not shift the step's seeded stream (dropout) of the script.
    return iter(DataLoader(dataset, batch_sampler=sampler, generator=torch.Generator(), **kwargs))


def epoch_batches(user_loop, dataset, shuffle: bool, loader_kwargs: Mapping[str, Any]) -> Iterator:
    """The micro-batches of the rest of the current epoch on this rank (see the module docstring)."""
    import torch

    trainer = user_loop.attached()
    state, spec = trainer.state, user_loop.spec
    size = len(dataset)
    order = EpochSampler(torch, size, spec.seed).permutation(state.epoch) if shuffle else torch.arange(size)
    if _is_direct(loader_kwargs):
        return _direct_batches(user_loop, dataset, order, loader_kwargs.get("collate_fn"))
    return _loader_batches(user_loop, dataset, order, loader_kwargs)


def _steps(user_loop, size: int) -> Iterator[int]:
    """Begin each step of the rest of the epoch and yield its micro-batch size;
    end the epoch after its last step."""
    state = user_loop.trainer.state
    while True:
        b = user_loop.begin_step(size - state.epoch_pos)
        if b == 0:
            user_loop.end_epoch()
            return
        yield b
        if user_loop.plan is not None:
            raise RuntimeError("call optimizer.step() once for every batch of an ElasticDataLoader")


def _direct_batches(user_loop, dataset, order, collate_fn) -> Iterator:
    """The micro-batches of :func:`epoch_batches` fetched in this thread, as a
    ``DataLoader`` without worker processes would fetch the index lists of
    :class:`StepBatches`, in one generator (each layer of generators would be
    paid in every micro-batch)."""
    if collate_fn is None:
        from torch.utils.data import default_collate as collate_fn
    getitems = getattr(dataset, "__getitems__", None)
    state, rank = user_loop.trainer.state, user_loop.rank
    order = order.numpy()  # its slices and lists cost a fraction of a tensor's
    for b in _steps(user_loop, len(order)):
        micro_n = user_loop.plan[1] + 1
        first = state.epoch_pos + rank * micro_n * b  # the layout of StepBatches
        for _ in range(micro_n):
            idx = order[first : first + b].tolist()
            yield collate_fn(getitems(idx) if getitems else [dataset[i] for i in idx])
            first += b


def _loader_batches(user_loop, dataset, order, loader_kwargs: Mapping[str, Any]) -> Iterator:
    """The micro-batches of :func:`epoch_batches` from a ``DataLoader`` over
    :class:`StepBatches`, replaced when a step brings another batch configuration."""
    state = user_loop.trainer.state
    it, expected = None, None
    for b in _steps(user_loop, len(order)):
        m, s, _ = user_loop.plan
        if it is None or expected != (state.epoch_pos, m, s):
            it = _loader(dataset, StepBatches(order, state.epoch_pos, user_loop.world, user_loop.rank, m, s),
                         loader_kwargs)
        expected = (state.epoch_pos + user_loop.world * (s + 1) * b, m, s)
        for _ in range(s + 1):
            yield next(it)
