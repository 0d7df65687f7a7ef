"""Synthetic per-type profiles built from measured single-type (T4) profiles.

Sia's 64-GPU cluster has three device types; the AdaptDL traces measure one
(T4, the ``aws`` type).  :func:`synthesize_app` derives the other types' tables
from it by the documented speed ratios of :func:`speed_ratios` (vendor figures
in :data:`pollux_opt.model.cluster_types.GPU_TYPES`), in Sia's layout
(:mod:`pollux_opt.backends.sim.profile_files`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from solvers import InvalidProblem

from pollux_opt.backends.sim.profile_files import (
    PLACEMENT_COLUMNS,
    REFERENCE_TYPE,
    SCALABILITY_COLUMNS,
    VALIDATION_FILE,
    app_folders,
    load_trace_profile,
    trace_profile,
)
from pollux_opt.model.cluster_types import GPU_TYPES, memory_scaled_local_bsz
from pollux_opt.records.files import atomic_write_bytes, atomic_write_csv

__all__ = [
    "SYNTHETIC_TYPES",
    "SpeedRatios",
    "build_typed_profiles",
    "speed_ratios",
    "synthesize_app",
    "synthesize_tables",
    "write_typed_profiles",
]

#: The types :func:`synthesize_app` builds by default: the measured T4
#: data unchanged (``aws``) and two faster types of Sia's 64-GPU cluster.
SYNTHETIC_TYPES = ("aws", "rtx", "dgx-ext")
#: Factor between consecutive local batches added beyond the measured largest
#: (the AdaptDL profiles' own grid: 32, 45, 64, 91, ... is a factor sqrt(2)).
_BSZ_STEP = 2.0**0.5


@dataclass(frozen=True)
class SpeedRatios:
    """How much faster a type is than the reference (T4), per part of a step (>1: faster).

    Attributes:
        compute: compute time (step - sync) is divided by this.
        intra_sync: sync time on one node is divided by this.
        inter_sync: sync time across nodes is divided by this.
    """

    compute: float
    intra_sync: float
    inter_sync: float


def speed_ratios(type_name: str, reference: str = REFERENCE_TYPE) -> SpeedRatios:
    """The documented speed rule of a type against ``reference`` (figures in :data:`GPU_TYPES`).

    - compute: the geometric mean of the peak-FP32 and memory-bandwidth ratios
      (training steps mix compute-bound matrix products with bandwidth-bound
      element-wise kernels; the mean of the two roofline limits);
    - intra-node sync: the ratio of GPU-to-GPU link bandwidths (PCIe 3.0 vs NVLink);
    - inter-node sync: the ratio of node networks, 1 where either is unknown
      (assumed the same network as the reference).

    Raises:
        InvalidProblem: a type not in :data:`GPU_TYPES`.
    """
    for t in (type_name, reference):
        if t not in GPU_TYPES:
            raise InvalidProblem(f"type must be one of {sorted(GPU_TYPES)}, got {t!r}")
    a, r = GPU_TYPES[type_name], GPU_TYPES[reference]
    compute = float(np.sqrt(a.fp32_tflops / r.fp32_tflops * a.memory_bandwidth_gbs / r.memory_bandwidth_gbs))
    inter = 1.0 if a.inter_node_gbps is None or r.inter_node_gbps is None else a.inter_node_gbps / r.inter_node_gbps
    return SpeedRatios(compute, a.intra_node_gbs / r.intra_node_gbs, float(inter))


def _extend_bsz(df: pd.DataFrame, keys: list[str], cap: int) -> pd.DataFrame:
    """Rows beyond each group's largest local batch up to ``cap``: compute linear in the
    batch (Pollux's model, slope of the two largest rows, >= 0), sync unchanged."""
    new = []
    for key, g in df.groupby(keys):
        g = g.sort_values("local_bsz")
        if len(g) < 2 or g.local_bsz.iloc[-1] >= cap:
            continue
        (m1, m2), (c1, c2) = g.local_bsz.iloc[-2:], (g.step_time - g.sync_time).iloc[-2:]
        slope = max((c2 - c1) / (m2 - m1), 0.0)
        sync = float(g.sync_time.iloc[-1])
        m, grid = float(m2), []
        while (m := m * _BSZ_STEP) < cap:
            grid.append(int(round(m)))
        for b in [*grid, cap]:
            row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
            new.append({**row, "local_bsz": b, "step_time": c2 + slope * (b - m2) + sync, "sync_time": sync})
    return pd.concat([df, pd.DataFrame(new)], ignore_index=True) if new else df


def _reshape_scalability(placements: pd.DataFrame, scalability: pd.DataFrame, node_size: int) -> pd.DataFrame:
    """Multi-node rows re-keyed to ``node_size`` replicas per node.

    Pollux's sync model depends on the replica count and on "one node or
    several" only, so a reference row of K replicas on N >= 2 nodes also
    stands for K replicas on ``ceil(K / node_size)`` nodes when that is >= 2.
    """
    p = placements.assign(
        num_nodes=placements.placement.str.len(),
        num_replicas=placements.placement.map(lambda s: sum(map(int, s))),
    )
    rows = pd.concat([p[list(SCALABILITY_COLUMNS)], scalability], ignore_index=True)
    rows = rows[rows.num_nodes >= 2].copy()
    rows["num_nodes"] = -(-rows.num_replicas // node_size)
    rows = rows[rows.num_nodes >= 2]
    merged = pd.concat([scalability, rows], ignore_index=True)
    return merged.groupby(["num_nodes", "num_replicas", "local_bsz"], as_index=False)[
        ["step_time", "sync_time"]
    ].mean()


def _single_node_rows(placements: pd.DataFrame, node_size: int) -> pd.DataFrame:
    """Placements of 5..node_size replicas on one node: intra-node sync extrapolated linearly
    in the replica count (Pollux: ``alpha_n + beta_n (K - 2)``) from the measured
    one-node rows, compute their mean, per local batch."""
    one = placements[placements.placement.str.len() == 1].assign(k=lambda d: d.placement.astype(int))
    have = int(one.k.max()) if len(one) else 0
    multi = one[one.k >= 2]
    new = []
    for b, g in multi.groupby("local_bsz"):
        g = g.groupby("k", as_index=False)[["step_time", "sync_time"]].mean()
        if len(g) < 2:
            continue
        beta, alpha = np.polyfit(g.k.to_numpy(float), g.sync_time.to_numpy(float), 1)
        compute = float((g.step_time - g.sync_time).mean())
        for k in range(have + 1, node_size + 1):
            sync = max(float(alpha + beta * k), float(g.sync_time.max()))
            new.append({"placement": str(k), "local_bsz": int(b), "step_time": compute + sync, "sync_time": sync})
    return pd.concat([placements, pd.DataFrame(new)], ignore_index=True) if new else placements


def _scale(df: pd.DataFrame, ratios: SpeedRatios, multi_node: pd.Series) -> pd.DataFrame:
    compute = (df.step_time - df.sync_time).clip(lower=0.0) / ratios.compute
    sync = df.sync_time / np.where(multi_node, ratios.inter_sync, ratios.intra_sync)
    return df.assign(step_time=compute + sync, sync_time=sync)


def synthesize_tables(
    placements: pd.DataFrame,
    scalability: pd.DataFrame,
    type_name: str,
    *,
    reference_max_local_bsz: int,
    max_batch_size: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(placements, scalability)`` of ``type_name`` derived from reference (T4) tables.

    Rows are re-shaped to the type's node size, extended to (or trimmed at) its
    memory-rule local-batch cap (:func:`~pollux_opt.model.cluster_types.memory_scaled_local_bsz`
    of ``reference_max_local_bsz``, at most ``max_batch_size``), then compute and
    sync times are divided by :func:`speed_ratios`.  ``aws`` returns the input unchanged.
    """
    if type_name == REFERENCE_TYPE:
        return placements, scalability
    ratios = speed_ratios(type_name)  # rejects an unknown type
    gpu = GPU_TYPES[type_name]
    cap = memory_scaled_local_bsz(reference_max_local_bsz, gpu.memory_gb, max_batch_size=max_batch_size)
    p = _single_node_rows(placements, gpu.gpus_per_node)
    s = _reshape_scalability(p, scalability, gpu.gpus_per_node)
    p = _extend_bsz(p, ["placement"], cap)
    s = _extend_bsz(s, ["num_nodes", "num_replicas"], cap)
    p, s = p[p.local_bsz <= cap], s[s.local_bsz <= cap]
    p = _scale(p, ratios, p.placement.str.len() > 1)
    s = _scale(s, ratios, s.num_nodes > 1)
    p = p.assign(local_bsz=p.local_bsz.astype(int))[list(PLACEMENT_COLUMNS)]
    s = s.assign(**{c: s[c].astype(int) for c in ("num_nodes", "num_replicas", "local_bsz")})
    return p.reset_index(drop=True), s[list(SCALABILITY_COLUMNS)].reset_index(drop=True)


def synthesize_app(folder, types: Sequence[str] = SYNTHETIC_TYPES) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """``{type: (placements, scalability)}`` of one AdaptDL-format (T4) application folder."""
    ref = load_trace_profile(folder)
    return {t: synthesize_tables(ref.placements, ref.scalability, t, reference_max_local_bsz=ref.max_local_bsz,
                                 max_batch_size=ref.max_batch_size)
            for t in types}


def build_typed_profiles(root, names: Sequence[str] | None = None, types: Sequence[str] = SYNTHETIC_TYPES) -> dict:
    """``{app: {type: TraceProfile}}`` synthesized in memory from AdaptDL-format folders under ``root``
    (``root/profiles`` or ``root`` itself)."""
    # The reference profile (loaded once, cached) holds the folder's validation tables.
    return {f.name: {t: trace_profile(f.name, t, p, s, load_trace_profile(f).validation)
                     for t, (p, s) in synthesize_app(f, types).items()}
            for f in app_folders(root, names)}


def write_typed_profiles(
    root, out, names: Sequence[str] | None = None, types: Sequence[str] = SYNTHETIC_TYPES
) -> list[Path]:
    """Write synthesized per-type profiles in Sia's layout to ``out/APP/`` (validation files copied).

    Returns the application folders written.  Files are written atomically.
    """
    out = Path(out)
    written = []
    for folder in app_folders(root, names):
        dest = out / folder.name
        for t, (p, s) in synthesize_app(folder, types).items():
            # Sia's files put the key last (local_bsz,step_time,sync_time,placement).
            atomic_write_csv(dest / f"placements-{t}.csv", p[["local_bsz", "step_time", "sync_time", "placement"]])
            atomic_write_csv(dest / f"scalability-{t}.csv", s[["local_bsz", "step_time", "sync_time",
                                                                 "num_nodes", "num_replicas"]])
        for f in folder.iterdir():
            if VALIDATION_FILE.search(f.name):
                atomic_write_bytes(dest / f.name, f.read_bytes())
        written.append(dest)
    return written
