"""The state a checkpoint restores (:class:`TrainingState`), the runtime's data
order (:class:`EpochSampler`) and the helpers that make a resumed run draw what
an uninterrupted one would (RNG state, parameter checksums).

Shared by the two ways to define a job: the builder protocol's loop
(:class:`~pollux_opt.runtime.trainer.Trainer`) and a user's own loop
(:mod:`pollux_opt.elastic`, through :mod:`~pollux_opt.runtime.user_loop`).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, fields

from pollux_opt.agent.measurements import profile_from_json, profile_to_json
from pollux_opt.agent.stats import GradStatsEMA

__all__ = ["EVAL_HISTORY_KEPT", "EpochSampler", "TrainingState", "param_checksum", "restore_rng", "rng_state",
           "step_seed"]

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
    #: On a cluster of several node types: node type -> the profile of the steps run there.
    type_profiles: dict = field(default_factory=dict)
    ema: GradStatsEMA = field(default_factory=GradStatsEMA)
    params: dict | None = None
    #: A user's loop (:mod:`pollux_opt.elastic`): epochs completed and samples
    #: taken in the current one (the builder protocol streams across epochs).
    epoch: int = 0
    epoch_pos: int = 0
    #: The divergence rule (:mod:`~pollux_opt.runtime.divergence`): the first
    #: report's mean training loss and the consecutive reports above its bound.
    loss_ref: float | None = None
    diverging_reports: int = 0

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(
            eval_history=list(self.eval_history), profile=profile_to_json(self.profile),
            type_profiles={t: profile_to_json(p) for t, p in self.type_profiles.items()}, ema=self.ema.state(),
        )
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "TrainingState":
        # target_reached stays False: completion is re-decided by the next
        # evaluation after a resume (a final checkpoint is only resumed when its
        # verification failed).
        return cls(
            step=int(data["step"]), samples=int(data["samples"]), progress=float(data["progress"]),
            train_seconds=float(data["train_seconds"]), next_eval=float(data["next_eval"]),
            metric=data.get("metric"), eval_history=[list(row) for row in data.get("eval_history", [])],
            profile=profile_from_json(data.get("profile")),
            type_profiles={str(t): profile_from_json(p) for t, p in (data.get("type_profiles") or {}).items()},
            ema=GradStatsEMA.from_state(data["ema"]), params=data.get("params"),
            epoch=int(data.get("epoch", 0)), epoch_pos=int(data.get("epoch_pos", 0)),
            diverging_reports=int(data.get("diverging_reports", 0)), loss_ref=data.get("loss_ref"),
        )


class EpochSampler:
    """Seeded permutation per epoch; ``take(pos, count)`` is the sample stream at ``pos``."""

    def __init__(self, torch, size: int, seed: int) -> None:
        self._torch = torch
        self.size = size
        self.seed = seed
        self._epoch = -1
        self._perm = None

    def permutation(self, epoch: int):
        """The order of the samples in ``epoch`` (an int64 tensor of ``size``)."""
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
            chunks.append(self.permutation(epoch)[offset : offset + n])
            pos += n
            count -= n
        return chunks[0] if len(chunks) == 1 else self._torch.cat(chunks)


def step_seed(seed: int, step: int, rank: int) -> int:
    """The CPU generator's seed for ``step`` on ``rank`` (dropout etc.), so that a
    resumed run draws what an uninterrupted one would."""
    return (seed * _SEED_MIX_A + step * _SEED_MIX_B + rank) % _SEED_MOD


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
