"""Heterogeneous clusters: the bootstrap projection, the speedup base, node types and presets."""

from __future__ import annotations

import json

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.model.cluster_types import (
    GPU_TYPES,
    PRESETS,
    ClusterTypes,
    NodeType,
    load_cluster_types,
    memory_scaled_local_bsz,
)
from pollux_opt.model.projection import bootstrap_ratio, project_throughputs, projection_source
from pollux_opt.model.typed import speedup_base


# ------------------------------------------------------------------------------------ projection
def test_bootstrap_ratio_is_the_one_replica_speed_ratio():
    assert bootstrap_ratio({"a": 30.0, "b": 10.0}, "a", "b") == pytest.approx(3.0)


def test_projection_scales_the_source_curve_by_the_one_replica_ratio():
    one = {"slow": 10.0, "fast": 25.0}
    measured = {"slow": {1: 10.0, 2: 18.0, 4: 30.0}}
    # fast is 2.5x slow on one replica: slow's scaling curve at fast's speed
    assert project_throughputs(one, measured, "fast") == pytest.approx({1: 25.0, 2: 45.0, 4: 75.0})


def test_measured_rows_of_the_target_replace_the_projection():
    one = {"slow": 10.0, "fast": 25.0}
    measured = {"slow": {1: 10.0, 2: 18.0, 4: 30.0}, "fast": {2: 40.0}}
    assert project_throughputs(one, measured, "fast") == pytest.approx({1: 25.0, 2: 40.0, 4: 75.0})


def test_projection_reads_from_the_type_measured_most():
    measured = {"a": {1: 1.0, 2: 2.0}, "b": {1: 1.0, 2: 1.5, 4: 2.0}, "c": {1: 1.0, 2: 1.9, 8: 3.0}, "t": {}}
    assert projection_source(measured, "t") == "c"  # ties on two counts: the largest count wins
    assert projection_source({"a": {1: 5.0}, "t": {}}, "t") is None
    # without a multi-replica source, only what the target knows itself
    assert project_throughputs({"t": 4.0, "a": 5.0}, {"a": {1: 5.0}}, "t") == {1: 4.0}


def test_projection_needs_one_replica_profiles_of_target_and_source():
    measured = {"slow": {1: 10.0, 2: 18.0}}
    with pytest.raises(InvalidProblem, match=r"type 'fast' has no one-replica profile \(profiled: \['slow'\]\)"):
        project_throughputs({"slow": 10.0}, measured, "fast")
    with pytest.raises(InvalidProblem, match=r"type 'slow' has no one-replica profile"):
        project_throughputs({"fast": 10.0}, measured, "fast")


@pytest.mark.parametrize(
    "one, measured, match",
    [
        ({"t": 0.0, "s": 1.0}, {"s": {1: 1.0, 2: 2.0}}, r"one_replica\['t'\] must be a finite number > 0, got 0.0"),
        ({"t": 1.0, "s": 1.0}, {"s": {1: 1.0, 2: float("nan")}}, r"measured\['s'\]\[2\] must be a finite number > 0"),
        ({"t": 1.0, "s": 1.0}, {"s": {0: 1.0}}, r"measured\['s'\] replica count must be an integer >= 1, got 0"),
        ({"t": 1.0, "s": 1.0}, {"s": [1.0]}, r"measured\['s'\] must map replica counts to throughputs"),
    ],
)
def test_bad_projection_inputs_are_named(one, measured, match):
    with pytest.raises(InvalidProblem, match=match):
        project_throughputs(one, measured, "t")


def test_speedup_base_is_the_lowest_fair_share_goodput():
    assert speedup_base({"aws": 2.0, "rtx": 3.5, "dgx-ext": 9.0}) == ("aws", 2.0)
    assert speedup_base({"only": 7.0}) == ("only", 7.0)  # one type: today's fair-share base
    with pytest.raises(InvalidProblem, match="must name at least one type"):
        speedup_base({})
    with pytest.raises(InvalidProblem, match=r"goodput_at_share\['rtx'\] must be a finite number > 0, got -1"):
        speedup_base({"aws": 1.0, "rtx": -1})


# ---------------------------------------------------------------------------------- node types
def test_sia_64_preset_is_sias_64_gpu_cluster():
    c = load_cluster_types("sia-64")
    assert c.capacity() == {"aws": 24, "rtx": 24, "dgx-ext": 16} and c.total_replicas == 64
    nodes = c.nodes()
    assert len(nodes) == 11 and len({n[0] for n in nodes}) == 11
    assert nodes[0] == ("aws-0", "aws", 4) and nodes[-1] == ("dgx-ext-1", "dgx-ext", 8)


def test_artifact_gpu_types_keep_their_profiled_node_sizes():
    sizes = {name: t.gpus_per_node for name, t in GPU_TYPES.items()}
    assert sizes == {"aws": 4, "rtx": 8, "dgx-ext": 8, "quad": 4, "azure": 8, "dgx": 8}
    assert all(c.total_replicas > 0 for c in PRESETS.values())


def test_cluster_description_reads_from_json(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"node_types": [
        {"name": "fast", "count": 2, "replicas_per_node": 2},
        {"name": "slow", "count": 1, "replicas_per_node": 2, "cpu_quota": 0.5, "memory_gb": 8},
    ]}))
    c = load_cluster_types(path)
    assert c.names == ("fast", "slow") and c["slow"].cpu_quota == 0.5
    assert c.nodes() == [("fast-0", "fast", 2), ("fast-1", "fast", 2), ("slow-0", "slow", 2)]


@pytest.mark.parametrize(
    "data, match",
    [
        ({"node_types": [{"name": "a", "count": 0, "replicas_per_node": 4}]},
         r"node_types\[0\]: node type 'a': count must be an integer in \(0, \d+\], got 0"),
        ({"node_types": [{"name": "a", "count": 1, "replicas_per_node": 4, "cpu_quota": 1.5}]},
         r"node_types\[0\]: node type 'a': cpu_quota must be a finite number in \(0, 1\], got 1.5"),
        ({"node_types": [{"name": "a", "count": 1}]}, r"node_types\[0\]: missing field 'replicas_per_node'"),
        ({"node_types": [{"name": "a", "count": 1, "replicas_per_node": 4, "gpus": 4}]},
         r"node_types\[0\]: unknown field 'gpus'"),
        ({"node_types": [{"name": "../x", "count": 1, "replicas_per_node": 4}]},
         r"node_types\[0\]: node type name must be letters, digits"),
        ({"node_types": [{"name": "a", "count": 1, "replicas_per_node": 4}] * 2},
         r"node_types\[1\].name: duplicate node type 'a'"),
        ({"node_types": []}, r"node_types must not be empty"),
        ({"node_types": "aws"}, r"node_types must be a list of objects, got 'aws'"),
        ({"nodes": []}, r"must be an object with a 'node_types' list"),
        ({"node_types": [], "extra": 1}, r"unknown field 'extra'"),
        ({"node_types": [3]}, r"node_types\[0\] must be an object with fields"),
    ],
)
def test_bad_cluster_descriptions_name_field_and_value(tmp_path, data, match):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidProblem, match=match):
        load_cluster_types(path)


def test_unreadable_description_and_unknown_preset_are_clear(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{not json")
    with pytest.raises(InvalidProblem, match="is not readable JSON"):
        load_cluster_types(path)
    with pytest.raises(InvalidProblem, match=r"must be a preset \['aws-64', 'local-hetero', 'sia-64'\] or a JSON "
                                             r"file, got 'sia-65'"):
        load_cluster_types("sia-65")
    with pytest.raises(InvalidProblem, match=r"node type must be one of \['aws', 'rtx', 'dgx-ext'\], got 'tpu'"):
        PRESETS["sia-64"]["tpu"]
    with pytest.raises(InvalidProblem, match=r"node_types\[0\] must be a NodeType"):
        ClusterTypes(("aws",))


def test_memory_rule_scales_the_local_batch_cap_with_device_memory():
    assert memory_scaled_local_bsz(8, 16.0) == 8
    assert memory_scaled_local_bsz(8, 11.0) == 5  # floor(8 * 11 / 16)
    assert memory_scaled_local_bsz(8, 40.0) == 20
    assert memory_scaled_local_bsz(1, 1.0) == 1  # never below one sample
    assert memory_scaled_local_bsz(1000, 80.0, max_batch_size=2048) == 2048
    assert NodeType("t", 1, 4).max_local_bsz(12) == 12  # no memory given: the reference's cap
    with pytest.raises(InvalidProblem, match="reference_max must be an integer >= 1, got 0"):
        memory_scaled_local_bsz(0, 16.0)
