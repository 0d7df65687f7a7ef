"""The hidden "true" behaviour of a simulated job: measured or synthetic profiles.

A :class:`Profile` answers what a real job would do at a configuration:

- ``step_sync(placement, local_bsz)``: seconds per optimizer step (one
  micro-batch, no accumulation) and the part spent synchronising gradients,
  for ``placement`` = replicas per node (a tuple of positive ints);
- ``grad_stats(batch_size, epoch)``: (grad_sqr, grad_var) measured during an
  epoch when training at total batch ``batch_size`` (grad_var at M0; an
  array of batch sizes gives arrays);
- ``progress_at(epoch)``: cumulative scale-invariant progress (optimizer steps
  at M0, AdaScale units) at the end of ``epoch`` epochs; the job completes after
  ``max_epochs`` epochs;
- ``iterations(batch_size, epoch)``: optimizer steps at a fixed batch size to
  finish ``epoch`` epochs (Optimus' oracle of remaining work).

Sources: :class:`TraceProfile` (measured tables, read from profile folders by
:mod:`pollux_opt.backends.sim.profile_files`), :class:`ParametricProfile`
(synthetic, for scaling studies); on a cluster of several node types, an
application's truth is ``{type: Profile}`` (per-type step times and batch caps
over shared gradient statistics and progress: statistical efficiency does not
depend on the device).

The policy never sees a profile: the simulation backend reports only the
measurements at placements a job actually ran (see
:mod:`pollux_opt.backends.sim.backend`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, Sequence, runtime_checkable

import numpy as np
import pandas as pd

from solvers import InvalidProblem

from pollux_opt.model.domains import REQUIRED, Integer, Real, Text, check_fields, domain_field

__all__ = [
    "APP_SETTINGS", "AppSettings", "ParametricProfile", "Profile", "TraceProfile", "default_trace_dir",
]

#: Environment variable that overrides the default trace folder.
TRACE_DIR_ENV = "POLLUX_OPT_TRACES"


@dataclass(frozen=True)
class AppSettings:
    """Per-application settings of the paper's simulator (artifact README).

    Attributes:
        max_epochs: epochs of progress to complete the job.
        max_local_bsz: largest per-replica micro-batch (None: largest measured).
    """

    max_epochs: int | None = None
    max_local_bsz: int | None = None


#: Settings used in Pollux's simulator (shared/traces/adaptdl-osdi21/README.md).
APP_SETTINGS: Mapping[str, AppSettings] = {
    "bert": AppSettings(max_epochs=2),
    "cifar10": AppSettings(max_epochs=100),
    "ncf": AppSettings(max_epochs=10),
    "imagenet": AppSettings(max_epochs=90),
    "deepspeech2": AppSettings(max_epochs=80),
    "yolov3": AppSettings(max_epochs=50, max_local_bsz=8),
}


def default_trace_dir() -> Path:
    """``$POLLUX_OPT_TRACES`` if set, else ``<repo>/../shared/traces/adaptdl-osdi21``."""
    env = os.environ.get(TRACE_DIR_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[4] / "shared" / "traces" / "adaptdl-osdi21"


@runtime_checkable
class Profile(Protocol):
    """True behaviour of one application (see the module docstring)."""

    name: str
    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int
    max_epochs: int

    def step_sync(self, placement: tuple[int, ...], local_bsz: int) -> tuple[float, float]: ...

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]: ...

    def progress_at(self, epoch: int) -> float: ...

    def iterations(self, batch_size: float, epoch: int) -> float: ...


def _canonical(placement: Sequence[int]) -> tuple[int, ...]:
    """Non-zero counts rotated to the lexicographically smallest rotation (artifact key)."""
    p = tuple(int(x) for x in placement if x)
    if not p:
        raise InvalidProblem(f"placement must have at least one replica, got {placement!r}")
    return min(p[i:] + p[:i] for i in range(len(p)))


def _interp_extrap(x: float, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Piecewise-linear in x over sorted ``xs`` (rows of ``ys``), linear beyond the ends."""
    if xs.size == 1:
        return ys[0] * (x / xs[0])
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, xs.size - 2))
    w = (x - xs[i]) / (xs[i + 1] - xs[i])
    return ys[i] + w * (ys[i + 1] - ys[i])


@dataclass(eq=False)
class TraceProfile:
    """A profile of measured tables (one application folder, or one node type of it).

    Step times come from ``placements.csv`` where the placement (up to rotation,
    then up to order) was measured, interpolated linearly in the local batch
    size; otherwise from a linear interpolation over (num_nodes, num_replicas,
    local_bsz) of all rows of ``placements.csv`` (averaged per key) and
    ``scalability.csv``, with the nearest row outside their convex hull.
    Gradient statistics and iteration counts interpolate linearly between the
    validated batch sizes (clamped to the smallest and largest), as in the
    artifact's ``applications.py``.
    """

    name: str
    placements: pd.DataFrame
    scalability: pd.DataFrame
    validation: dict[int, pd.DataFrame]
    max_epochs: int
    max_local_bsz: int
    init_batch_size: int = 0
    max_batch_size: int = 0
    min_local_bsz: int = 0
    _by_placement: dict = field(default_factory=dict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)
    _nd: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.validation = dict(sorted(self.validation.items()))
        self.init_batch_size = int(min(self.validation))
        self.max_batch_size = int(max(self.validation))
        self.min_local_bsz = int(self.placements.local_bsz.min())
        # One mean per (placement, local_bsz), by placement, in increasing local_bsz.
        means = self.placements.groupby(["placement", "local_bsz"], as_index=False)[["step_time", "sync_time"]].mean()
        for key, rows in means.groupby("placement"):
            times = rows[["step_time", "sync_time"]].to_numpy(float)
            self._by_placement[tuple(int(c) for c in str(key))] = (rows.local_bsz.to_numpy(float), times)
        self._bsz = np.array(sorted(self.validation), dtype=float)
        n_epochs = min(len(df) for df in self.validation.values())
        if self.max_epochs > n_epochs:
            raise InvalidProblem(f"profile {self.name!r}: max_epochs={self.max_epochs} exceeds the {n_epochs} "
                                 "validated epochs")
        cols = lambda c: np.stack([df[c].to_numpy(float)[:n_epochs] for df in self.validation.values()])  # noqa: E731
        self._iter, self._sqr, self._var = cols("iteration"), cols("grad_sqr"), cols("grad_var")
        self._progress = cols("progress").min(axis=0)

    # --------------------------------------------------------------- throughput
    def _nd_interp(self):
        if self._nd is None:
            from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator
            from scipy.spatial import QhullError

            p = self.placements.copy()
            p["num_nodes"] = p.placement.astype(str).str.len()
            p["num_replicas"] = p.placement.astype(str).map(lambda s: sum(map(int, s)))
            xs = ["num_nodes", "num_replicas", "local_bsz"]
            ys = ["step_time", "sync_time"]
            df = pd.concat(
                [p.groupby(xs, as_index=False)[ys].mean(), self.scalability[xs + ys]],
                ignore_index=True,
            )
            pts, vals = df[xs].to_numpy(float), df[ys].to_numpy(float)
            # Only the coordinates that vary span a hull (e.g. one node only, as
            # profiles exported from a single machine): interpolate over those;
            # with fewer than two, nearest rows only.
            varying = np.ptp(pts, axis=0) > 0
            linear = None
            if varying.sum() >= 2:
                try:
                    linear = LinearNDInterpolator(pts[:, varying], vals)
                except QhullError:  # degenerate (e.g. collinear) points: nearest rows only
                    linear = None
            self._nd = (linear, NearestNDInterpolator(pts, vals), float(df.num_nodes.max()), varying)
        return self._nd

    def _nk_table(self, nodes: int, replicas: int):
        """(local_bsz grid, [step, sync] rows) of an unmeasured placement shape.

        One linear interpolation over (nodes, replicas, local_bsz) at every
        measured local batch size (nearest row outside the convex hull), then
        1-D in the local batch: far cheaper than a 3-D lookup per query.
        """
        key = ("nk", nodes, replicas)
        hit = self._cache.get(key)
        if hit is None:
            linear, nearest, max_nodes, varying = self._nd_interp()
            grid = np.unique(self.placements.local_bsz.to_numpy(float))
            x = np.column_stack([np.full(grid.size, min(nodes, max_nodes)), np.full(grid.size, replicas), grid])
            vals = linear(x[:, varying]) if linear is not None else np.full((grid.size, 2), np.nan)
            bad = ~np.isfinite(vals).all(axis=1)
            if bad.any():
                vals[bad] = nearest(x[bad])
            hit = self._cache[key] = (grid, vals)
        return hit

    def step_sync(self, placement, local_bsz):
        key = (_canonical(placement), int(local_bsz))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        p = key[0]
        measured = (self._by_placement.get(c) for c in (p, tuple(sorted(p, reverse=True)), tuple(sorted(p))))
        table = next((t for t in measured if t is not None), None) or self._nk_table(len(p), sum(p))
        step, sync = _interp_extrap(float(local_bsz), *table)
        step = max(float(step), 1e-9)
        sync = float(np.clip(sync, 0.0, step))
        self._cache[key] = (step, sync)
        return step, sync

    # ------------------------------------------------------------- statistics
    def _between(self, table: np.ndarray, batch_size, epoch: int):
        e = min(max(int(epoch), 0), table.shape[1] - 1)
        return np.interp(batch_size, self._bsz, table[:, e])

    def grad_stats(self, batch_size, epoch):
        if np.ndim(batch_size):  # many batch sizes at once (a table): arrays, not cached
            return self._between(self._sqr, batch_size, epoch), self._between(self._var, batch_size, epoch)
        key = ("grad_stats", batch_size, epoch)  # asked again every step of an epoch: cached
        if key not in self._cache:
            self._cache[key] = (float(self._between(self._sqr, batch_size, epoch)),
                                float(self._between(self._var, batch_size, epoch)))
        return self._cache[key]

    def progress_at(self, epoch):
        return 0.0 if epoch <= 0 else float(self._progress[min(epoch, self._progress.size) - 1])

    def iterations(self, batch_size, epoch):
        return 0.0 if epoch <= 0 else float(self._between(self._iter, batch_size, epoch - 1))


#: Step-time coefficients (seconds, seconds per sample), progress per epoch and noise scales.
_COEFFICIENT = Real(ge=0)
#: Batch sizes (samples) and epochs.
_SIZE = Integer(ge=1)


@dataclass(frozen=True)
class ParametricProfile:
    """A synthetic application whose truth is the Pollux step-time model itself.

    Step time of one micro-batch: ``t_c = alpha_c + beta_c * m``; sync time
    ``alpha + beta * max(K - 2, 0)`` (intra-node ``alpha_n, beta_n`` on one node,
    inter-node ``alpha_r, beta_r`` on several, 0 for K = 1); the step combines
    them with overlap exponent ``gamma`` (Pollux, section 3.2).  The gradient
    noise scale grows geometrically from ``noise_start`` to ``noise_end``
    (units of M0) over training, as measured noise scales do; ``grad_sqr`` is 1.
    Every epoch is ``epoch_progress`` units of progress (steps at M0).
    """

    name: str = domain_field(REQUIRED, Text())
    alpha_c: float = domain_field(0.05, _COEFFICIENT)
    beta_c: float = domain_field(0.002, _COEFFICIENT)
    alpha_n: float = domain_field(0.005, _COEFFICIENT)
    beta_n: float = domain_field(0.001, _COEFFICIENT)
    alpha_r: float = domain_field(0.05, _COEFFICIENT)
    beta_r: float = domain_field(0.005, _COEFFICIENT)
    gamma: float = domain_field(2.0, Real(ge=1, le=10))
    init_batch_size: int = domain_field(128, _SIZE)
    max_batch_size: int = domain_field(4096, _SIZE)
    min_local_bsz: int = domain_field(16, _SIZE)
    max_local_bsz: int = domain_field(256, _SIZE)
    max_epochs: int = domain_field(20, _SIZE)
    noise_start: float = domain_field(1.0, Real(gt=0))
    noise_end: float = domain_field(20.0, _COEFFICIENT)
    epoch_progress: float = domain_field(400.0, _COEFFICIENT)

    def step_sync(self, placement, local_bsz):
        p = _canonical(placement)
        nodes, k = len(p), sum(p)
        t_c = self.alpha_c + self.beta_c * float(local_bsz)
        if k == 1:
            return t_c, 0.0
        a, b = (self.alpha_r, self.beta_r) if nodes > 1 else (self.alpha_n, self.beta_n)
        t_s = a + b * max(k - 2, 0)
        return (t_c**self.gamma + t_s**self.gamma) ** (1.0 / self.gamma), t_s

    def _noise(self, epoch: int) -> float:
        frac = min(max(epoch, 0), self.max_epochs) / max(self.max_epochs, 1)
        return self.noise_start * (self.noise_end / self.noise_start) ** frac

    def grad_stats(self, batch_size, epoch):
        if np.ndim(batch_size):
            return np.ones(np.shape(batch_size)), np.full(np.shape(batch_size), self._noise(epoch))
        return 1.0, self._noise(epoch)

    def progress_at(self, epoch):
        return self.epoch_progress * max(epoch, 0)

    def iterations(self, batch_size, epoch):
        """Steps at a fixed batch to reach ``epoch``: progress / AdaScale gain, per epoch."""
        scale = batch_size / self.init_batch_size
        total = 0.0
        for e in range(max(epoch, 0)):
            var = self._noise(e)
            gain = (var + 1.0) / (var / scale + 1.0)
            total += self.epoch_progress / gain
        return total

    def __post_init__(self) -> None:
        check_fields(self)
        if self.alpha_c + self.beta_c <= 0:
            raise InvalidProblem(f"alpha_c + beta_c must be > 0, got {self.alpha_c + self.beta_c!r}")
        for low, high in (("init_batch_size", "max_batch_size"), ("min_local_bsz", "max_local_bsz")):
            if not getattr(self, low) <= getattr(self, high):
                raise InvalidProblem(f"{low} must be in [1, {high}={getattr(self, high)}], got {getattr(self, low)!r}")
