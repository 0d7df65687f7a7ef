"""Per-type profiles: Sia's layout, the synthetic types derived from T4 data, Sia's simulator settings."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pollux_opt import InvalidProblem
from pollux_opt.backends.sim import default_trace_dir
from pollux_opt.backends.sim.state import SiaSimSettings
from pollux_opt.backends.sim.synthetic_types import (
    build_typed_profiles,
    speed_ratios,
    synthesize_app,
    synthesize_tables,
    write_typed_profiles,
)
from pollux_opt.backends.sim.profile_files import load_typed_profile, load_typed_profiles, profile_types, read_placements
from pollux_opt.model.cluster_types import GPU_TYPES, memory_scaled_local_bsz

TRACES = default_trace_dir()
needs_traces = pytest.mark.skipif(
    not (TRACES / "profiles" / "yolov3").is_dir(), reason=f"AdaptDL traces not found at {TRACES}"
)

# A two-replica-per-node toy job: compute 0.1 + 0.001 m s, sync 0.01 s per extra
# replica on one node, 0.05 s across nodes.
_BSZ = (8, 16, 32)
_SHAPES = ("1", "2", "3", "4", "11", "22", "44")


def _times(placement: str, m: int, speed: float = 1.0) -> tuple[float, float]:
    k, n = sum(map(int, placement)), len(placement)
    sync = 0.0 if k == 1 else (0.05 * (k - 1) if n > 1 else 0.01 * (k - 1))
    return (0.1 + 0.001 * m) / speed + sync, sync


def _validation(folder, epochs=4):
    for b in (8, 32):
        gain = 1.0 if b == 8 else 2.0
        pd.DataFrame({
            "progress": np.arange(1, epochs + 1) * 100.0,
            "iteration": np.arange(1, epochs + 1) * 100.0 / gain,
            "metric": np.linspace(0.1, 0.9, epochs),
            "grad_sqr": np.full(epochs, 1.0),
            "grad_var": np.linspace(1.0, 4.0, epochs) * (1 + b / 64),
        }).to_csv(folder / f"validation-{b}.csv", index=False)


def _rows(speed=1.0, shapes=_SHAPES):
    return [(p, m, *_times(p, m, speed)) for p in shapes for m in _BSZ]


def make_sia_folder(root, name="toy"):
    """Sia's layout with two types whose files order their columns differently."""
    folder = root / name
    folder.mkdir(parents=True)
    _validation(folder)
    aws = pd.DataFrame(_rows(), columns=["placement", "local_bsz", "step_time", "sync_time"])
    aws[["local_bsz", "step_time", "sync_time", "placement"]].to_csv(folder / "placements-aws.csv", index=False)
    rtx = pd.DataFrame(_rows(2.0), columns=["placement", "local_bsz", "step_time", "sync_time"])
    rtx[["sync_time", "placement", "step_time", "local_bsz"]].to_csv(folder / "placements-rtx.csv", index=False)
    scal = pd.DataFrame(
        [(4, k, m, *_times("4" * 4, m)) for k in (8, 16) for m in _BSZ],
        columns=["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"],
    )
    scal[["local_bsz", "step_time", "sync_time", "num_nodes", "num_replicas"]].to_csv(
        folder / "scalability-aws.csv", index=False
    )
    return folder


def make_adaptdl_folder(root, name="toy"):
    """The single-type AdaptDL layout (the T4 measurements' format)."""
    folder = root / name
    folder.mkdir(parents=True)
    _validation(folder)
    pd.DataFrame(_rows(), columns=["placement", "local_bsz", "step_time", "sync_time"]).to_csv(
        folder / "placements.csv", index=False
    )
    pd.DataFrame(
        [(n, n * 4, m, *_times("4" * n, m)) for n in (2, 3) for m in _BSZ],
        columns=["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"],
    ).to_csv(folder / "scalability.csv", index=False)
    return folder


# ------------------------------------------------------------------------------------------ reader
def test_types_read_by_header_whatever_the_column_order(tmp_path):
    prof = load_typed_profile(make_sia_folder(tmp_path))
    assert tuple(prof) == ("aws", "rtx")
    for t, speed in (("aws", 1.0), ("rtx", 2.0)):
        for p in ("1", "22"):
            step, sync = prof[t].step_sync(tuple(map(int, p)), 16)
            assert (step, sync) == pytest.approx(_times(p, 16, speed))


def test_types_share_the_validation_tables(tmp_path):
    prof = load_typed_profile(make_sia_folder(tmp_path))
    aws, rtx = prof["aws"], prof["rtx"]
    for epoch in range(4):
        assert aws.grad_stats(16, epoch) == rtx.grad_stats(16, epoch)
        assert aws.progress_at(epoch) == rtx.progress_at(epoch)
    assert aws.init_batch_size == rtx.init_batch_size == 8


def test_max_local_bsz_defaults_to_largest_row_and_takes_a_per_type_override(tmp_path):
    folder = make_sia_folder(tmp_path)
    assert load_typed_profile(folder)["rtx"].max_local_bsz == max(_BSZ)
    prof = load_typed_profile(folder, max_local_bsz={"rtx": 20})
    assert prof["rtx"].max_local_bsz == 20 and prof["aws"].max_local_bsz == max(_BSZ)
    with pytest.raises(InvalidProblem, match=r"max_local_bsz\['rtx'\] must be an integer >= 1, got 0"):
        load_typed_profile(folder, max_local_bsz={"rtx": 0})


def test_profile_types_parses_hyphenated_type_names(tmp_path):
    folder = make_sia_folder(tmp_path)
    (folder / "placements-aws.csv").rename(folder / "placements-dgx-ext.csv")
    assert profile_types(folder) == ("dgx-ext", "rtx")
    assert tuple(load_typed_profile(folder, types=["dgx-ext"])) == ("dgx-ext",)


def test_scalability_file_is_optional_and_used_when_present(tmp_path):
    prof = load_typed_profile(make_sia_folder(tmp_path))
    assert len(prof["aws"].scalability) == 6 and prof["rtx"].scalability.empty


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda df: df.drop(columns="sync_time"), r"placements-aws.csv' lacks columns \['sync_time'\]"),
        (lambda df: df.assign(placement=["2a"] + list(df.placement[1:])), r"row 1, column 'placement' must be replicas per node as digits 1-9, got '2a'"),
        (lambda df: df.assign(placement=["10"] + list(df.placement[1:])), r"row 1, column 'placement' must be replicas per node as digits 1-9, got '10'"),
        (lambda df: df.assign(placement=["5"] + list(df.placement[1:])), r"row 1, placement '5' puts more than gpus_per_node=4"),
        (lambda df: df.assign(step_time=[-1.0] + list(df.step_time[1:])), r"row 1, column 'step_time' must be a finite number > 0, got -1.0"),
        (lambda df: df.assign(sync_time=["x"] + list(df.sync_time[1:])), r"row 1, column 'sync_time' must be a finite number, got 'x'"),
        (lambda df: df.iloc[:0], r"has no rows"),
        (lambda df: df.assign(local_bsz=[8.5] + list(df.local_bsz[1:])), r"row 1, column 'local_bsz' must be an integer of at most 18 digits, got 8.5"),
    ],
)
def test_bad_placement_rows_are_rejected_naming_file_row_and_value(tmp_path, edit, match):
    folder = make_sia_folder(tmp_path)
    path = folder / "placements-aws.csv"
    edit(pd.read_csv(path, dtype={"placement": str})).to_csv(path, index=False)
    with pytest.raises(InvalidProblem, match=match):
        load_typed_profile(folder)


def test_missing_folder_type_and_validation_are_clear_errors(tmp_path):
    with pytest.raises(InvalidProblem, match="does not exist"):
        load_typed_profile(tmp_path / "nope")
    folder = make_sia_folder(tmp_path)
    with pytest.raises(InvalidProblem, match=r"has no placements-quad.csv \(types: \['aws', 'rtx'\]\)"):
        load_typed_profile(folder, types=["quad"])
    for f in folder.glob("validation-*.csv"):
        f.unlink()
    with pytest.raises(InvalidProblem, match="has no validation-B.csv"):
        load_typed_profile(folder)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InvalidProblem, match=r"has no placements-<type>.csv"):
        load_typed_profile(empty)


def test_scalability_rows_need_at_least_one_replica_per_node(tmp_path):
    folder = make_sia_folder(tmp_path)
    path = folder / "scalability-aws.csv"
    pd.read_csv(path).assign(num_replicas=2).to_csv(path, index=False)
    with pytest.raises(InvalidProblem, match=r"row 1, column 'num_replicas' must be >= num_nodes=4, got 2"):
        load_typed_profile(folder)


def test_load_typed_profiles_finds_apps_and_names_missing_ones(tmp_path):
    make_sia_folder(tmp_path, "a")
    make_sia_folder(tmp_path, "b")
    assert sorted(load_typed_profiles(tmp_path)) == ["a", "b"]
    assert list(load_typed_profiles(tmp_path, names=["b"])) == ["b"]
    with pytest.raises(InvalidProblem, match=r"profiles \['c'\] not found"):
        load_typed_profiles(tmp_path, names=["c"])


# --------------------------------------------------------------------------------- synthetic types
def _tables():
    p = pd.DataFrame(_rows(), columns=["placement", "local_bsz", "step_time", "sync_time"])
    s = pd.DataFrame(
        [(n, n * 4, m, *_times("4" * n, m)) for n in (2, 3) for m in _BSZ],
        columns=["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"],
    )
    return p, s


def test_speed_ratios_follow_the_vendor_figures_in_order():
    aws, rtx, a100 = (speed_ratios(t) for t in ("aws", "rtx", "dgx-ext"))
    assert (aws.compute, aws.intra_sync, aws.inter_sync) == (1.0, 1.0, 1.0)
    assert 1.0 < rtx.compute < a100.compute
    assert rtx.intra_sync == 1.0  # both PCIe 3.0
    assert a100.intra_sync > 10  # NVLink 3 against PCIe 3.0
    with pytest.raises(InvalidProblem, match="type must be one of"):
        speed_ratios("tpu")


def test_reference_type_keeps_the_measured_tables_unchanged():
    p, s = _tables()
    p2, s2 = synthesize_tables(p, s, "aws", reference_max_local_bsz=32, max_batch_size=4096)
    pd.testing.assert_frame_equal(p2, p)
    pd.testing.assert_frame_equal(s2, s)


def test_smaller_memory_trims_rows_and_faster_compute_divides_compute_only():
    p, s = _tables()
    r = speed_ratios("rtx")
    p2, _ = synthesize_tables(p, s, "rtx", reference_max_local_bsz=32, max_batch_size=4096)
    cap = math.floor(32 * GPU_TYPES["rtx"].memory_gb / GPU_TYPES["aws"].memory_gb)
    assert p2.local_bsz.max() <= cap and 16 in set(p2.local_bsz)
    row = p2[(p2.placement == "2") & (p2.local_bsz == 16)].iloc[0]
    step, sync = _times("2", 16)
    assert row.sync_time == pytest.approx(sync / r.intra_sync)
    assert row.step_time == pytest.approx((step - sync) / r.compute + sync / r.intra_sync)


def test_larger_memory_extends_rows_linearly_up_to_the_memory_cap():
    p, s = _tables()
    r = speed_ratios("dgx-ext")
    p2, s2 = synthesize_tables(p, s, "dgx-ext", reference_max_local_bsz=32, max_batch_size=4096)
    cap = math.floor(32 * GPU_TYPES["dgx-ext"].memory_gb / GPU_TYPES["aws"].memory_gb)
    one = p2[p2.placement == "1"].set_index("local_bsz")
    assert one.index.max() == cap and s2.local_bsz.max() == cap
    # compute stays linear in the batch beyond the measured rows (slope 0.001 s/sample)
    assert one.step_time[cap] == pytest.approx((0.1 + 0.001 * cap) / r.compute)


def test_larger_nodes_get_single_node_rows_and_reshaped_multi_node_rows():
    p, s = _tables()
    p2, s2 = synthesize_tables(p, s, "rtx", reference_max_local_bsz=32, max_batch_size=4096)
    assert {str(k) for k in range(1, 9)} <= set(p2.placement)
    r = speed_ratios("rtx")
    eight = p2[(p2.placement == "8") & (p2.local_bsz == 16)].iloc[0]
    assert eight.sync_time == pytest.approx(0.01 * 7 / r.intra_sync)  # the toy's own line
    # 8 and 12 replicas: one node of 8 (single-node data) and 2 nodes of 8 (multi-node data)
    assert set(s2[s2.num_replicas == 12].num_nodes) == {2, 3}
    assert not ((s2.num_nodes == 1).any())


def test_written_layout_reads_back_as_the_in_memory_profiles(tmp_path):
    src = tmp_path / "src"
    make_adaptdl_folder(src)
    written = write_typed_profiles(src, tmp_path / "out")
    assert [w.name for w in written] == ["toy"]
    assert profile_types(written[0]) == ("aws", "dgx-ext", "rtx")
    on_disk = load_typed_profile(written[0])
    in_memory = build_typed_profiles(src)["toy"]
    for t in ("aws", "rtx", "dgx-ext"):
        assert on_disk[t].max_local_bsz == in_memory[t].max_local_bsz
        pairs = ((on_disk[t].placements, in_memory[t].placements), (on_disk[t].scalability, in_memory[t].scalability))
        for a, b in pairs:
            pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False)
        assert on_disk[t].step_sync((2,), 16) == pytest.approx(in_memory[t].step_sync((2,), 16))
    with pytest.raises(InvalidProblem, match=r"profiles \['nope'\] not found"):
        write_typed_profiles(src, tmp_path / "out2", names=["nope"])


@needs_traces
def test_measured_t4_profile_yields_faster_types_by_the_documented_ratio():
    folder = TRACES / "profiles" / "yolov3"
    tables = synthesize_app(folder)
    pd.testing.assert_frame_equal(tables["aws"][0], read_placements(folder / "placements.csv"))
    t4 = tables["aws"][0]
    ref = t4[(t4.placement == "1") & (t4.local_bsz == 4)].iloc[0]
    for t in ("rtx", "dgx-ext"):
        row = tables[t][0][(tables[t][0].placement == "1") & (tables[t][0].local_bsz == 4)].iloc[0]
        r = speed_ratios(t)
        expected = (ref.step_time - ref.sync_time) / r.compute + ref.sync_time / r.intra_sync
        assert row.step_time == pytest.approx(expected)
    # Pollux's yolov3 cap on T4 is 8; the memory rule scales it per type
    assert tables["dgx-ext"][0].local_bsz.max() == memory_scaled_local_bsz(8, GPU_TYPES["dgx-ext"].memory_gb)
    assert tables["rtx"][0].local_bsz.max() <= memory_scaled_local_bsz(8, GPU_TYPES["rtx"].memory_gb) < 8


# --------------------------------------------------------------------------------- Sia's settings
def test_sia_settings_are_off_by_default():
    s = SiaSimSettings()
    assert s.goodput_factor("cifar10") == 1.0 and s.restart_delay_of("cifar10", 12.5) == 12.5


def test_sia_settings_when_enabled_divide_goodput_and_set_restart_delays():
    s = SiaSimSettings(enabled=True)
    assert s.goodput_factor("cifar10") == pytest.approx(1 / 1.8)
    assert s.goodput_factor("ncf") == pytest.approx(1 / 1.5)
    assert s.goodput_factor("imagenet") == pytest.approx(1 / 1.2)
    assert s.goodput_factor("my-job") == 1.0
    assert s.restart_delay_of("imagenet", 12.5) == 250.0 and s.restart_delay_of("my-job", 12.5) == 30.0


def test_sia_settings_reject_bad_values():
    with pytest.raises(InvalidProblem, match=r"calibration\['cifar10'\] must be a finite number > 0, got 0"):
        SiaSimSettings(calibration={"cifar10": 0})
    with pytest.raises(InvalidProblem, match=r"enabled must be true or false, got 1"):
        SiaSimSettings(enabled=1)
