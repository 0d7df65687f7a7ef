"""A replica's device: one CPU core or one GPU, and what follows from it.

A node type's slots are CPU cores or GPUs (``NodeType.slot``,
:mod:`pollux_opt.model.cluster_types`).  A replica on a GPU slot runs in a
process that sees only its GPU: the local backend's worker sets
``CUDA_VISIBLE_DEVICES`` to that one device before CUDA starts in the process
(:class:`GpuBinding`); Ray does the same for an actor that holds ``num_gpus=1``.  The replica's model, batches and
optimizer state live on its device (:func:`to_device`), and a job whose
replicas are all on GPUs reduces its gradients with NCCL, any other with gloo
(:func:`collective_backend`).

Checkpoints hold whatever device the tensors were on; they are read onto the
CPU (``map_location``) and copied into the replica's parameters and optimizer
state on its device (its generators are seeded per step), so a job moves
between GPUs and CPU cores and resumes at the same step
(:func:`~pollux_opt.runtime.checkpoint.load_payload`).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

__all__ = ["CUDA", "GpuBinding", "broadcast_from_rank0", "collective_backend", "machine_gpus", "to_device"]

#: torch's device type of a GPU replica.
CUDA = "cuda"
#: The environment variable that restricts a process to some GPUs (CUDA's own).
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def collective_backend(gpus: Sequence[int | None] | None) -> str:
    """``"nccl"`` for a job whose every replica has a GPU (``gpus``: one entry
    per rank, None for a CPU replica), else ``"gloo"`` (CPU replicas, or a job
    over both kinds: its collectives go through host memory)."""
    return "nccl" if gpus and all(g is not None for g in gpus) else "gloo"


def broadcast_from_rank0(dist, tensor, backend: str, collective) -> None:
    """Rank 0's ``tensor`` to every rank, in place, through ``collective`` (the
    runtime's wrapper of a collective call); under gloo a GPU tensor goes
    through a host copy (a job over GPUs and CPU cores)."""
    if backend == "nccl" or tensor.device.type == "cpu":
        collective(dist.broadcast, tensor, src=0)
        return
    host = tensor.cpu()
    collective(dist.broadcast, host, src=0)
    tensor.copy_(host)


def machine_gpus() -> int:
    """GPUs torch sees on this machine (0 without torch, or without a CUDA build or driver).

    ``torch.cuda.device_count()``, which asks NVML where it can rather than
    starting CUDA in this process.  (The workers that bind a GPU are forked
    from the pool's fork server, never from the process that counts.)
    """
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count())


def to_device(obj: Any, device) -> Any:
    """``obj`` with every tensor in it (nested in tuples, lists and dicts) on
    ``device``; anything else unchanged.  A tensor already there is not copied."""
    if hasattr(obj, "to") and hasattr(obj, "device") and hasattr(obj, "dtype"):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(to_device(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


class GpuBinding:
    """The device of a worker process, which may serve many assignments: a GPU
    slot's index binds the process to that GPU for its life (CUDA reads
    ``CUDA_VISIBLE_DEVICES`` once, when it starts).

    Args:
        environ: the process's environment (read for the GPUs the machine's
            user made visible, written with the one this process uses).
    """

    def __init__(self, environ=os.environ) -> None:
        self._environ = environ
        visible = environ.get(VISIBLE_DEVICES)
        #: The machine's GPUs as torch numbers them in the parent: their
        #: ``CUDA_VISIBLE_DEVICES`` entries (None: all of them, by index).
        self._visible = None if visible is None else [v.strip() for v in visible.split(",") if v.strip()]
        #: The GPU this process is bound to (None: none yet).
        self.gpu: int | None = None

    def device(self, torch, gpu: int | None):
        """The torch device of an assignment on GPU ``gpu`` (None: a CPU
        replica), numbered as torch numbers the GPUs the process sees before
        it is bound (a Ray actor holding one GPU sees only it: 0).

        Raises:
            RuntimeError: ``gpu`` differs from the GPU this process is bound to
                (the pool never asks that), or is not one it sees.
        """
        if gpu is None:
            return torch.device("cpu")
        if self._visible is not None and not 0 <= gpu < len(self._visible):
            raise RuntimeError(f"GPU {gpu} is not one of the {len(self._visible)} visible "
                               f"({VISIBLE_DEVICES}={','.join(self._visible)})")
        wanted = str(gpu) if self._visible is None else self._visible[gpu]
        if self._environ.get(VISIBLE_DEVICES) != wanted:
            if self.gpu is not None or torch.cuda.is_initialized():
                bound = f"GPU {self.gpu}" if self.gpu is not None else "another GPU"
                raise RuntimeError(f"this worker process is bound to {bound}; it cannot serve GPU {gpu}")
            self._environ[VISIBLE_DEVICES] = wanted
        self.gpu = gpu
        device = torch.device(CUDA, 0)
        torch.cuda.set_device(device)
        return device
