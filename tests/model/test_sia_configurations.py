"""Sia's configuration rule: powers of two inside a node, then whole nodes, one type per configuration."""

from __future__ import annotations

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.model.cluster_types import PRESETS
from pollux_opt.model.configs import sia_configurations, typed_configurations


def test_four_replica_nodes_match_the_artifacts_table():
    # sia-simulator/sia.py CONFIGS_4GPU: nodes 1,1,1,2..16 and GPUs 1,2,4,8..64
    configs = sia_configurations(4, 16)
    assert [n for n, _ in configs] == [1, 1, 1, *range(2, 17)]
    assert [k for _, k in configs] == [1, 2, 4, *range(8, 65, 4)]


def test_eight_replica_nodes_match_the_artifacts_table():
    configs = sia_configurations(8, 8)
    assert [n for n, _ in configs] == [1, 1, 1, 1, *range(2, 9)]
    assert [k for _, k in configs] == [1, 2, 4, 8, *range(16, 65, 8)]


@pytest.mark.parametrize(
    "per_node, nodes, expected",
    [
        (1, 3, ((1, 1), (2, 2), (3, 3))),
        (6, 1, ((1, 1), (1, 2), (1, 4), (1, 6))),  # a node size that is not a power of two: the full node too
        (2, 2, ((1, 1), (1, 2), (2, 4))),
    ],
)
def test_small_cases(per_node, nodes, expected):
    assert sia_configurations(per_node, nodes) == expected


def test_every_typed_configuration_fits_one_type():
    types = {t.name: (t.count, t.replicas_per_node) for t in PRESETS["sia-64"].types}
    configs = typed_configurations(types)
    # aws: 1, 2, 4 + 2..6 nodes; rtx: 1, 2, 4, 8 + 2..3 nodes; dgx-ext: 1, 2, 4, 8 + 2 nodes
    assert len(configs) == (3 + 5) + (4 + 2) + (4 + 1)
    for name, nodes, k in configs:
        count, per_node = types[name]
        assert nodes <= count and k <= nodes * per_node
        assert nodes == 1 or k == nodes * per_node  # several nodes: whole nodes only


def test_bad_counts_name_the_argument_and_type():
    with pytest.raises(InvalidProblem, match="replicas_per_node must be an integer in"):
        sia_configurations(0, 2)
    with pytest.raises(InvalidProblem, match="num_nodes must be an integer > 0, got 0"):
        sia_configurations(4, 0)
    with pytest.raises(InvalidProblem, match=r"types\['rtx'\]: num_nodes must be an integer > 0, got 0"):
        typed_configurations({"rtx": (0, 8)})
    with pytest.raises(InvalidProblem, match=r"types\['rtx'\] must be \(num_nodes, replicas_per_node\)"):
        typed_configurations({"rtx": 8})
    with pytest.raises(InvalidProblem, match="types must name at least one node type"):
        typed_configurations({})
