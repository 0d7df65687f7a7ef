"""Measured step times per batch configuration: the typed key of a
configuration, the per-step aggregates rank 0 keeps, and the rows a throughput
fit reads.

A *configuration* is ``(N, K, m, s)``: N nodes, K replicas, local micro-batch
m (samples), s extra accumulation micro-batches per optimizer step
(:class:`ConfigKey`).  In memory every key is a :class:`ConfigKey`; on disk and
in JSON (checkpoint metadata, the torch checkpoint payload) it is the string
``"N,K,m,s"``, so files written before keys were typed still read.

The *profile* of a job is ``{ConfigKey: aggregate}``, an aggregate being
``{"count", "step", "sync", "compute", "recent"}``: the number of measured
steps, the sums of their step, sync and compute seconds, and ``recent``, the
``[step, sync, compute]`` seconds of the last :data:`PROFILE_WINDOW` steps.
Rank 0 adds a step with :func:`record_step`; :meth:`Measurements.from_profile`
turns a profile into one row per configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Iterable, Mapping, NamedTuple

import numpy as np

from solvers import InvalidProblem

from pollux_opt.model import ThroughputParams

__all__ = [
    "PROFILE_WINDOW",
    "STEP_TIME_QUANTILE",
    "ConfigKey",
    "Measurements",
    "profile_from_json",
    "profile_to_json",
    "record_step",
]

#: Recent steps kept per configuration in the profile; a configuration's time
#: is a low quantile of them (:data:`STEP_TIME_QUANTILE`), which ignores the
#: occasional step stretched by another process taking the core (the sums of
#: all steps are kept too).
PROFILE_WINDOW = 64

#: Quantile of recent step times that represents a configuration.  Other
#: processes taking the core only ever lengthen a step, so on a shared machine a
#: low quantile estimates a configuration's own cost better than the mean or
#: median (the same reasoning as timeit's advice to use the minimum); the lower
#: quartile rather than the minimum keeps it insensitive to a few lucky steps.
STEP_TIME_QUANTILE = 0.25


class ConfigKey(NamedTuple):
    """A measured configuration ``(N, K, m, s)``; ``str(key)`` is its JSON form ``"N,K,m,s"``.

    Keys order as tuples of integers (by nodes, then replicas, local batch and
    accumulation steps).
    """

    num_nodes: int
    num_replicas: int
    local_bsz: int
    accum_steps: int = 0

    def __str__(self) -> str:
        return f"{self.num_nodes},{self.num_replicas},{self.local_bsz},{self.accum_steps}"

    @classmethod
    def parse(cls, text: str) -> "ConfigKey":
        """The key written as ``"N,K,m,s"``; raises InvalidProblem naming ``text`` otherwise."""
        parts = text.split(",") if isinstance(text, str) else ()
        try:
            if len(parts) != 4:
                raise ValueError
            return cls(*(int(p) for p in parts))
        except ValueError:
            raise InvalidProblem(f"configuration key must be 'N,K,m,s' (four integers), got {text!r}") from None

    @classmethod
    def of(cls, key: "ConfigKey | str") -> "ConfigKey":
        """``key`` as a :class:`ConfigKey` (parsed when it is a string)."""
        return key if isinstance(key, ConfigKey) else cls.parse(key)


def record_step(profile: dict, key: ConfigKey, step_time: float, sync_time: float, compute_time: float) -> None:
    """Add one measured step (seconds) of configuration ``key`` to ``profile`` (in place)."""
    agg = profile.setdefault(key, {"count": 0, "step": 0.0, "sync": 0.0, "compute": 0.0, "recent": []})
    agg["count"] += 1
    agg["step"] += step_time
    agg["sync"] += sync_time
    agg["compute"] += compute_time
    recent = agg.setdefault("recent", [])
    recent.append([step_time, sync_time, compute_time])
    if len(recent) > PROFILE_WINDOW:
        del recent[0]


def profile_to_json(profile: Mapping[ConfigKey, Mapping[str, Any]]) -> dict[str, dict]:
    """The profile with ``"N,K,m,s"`` string keys (for JSON and the checkpoint payload)."""
    return {str(ConfigKey.of(key)): dict(agg) for key, agg in profile.items()}


def profile_from_json(data: Mapping[str, Mapping[str, Any]] | None) -> dict[ConfigKey, dict]:
    """The profile read back from :func:`profile_to_json` (string or typed keys)."""
    return {ConfigKey.of(key): dict(agg) for key, agg in (data or {}).items()}


@dataclass(frozen=True)
class Measurements:
    """Measured step times per executed configuration (one row each).

    All arrays have one entry per configuration (N, K, m, s) the job ran;
    ``step_time`` is the wall time of an optimizer step on rank 0 (seconds;
    lower quartile of recent steps, see :data:`STEP_TIME_QUANTILE`), ``sync_time`` that of its collectives
    (seconds, ``nan`` when K == 1), ``compute_time`` that of its forward and
    backward passes (seconds, ``nan`` where not measured), ``count`` the number
    of steps measured.
    """

    num_nodes: np.ndarray
    num_replicas: np.ndarray
    local_bsz: np.ndarray
    accum_steps: np.ndarray
    step_time: np.ndarray
    sync_time: np.ndarray
    compute_time: np.ndarray
    count: np.ndarray

    @classmethod
    def from_profile(cls, profile: Mapping[ConfigKey | str, Mapping[str, Any]]) -> "Measurements":
        """From a profile (see the module docstring; string keys are parsed), in key order.

        Times are the :data:`STEP_TIME_QUANTILE` of ``recent`` when present,
        else the means of all steps; configurations with no step are left out.
        """
        rows = []
        for key, agg in sorted(((ConfigKey.of(k), v) for k, v in profile.items()), key=lambda kv: kv[0]):
            count = agg["count"]
            if count <= 0:
                continue
            recent = agg.get("recent")
            if recent:
                step, sync, compute = (
                    float(v) for v in np.quantile(np.asarray(recent, dtype=float), STEP_TIME_QUANTILE, axis=0)
                )
            else:
                step, sync, compute = agg["step"] / count, agg["sync"] / count, agg["compute"] / count
            rows.append((*key, step, sync if key.num_replicas > 1 else math.nan, compute, count))
        return cls._of_rows(rows)

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[ConfigKey, float, float]]) -> "Measurements":
        """From ``(key, step_time, sync_time)`` rows, one step each, in the given
        order (the simulator's reports: no compute time)."""
        return cls._of_rows([(*key, step, sync, math.nan, 1) for key, step, sync in rows])

    @classmethod
    def _of_rows(cls, rows: list[tuple]) -> "Measurements":
        cols = list(zip(*rows)) if rows else [()] * 8
        dtypes = (np.int64,) * 4 + (np.float64,) * 3 + (np.int64,)
        return cls(*(np.asarray(col, dtype=dt) for col, dt in zip(cols, dtypes)))

    def __len__(self) -> int:
        return int(self.num_nodes.shape[0])

    def keys(self) -> list[ConfigKey]:
        """The configuration of each row, in row order."""
        return [ConfigKey(*map(int, row)) for row in
                zip(self.num_nodes, self.num_replicas, self.local_bsz, self.accum_steps)]

    def count_of(self, key: ConfigKey) -> int:
        """Steps measured at configuration ``key`` (0 if it has no row)."""
        for row, count in zip(self.keys(), self.count):
            if row == key:
                return int(count)
        return 0

    def take(self, index) -> "Measurements":
        """The rows at ``index`` (an integer array, in its order, or a bool mask)."""
        return Measurements(*(getattr(self, f.name)[index] for f in fields(self)))

    def read_only(self) -> "Measurements":
        """These rows with every array marked read-only (for sharing between reports)."""
        for f in fields(self):
            getattr(self, f.name).flags.writeable = False
        return self

    @property
    def batch_size(self) -> np.ndarray:
        """Total batch M = K m (s + 1) of each row."""
        return self.num_replicas * self.local_bsz * (self.accum_steps + 1)

    def fit(self) -> ThroughputParams | None:
        """Throughput parameters fitted to these rows (None if there are none)."""
        from pollux_opt.model import fit_throughput

        if len(self) == 0:
            return None
        return fit_throughput(
            self.num_nodes, self.num_replicas, self.local_bsz, self.step_time,
            np.nan_to_num(self.sync_time, nan=0.0), accum_steps=self.accum_steps,
        )

