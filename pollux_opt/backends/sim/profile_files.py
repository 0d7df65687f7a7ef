"""Profile folders on disk, in AdaptDL's layout (one node type) or Sia's (one table set per type).

An application folder ``APP/`` holds ``validation-B.csv`` files (gradient
statistics and progress at batch size ``B``, shared by every type:
statistical efficiency does not depend on the device) next to its step times:

- AdaptDL's layout (Pollux OSDI'21 artifact, ``shared/traces/adaptdl-osdi21/README.md``;
  also what ``pollux-opt profile`` writes, :mod:`pollux_opt.backends.sim.export`):
  ``placements.csv`` and, optionally, ``scalability.csv``;
- Sia's layout (Jayaram Subramanya et al., SOSP 2023; artifact
  siasosp23/artifacts, ``sia-simulator/traces/APP/``): ``placements-T.csv``
  and, optionally, ``scalability-T.csv`` per GPU type ``T`` (``aws``, ``rtx``,
  ``dgx-ext``, ...; :data:`pollux_opt.model.cluster_types.GPU_TYPES`).

``placements*.csv`` has :data:`PLACEMENT_COLUMNS`: ``placement`` has one digit
per node, the replicas on that node (``22`` = 2 nodes x 2 replicas);
``step_time`` is seconds per optimizer step and includes ``sync_time``.
``scalability*.csv`` has :data:`SCALABILITY_COLUMNS`.  Columns are read by
header (Sia's files order them differently); a bad cell is an
:class:`~solvers.InvalidProblem` naming the file, the row, the column and the value.
Each table set loads into one :class:`~pollux_opt.backends.sim.traces.TraceProfile`;
a folder in Sia's layout into ``{type: TraceProfile}``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from solvers import InvalidProblem

from pollux_opt.backends.sim.traces import APP_SETTINGS, AppSettings, Profile, TraceProfile, default_trace_dir
from pollux_opt.model.cluster_types import GPU_TYPES
from pollux_opt.model.domains import Integer, check, shown
from pollux_opt.records.tables import read_table

__all__ = [
    "PLACEMENT_COLUMNS", "REFERENCE_TYPE", "SCALABILITY_COLUMNS", "VALIDATION_FILE", "app_folders",
    "load_profiles", "load_trace_profile", "load_typed_profile", "load_typed_profiles", "profile_types",
    "read_placements", "read_scalability", "read_validation", "trace_profile",
]

LOG = logging.getLogger(__name__)

#: Columns of the step-time tables.
PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
_VALIDATION_COLUMNS = ("iteration", "grad_sqr", "grad_var", "progress")
_COUNT_COLUMNS = ("local_bsz", "num_nodes", "num_replicas")
#: Name of a validation table: ``validation-B.csv``.
VALIDATION_FILE = re.compile(r"validation-(\d+)\.csv$")
_PLACEMENTS = re.compile(r"placements-(.+)\.csv$")
#: The type whose profiles are the AdaptDL/Pollux measurements (T4): Pollux's
#: simulator settings (:data:`~pollux_opt.backends.sim.traces.APP_SETTINGS`,
#: e.g. yolov3's local-batch cap 8) apply to it.
REFERENCE_TYPE = "aws"
_LOCAL_BSZ = Integer(ge=1)


def _reject_rows(path: Path, bad, what) -> None:
    """Raise naming the first row of ``path`` where ``bad`` (a boolean per row) holds; ``what(i)`` says why."""
    rows = np.flatnonzero(np.asarray(bad, dtype=bool))
    if rows.size:
        raise InvalidProblem(f"profile table {str(path)!r}: row {rows[0] + 1}, {what(rows[0])}")


def _read_times(path: Path, columns: Sequence[str]) -> pd.DataFrame:
    """A step-time table with ``columns`` in this order: counts are integers > 0,
    ``step_time`` > 0 and ``sync_time`` >= 0 seconds."""
    df = read_table(path, "profile table", columns=columns, text=("placement",), numeric=("step_time", "sync_time"),
                    integer=[c for c in columns if c in _COUNT_COLUMNS])
    df = df[list(columns)].reset_index(drop=True)
    for c in (c for c in columns if c != "placement"):
        values, bound = df[c].to_numpy(float), ">= 0" if c == "sync_time" else "> 0"
        _reject_rows(path, values < 0 if c == "sync_time" else values <= 0,
                     lambda i: f"column {c!r} must be a finite number {bound}, got {shown(values[i].item())}")
    over = int((df.sync_time > df.step_time).sum())
    if over:  # step_time includes sync_time; a few noisy rows exist in measured data
        LOG.warning("%s: %d rows with sync_time > step_time (clipped when read)", path, over)
    return df


def read_placements(path, *, gpus_per_node: int | None = None) -> pd.DataFrame:
    """A ``placements*.csv`` file as a frame of :data:`PLACEMENT_COLUMNS`.

    Args:
        gpus_per_node: if given, every digit of a placement must be at most this.

    Raises:
        InvalidProblem: see :func:`_read_times`; or a placement that is not
            digits 1-9 (or exceeds ``gpus_per_node``), naming the row.
    """
    path = Path(path)
    df = _read_times(path, PLACEMENT_COLUMNS)
    _reject_rows(path, ~df.placement.str.fullmatch(r"[1-9]+"),
                 lambda i: f"column 'placement' must be replicas per node as digits 1-9, got {df.placement[i]!r}")
    if gpus_per_node is not None:
        _reject_rows(path, df.placement.map(lambda p: max(map(int, p))) > gpus_per_node,
                     lambda i: f"placement {df.placement[i]!r} puts more than gpus_per_node={gpus_per_node} "
                               f"replicas on a node")
    return df


def read_scalability(path) -> pd.DataFrame:
    """A ``scalability*.csv`` file as a frame of :data:`SCALABILITY_COLUMNS` (an empty one if absent)."""
    path = Path(path)
    if not path.is_file():
        return pd.DataFrame({c: pd.Series(dtype=float) for c in SCALABILITY_COLUMNS})
    df = _read_times(path, SCALABILITY_COLUMNS)
    _reject_rows(path, df.num_replicas < df.num_nodes, lambda i: f"column 'num_replicas' must be >= "
                 f"num_nodes={df.num_nodes[i]}, got {df.num_replicas[i]}")
    return df


def read_validation(folder) -> dict[int, pd.DataFrame]:
    """``{batch size: validation-B.csv}`` of one application folder, by batch size.

    Raises:
        InvalidProblem: no validation file, or a bad one.
    """
    folder = Path(folder)
    out = {int(m.group(1)): read_table(f, "profile table", columns=_VALIDATION_COLUMNS, numeric=_VALIDATION_COLUMNS)
           for f in folder.iterdir() if (m := VALIDATION_FILE.search(f.name))}
    if not out:
        raise InvalidProblem(f"profile folder {str(folder)!r} has no validation-B.csv file")
    return dict(sorted(out.items()))


def trace_profile(name: str, type_name: str | None, placements: pd.DataFrame, scalability: pd.DataFrame,
                  validation: Mapping[int, pd.DataFrame], max_epochs: int | None = None,
                  max_local_bsz: int | None = None) -> TraceProfile:
    """The :class:`TraceProfile` of application ``name``'s tables (of ``type_name``; None: the only type).

    ``max_epochs`` defaults to :data:`APP_SETTINGS`, else every validated epoch;
    ``max_local_bsz`` to Pollux's setting (on one type, or on the reference type
    ``aws``), else to the largest profiled local batch (Sia's simulator:
    ``placements.local_bsz.max()``).
    """
    settings = APP_SETTINGS.get(name, AppSettings())
    epochs = max_epochs or settings.max_epochs or min(len(v) for v in validation.values())
    if max_local_bsz is not None:
        what = "max_local_bsz" if type_name is None else f"max_local_bsz[{type_name!r}]"
        max_local = check(what, max_local_bsz, _LOCAL_BSZ)
    elif type_name in (None, REFERENCE_TYPE) and settings.max_local_bsz is not None:
        max_local = settings.max_local_bsz
    else:
        max_local = int(placements.local_bsz.max())
    return TraceProfile(name, placements, scalability, dict(validation), int(epochs), int(max_local))


@lru_cache(maxsize=64)
def _load_cached(folder: str, type_name: str | None, max_epochs: int | None, max_local_bsz: int | None):
    path = Path(folder)
    suffix = "" if type_name is None else f"-{type_name}"
    placements = path / f"placements{suffix}.csv"
    if not placements.is_file():
        raise InvalidProblem(f"profile folder {folder!r} "
                             + (f"has no placements{suffix}.csv" if path.is_dir() else "does not exist"))
    per_node = GPU_TYPES[type_name].gpus_per_node if type_name in GPU_TYPES else None
    return trace_profile(path.name, type_name, read_placements(placements, gpus_per_node=per_node),
                          read_scalability(path / f"scalability{suffix}.csv"), read_validation(path),
                          max_epochs, max_local_bsz)


def load_trace_profile(folder, *, type_name: str | None = None, max_epochs: int | None = None,
                       max_local_bsz: int | None = None) -> TraceProfile:
    """Read one application folder's tables (of ``type_name`` in Sia's layout; cached per process).

    Args:
        folder: path to ``APP/``.
        type_name: None: AdaptDL's layout; else the type ``T`` of Sia's ``placements-T.csv``.
        max_epochs: epochs to completion (default: :data:`APP_SETTINGS`, else all validated).
        max_local_bsz: per-replica batch cap (default: see :func:`trace_profile`).

    Raises:
        InvalidProblem: a missing folder or file, or a bad row.
    """
    return _load_cached(str(Path(folder).resolve()), type_name, max_epochs, max_local_bsz)


def profile_types(folder) -> tuple[str, ...]:
    """The types with a ``placements-T.csv`` in ``folder``, sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidProblem(f"profile folder {str(folder)!r} does not exist")
    return tuple(sorted(m.group(1) for f in folder.iterdir() if (m := _PLACEMENTS.fullmatch(f.name))))


def load_typed_profile(folder, *, types: Sequence[str] | None = None, max_epochs: int | None = None,
                       max_local_bsz: int | Mapping[str, int] | None = None) -> dict[str, TraceProfile]:
    """Read one application folder in Sia's layout (see the module docstring): ``{type: TraceProfile}``.

    Args:
        folder: ``APP/`` with ``placements-T.csv`` per type and ``validation-B.csv``.
        types: the types to read (default: every type with a placements file).
        max_epochs, max_local_bsz: as in :func:`trace_profile` (``max_local_bsz`` one value or one per type).

    Raises:
        InvalidProblem: a missing folder, type or file, or a bad row.
    """
    if types is not None and not types:
        raise InvalidProblem("types must name at least one node type, got none")
    folder = Path(folder)
    found = profile_types(folder)
    if not found:
        raise InvalidProblem(f"profile folder {str(folder)!r} has no placements-<type>.csv file")
    missing = [t for t in types or () if t not in found]
    if missing:
        raise InvalidProblem(
            f"profile folder {str(folder)!r} has no placements-{missing[0]}.csv (types: {list(found)})"
        )
    caps = max_local_bsz if isinstance(max_local_bsz, Mapping) else {t: max_local_bsz for t in found}
    return {t: load_trace_profile(folder, type_name=t, max_epochs=max_epochs, max_local_bsz=caps.get(t))
            for t in (found if types is None else types)}


def app_folders(root=None, names: Sequence[str] | None = None, *, typed: bool = False) -> list[Path]:
    """The application folders under ``root`` (default :func:`default_trace_dir`): under
    ``root/profiles`` (or ``root``) those in AdaptDL's layout, or under ``root/traces``
    (or ``root``) those in Sia's if ``typed``; only ``names`` if given.

    Raises:
        InvalidProblem: ``root`` is missing, holds no such folder, or lacks a named one.
    """
    root = Path(root) if root is not None else default_trace_dir()
    base = root / ("traces" if typed else "profiles")
    base = base if base.is_dir() else root
    if not base.is_dir():
        raise InvalidProblem(f"profiles folder {str(root)!r} does not exist")
    found = sorted(p for p in base.iterdir()
                   if (p.is_dir() and profile_types(p) if typed else (p / "placements.csv").is_file()))
    if names is not None:
        missing = sorted(set(names) - {p.name for p in found})
        if missing:
            raise InvalidProblem(f"profiles {missing} not found under {str(base)!r}")
        found = [p for p in found if p.name in set(names)]
    if not found:
        layout = "placements-<type>.csv" if typed else "placements.csv"
        raise InvalidProblem(f"no application folder (with {layout}) under {str(base)!r}")
    return found


def load_profiles(root=None, names: Sequence[str] | None = None) -> dict[str, Profile]:
    """The application folders of :func:`app_folders` in AdaptDL's layout, by name."""
    return {p.name: load_trace_profile(p) for p in app_folders(root, names)}


def load_typed_profiles(root, names: Sequence[str] | None = None,
                        types: Sequence[str] | None = None) -> dict[str, dict[str, TraceProfile]]:
    """The application folders of :func:`app_folders` in Sia's layout (``types`` only), by name."""
    return {p.name: load_typed_profile(p, types=types) for p in app_folders(root, names, typed=True)}
