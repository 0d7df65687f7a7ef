"""A Ray test cluster on this machine (``ray.cluster_utils.Cluster``): a head
without CPUs and two nodes of one CPU each, shared by the tests of this folder
that need one.  The tests skip with the reason where Ray or torch is missing."""

from __future__ import annotations

import logging

import pytest

#: CPUs of each worker node of the test cluster (one replica each).
NODE_CPUS = 1
#: Worker nodes of the test cluster.
NODES = 2


def _require(module: str, reason: str):
    return pytest.importorskip(module, reason=reason)


@pytest.fixture(scope="package")
def ray_cluster():
    """``(cluster, ray)``: the test cluster, connected; nodes a test adds or
    removes are restored to :data:`NODES` nodes of :data:`NODE_CPUS` after it."""
    ray = _require("ray", "the Ray backend needs Ray (pip install 'pollux-opt[ray]')")
    _require("torch", "real jobs need the CPU build of torch (pip install 'pollux-opt[jobs]')")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(NODES):
        cluster.add_node(num_cpus=NODE_CPUS)
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster, ray
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def two_nodes(ray_cluster):
    """The test cluster with exactly :data:`NODES` worker nodes, before and after the test."""
    cluster, ray = ray_cluster
    _restore(cluster)
    yield cluster, ray
    _restore(cluster)


def _restore(cluster) -> None:
    nodes = list(cluster.worker_nodes)
    while len(nodes) > NODES:
        cluster.remove_node(nodes.pop())
    while len(nodes) < NODES:
        nodes.append(cluster.add_node(num_cpus=NODE_CPUS))
    cluster.wait_for_nodes()
