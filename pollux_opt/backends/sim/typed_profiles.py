"""Per-type profiles of a heterogeneous cluster, in Sia's artifact layout.

Sia (Jayaram Subramanya et al., SOSP 2023; artifact siasosp23/artifacts,
``sia-simulator/traces/APP/``) keeps one application folder per job with,
for every GPU type ``T`` (``aws``, ``rtx``, ``dgx-ext``, ...; see
:data:`pollux_opt.model.cluster_types.GPU_TYPES`):

- ``placements-T.csv``: ``placement,local_bsz,step_time,sync_time`` (any
  column order; read by header).  ``placement`` has one digit per node, the
  replicas on that node (``22`` = 2 nodes x 2 replicas); ``step_time`` is
  seconds per optimizer step and includes ``sync_time``;
- ``scalability-T.csv`` (optional): ``num_nodes,num_replicas,local_bsz,step_time,sync_time``;

next to the shared ``validation-B.csv`` files (statistical efficiency does not
depend on the device).  :func:`load_typed_profile` reads one folder into a
:class:`TypedProfile`: one :class:`~pollux_opt.backends.sim.traces.TraceProfile`
per type, all over the same validation tables.

Synthetic per-type sets built from single-type profiles are in
:mod:`pollux_opt.backends.sim.synthetic_types`; Sia's simulator calibration in
:mod:`pollux_opt.backends.sim.sia_settings`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from solvers import InvalidProblem

from pollux_opt.backends.sim.traces import (
    APP_SETTINGS,
    PLACEMENT_COLUMNS,
    SCALABILITY_COLUMNS,
    VALIDATION_FILE,
    AppSettings,
    TraceProfile,
)
from pollux_opt.model.cluster_types import GPU_TYPES
from pollux_opt.model.domains import Integer, check, shown

__all__ = [
    "TypedProfile",
    "load_typed_profile",
    "load_typed_profiles",
    "make_typed_profile",
    "profile_types",
    "read_placements",
    "read_scalability",
    "read_validation",
]

LOG = logging.getLogger(__name__)

#: The type whose profiles are the AdaptDL/Pollux measurements (T4): Pollux's
#: simulator settings (:data:`~pollux_opt.backends.sim.traces.APP_SETTINGS`,
#: e.g. yolov3's local-batch cap 8) apply to it.
REFERENCE_TYPE = "aws"

_PLACEMENTS = re.compile(r"placements-(.+)\.csv$")
_INTEGER_COLUMNS = ("local_bsz", "num_nodes", "num_replicas")
_LOCAL_BSZ = Integer(ge=1)
_DIGITS = re.compile(r"[1-9]+")


def _cell(value) -> str:
    """A CSV cell for a message: numbers as Python numbers (not ``np.float64(8.5)``)."""
    return shown(value.item() if isinstance(value, np.generic) else value)


def _read_csv(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    """``path`` with ``columns`` in this order, numbers checked; read by header, so any column order."""
    try:
        df = pd.read_csv(path, dtype={"placement": str})
    except (OSError, ValueError) as exc:  # pandas' parser errors are ValueErrors
        raise InvalidProblem(f"profile file {str(path)!r} is not a readable CSV: {exc}") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise InvalidProblem(
            f"profile file {str(path)!r} has no column {missing[0]!r} (columns: {list(df.columns)})"
        )
    df = df[list(columns)].copy()
    if df.empty:
        raise InvalidProblem(f"profile file {str(path)!r} has no rows")
    for c in columns:
        if c == "placement":
            continue
        values = pd.to_numeric(df[c], errors="coerce").to_numpy(float)
        bad = ~np.isfinite(values) | (values <= 0 if c != "sync_time" else values < 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InvalidProblem(
                f"profile file {str(path)!r} row {i + 2}: {c} must be a finite number "
                f"{'>= 0' if c == 'sync_time' else '> 0'}, got {_cell(df[c].iloc[i])}"
            )
        if c in _INTEGER_COLUMNS:
            frac = values != np.round(values)
            if frac.any():
                i = int(np.flatnonzero(frac)[0])
                raise InvalidProblem(
                    f"profile file {str(path)!r} row {i + 2}: {c} must be an integer, got {_cell(df[c].iloc[i])}"
                )
            values = values.astype(int)
        df[c] = values
    over = int((df.sync_time > df.step_time).sum())
    if over:  # step_time includes sync_time; a few noisy rows exist in measured data
        LOG.warning("%s: %d rows with sync_time > step_time (clipped when read)", path, over)
    return df.reset_index(drop=True)


def read_placements(path, *, gpus_per_node: int | None = None) -> pd.DataFrame:
    """``placements-T.csv`` as a frame of :data:`PLACEMENT_COLUMNS`.

    Args:
        gpus_per_node: if given, every digit of a placement must be at most this.

    Raises:
        InvalidProblem: a missing column, a bad number, or a placement that is
            not digits 1-9 (or exceeds ``gpus_per_node``), naming the row.
    """
    path = Path(path)
    df = _read_csv(path, PLACEMENT_COLUMNS)
    for i, p in enumerate(df.placement):
        if not isinstance(p, str) or not _DIGITS.fullmatch(p):
            raise InvalidProblem(
                f"profile file {str(path)!r} row {i + 2}: placement must be digits 1-9 "
                f"(replicas per node), got {shown(p)}"
            )
        if gpus_per_node is not None and max(map(int, p)) > gpus_per_node:
            raise InvalidProblem(
                f"profile file {str(path)!r} row {i + 2}: placement {p!r} puts more than "
                f"gpus_per_node={gpus_per_node} replicas on a node"
            )
    return df


def read_scalability(path) -> pd.DataFrame:
    """``scalability-T.csv`` as a frame of :data:`SCALABILITY_COLUMNS` (an empty one if absent)."""
    path = Path(path)
    if not path.is_file():
        return pd.DataFrame({c: pd.Series(dtype=float) for c in SCALABILITY_COLUMNS})
    df = _read_csv(path, SCALABILITY_COLUMNS)
    bad = df.num_replicas < df.num_nodes
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise InvalidProblem(
            f"profile file {str(path)!r} row {i + 2}: num_replicas must be >= num_nodes="
            f"{df.num_nodes.iloc[i]}, got {df.num_replicas.iloc[i]}"
        )
    return df


def read_validation(folder) -> dict[int, pd.DataFrame]:
    """``{batch size: validation-B.csv}`` of one application folder.

    Raises:
        InvalidProblem: no validation file.
    """
    folder = Path(folder)
    out = {}
    for f in folder.iterdir():
        m = VALIDATION_FILE.search(f.name)
        if m:
            out[int(m.group(1))] = pd.read_csv(f)
    if not out:
        raise InvalidProblem(f"profile folder {str(folder)!r} has no validation-B.csv file")
    return dict(sorted(out.items()))


def profile_types(folder) -> tuple[str, ...]:
    """The types with a ``placements-T.csv`` in ``folder``, sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidProblem(f"profile folder {str(folder)!r} does not exist")
    return tuple(sorted(m.group(1) for f in folder.iterdir() if (m := _PLACEMENTS.fullmatch(f.name))))


@dataclass(frozen=True)
class TypedProfile:
    """One application on every profiled type: a :class:`TraceProfile` per type.

    All per-type profiles share one ``validation`` table set (gradient
    statistics and progress), so ``grad_stats`` and ``progress_at`` agree
    across types; only ``step_sync`` and ``max_local_bsz`` differ.
    """

    name: str
    by_type: Mapping[str, TraceProfile]

    def __post_init__(self) -> None:
        if not self.by_type:
            raise InvalidProblem(f"profile {self.name!r} must have at least one type")

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(self.by_type)

    def __getitem__(self, type_name: str) -> TraceProfile:
        if type_name not in self.by_type:
            raise InvalidProblem(f"profile {self.name!r}: type must be one of {list(self.by_type)}, got {type_name!r}")
        return self.by_type[type_name]


def _max_local(type_name: str, settings: AppSettings, placements: pd.DataFrame, given) -> int:
    if isinstance(given, Mapping):
        given = given.get(type_name)
    if given is not None:
        return check(f"max_local_bsz[{type_name!r}]", given, _LOCAL_BSZ)
    if type_name == REFERENCE_TYPE and settings.max_local_bsz is not None:
        return settings.max_local_bsz
    return int(placements.local_bsz.max())


def make_typed_profile(
    name: str,
    tables: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]],
    validation: Mapping[int, pd.DataFrame],
    *,
    max_epochs: int | None = None,
    max_local_bsz: int | Mapping[str, int] | None = None,
) -> TypedProfile:
    """A :class:`TypedProfile` from ``{type: (placements, scalability)}`` frames and shared validation tables.

    ``max_epochs`` defaults to :data:`APP_SETTINGS` (else every validated
    epoch); ``max_local_bsz`` (one value, or one per type) to Pollux's setting
    on the reference type ``aws`` and to the largest profiled local batch on
    every other type (Sia's simulator: ``placements.local_bsz.max()``).
    """
    settings = APP_SETTINGS.get(name, AppSettings())
    epochs = max_epochs or settings.max_epochs or min(len(v) for v in validation.values())
    by_type = {
        t: TraceProfile(name, p, s, dict(validation), int(epochs), _max_local(t, settings, p, max_local_bsz))
        for t, (p, s) in tables.items()
    }
    return TypedProfile(name, by_type)


def load_typed_profile(
    folder,
    *,
    types: Sequence[str] | None = None,
    max_epochs: int | None = None,
    max_local_bsz: int | Mapping[str, int] | None = None,
) -> TypedProfile:
    """Read one application folder in Sia's layout (see the module docstring).

    Args:
        folder: ``APP/`` with ``placements-T.csv`` per type and ``validation-B.csv``.
        types: the types to read (default: every type with a placements file).
        max_epochs, max_local_bsz: as in :func:`make_typed_profile`.

    Raises:
        InvalidProblem: a missing folder, type or file, or a bad row.
    """
    folder = Path(folder)
    found = profile_types(folder)
    if not found:
        raise InvalidProblem(f"profile folder {str(folder)!r} has no placements-<type>.csv file")
    wanted = tuple(types) if types is not None else found
    missing = [t for t in wanted if t not in found]
    if missing:
        raise InvalidProblem(
            f"profile folder {str(folder)!r} has no placements-{missing[0]}.csv (types: {list(found)})"
        )
    tables = {}
    for t in wanted:
        per_node = GPU_TYPES[t].gpus_per_node if t in GPU_TYPES else None
        tables[t] = (
            read_placements(folder / f"placements-{t}.csv", gpus_per_node=per_node),
            read_scalability(folder / f"scalability-{t}.csv"),
        )
    return make_typed_profile(
        folder.name, tables, read_validation(folder), max_epochs=max_epochs, max_local_bsz=max_local_bsz
    )


def load_typed_profiles(root, names: Sequence[str] | None = None, types: Sequence[str] | None = None) -> dict:
    """Every application folder in Sia's layout under ``root`` (or ``root/traces``), by name.

    Raises:
        InvalidProblem: ``root`` is missing, holds no such folder, or lacks a named one.
    """
    root = Path(root)
    base = root / "traces" if (root / "traces").is_dir() else root
    if not base.is_dir():
        raise InvalidProblem(f"profiles folder {str(root)!r} does not exist")
    found = {p.name: p for p in sorted(base.iterdir()) if p.is_dir() and profile_types(p)}
    if names is not None:
        missing = sorted(set(names) - set(found))
        if missing:
            raise InvalidProblem(f"profiles {missing} not found under {str(base)!r}")
        found = {n: found[n] for n in names}
    if not found:
        raise InvalidProblem(f"no application folder (with placements-<type>.csv) under {str(base)!r}")
    return {n: load_typed_profile(p, types=types) for n, p in found.items()}
