"""Node types on the real backend: cluster descriptions, throttled nodes' cgroups,
per-type measurements of real replicas, and the CLI's ``--cluster``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.backends.local import nodes as nodes_module
from pollux_opt.backends.local.nodes import (
    RunNodes,
    ThrottleRefused,
    check_throttle,
    throttle_period_us,
    typed_cluster,
)
from pollux_opt.backends.local.rundir import cluster_from_json, cluster_to_json, open_run_config
from pollux_opt.backends.local.throttle import PARENT, ThrottleUnavailable
from pollux_opt.cli.main import main
from pollux_opt.model import Cluster
from pollux_opt.model.cluster_types import PRESETS, ClusterTypes, NodeType
from pollux_opt.workloads.load import load_workload


TWO_CPUS = len(os.sched_getaffinity(0)) >= 2
needs_two_cpus = pytest.mark.skipif(not TWO_CPUS, reason="local-hetero needs two CPUs this process may use")


def _one_cpu(monkeypatch):
    monkeypatch.setattr(nodes_module.os, "sched_getaffinity", lambda pid: {0})


# ------------------------------------------------------------------ descriptions
@needs_two_cpus
def test_local_hetero_is_one_fast_and_one_throttled_node():
    cluster, quotas, _ = typed_cluster(PRESETS["local-hetero"])
    assert [(n.id, n.cpus, n.type) for n in cluster.nodes] == [("fast-0", 1, "fast"), ("slow-0", 1, "slow")]
    assert quotas == {"slow": 0.5} and cluster.typed


def test_a_description_with_more_cpus_than_this_process_may_use_is_refused(monkeypatch):
    _one_cpu(monkeypatch)
    refusal = r"has 2 slots \(fast: 1 x 1, slow: 1 x 1\) but this process may use 1 CPUs"
    with pytest.raises(InvalidProblem, match=refusal):
        typed_cluster(PRESETS["local-hetero"])


def test_typed_nodes_and_quotas_survive_the_run_config(tmp_path):
    cluster = Cluster.from_types(ClusterTypes((NodeType("fast", 1, 1), NodeType("slow", 1, 1, cpu_quota=0.5))))
    assert cluster_from_json(json.loads(json.dumps(cluster_to_json(cluster)))) == cluster
    untyped = Cluster.uniform(2, 1)
    assert cluster_to_json(untyped) == [{"id": "n0", "cpus": 1}, {"id": "n1", "cpus": 1}]  # no types on an untyped cluster
    cfg, resumed = open_run_config(tmp_path, load_workload("hetero", quick=True), "fixed", cluster=cluster,
                                   interval=10.0, pin_cpus=True, runtime_options=None, cpu_quota={"slow": 0.5})
    assert not resumed and cfg["cpu_quota"] == {"slow": 0.5}
    cfg2, _ = open_run_config(tmp_path / "u", load_workload("hetero", quick=True), "fixed", cluster=untyped,
                              interval=10.0, pin_cpus=True, runtime_options=None)
    assert "cpu_quota" not in cfg2


def test_a_quota_on_a_type_the_cluster_lacks_is_refused(tmp_path):
    with pytest.raises(InvalidProblem, match="cpu_quota names node type 'slow', which the cluster lacks"):
        open_run_config(tmp_path, load_workload("hetero", quick=True), "fixed", cluster=Cluster.uniform(1, 1),
                        interval=10.0, pin_cpus=True, runtime_options=None, cpu_quota={"slow": 0.5})


def test_the_period_keeps_every_quota_above_the_kernels_minimum():
    assert throttle_period_us({"slow": 0.5}) == 20_000
    assert throttle_period_us({"slow": 0.02}) == 50_000
    assert throttle_period_us({}) == 20_000


# ---------------------------------------------------------------- refusing
def test_a_throttled_cluster_without_cgroups_fails_up_front_with_the_reason(monkeypatch):
    def unavailable(*args, **kwargs):
        raise ThrottleUnavailable("cgroup cpu controller at '/x' is not writable by this process")

    monkeypatch.setattr(nodes_module, "detect", unavailable)
    with pytest.raises(ThrottleRefused, match=r"node type 'slow' \(cpu_quota 0.5\) needs cgroup CPU quotas.*"
                                              r"not writable by this process") as info:
        check_throttle({"slow": 0.5})
    assert isinstance(info.value, ValueError)
    check_throttle({})  # nothing throttled: nothing to check


def test_cli_refuses_cluster_with_nodes(capsys):
    assert main(["run", "--workload", "hetero", "--policy", "fixed", "--out", "x", "--cluster", "local-hetero",
                 "--nodes", "2"]) == 2
    assert "--cluster describes the nodes: give it without --nodes, --cpus and --gpus" in capsys.readouterr().err


def test_cli_names_an_unknown_cluster(tmp_path, capsys):
    assert main(["demo", "--quick", "--quiet", "--out", str(tmp_path / "d"), "--cluster", "no-such"]) == 2
    err = capsys.readouterr().err
    assert "cluster description must be a preset" in err and "'no-such'" in err
    assert not (tmp_path / "d").exists()


def test_cli_refuses_a_cluster_larger_than_this_machine(tmp_path, capsys, monkeypatch):
    _one_cpu(monkeypatch)
    assert main(["demo", "--quick", "--quiet", "--out", str(tmp_path / "d"), "--cluster", "local-hetero"]) == 2
    assert "but this process may use 1" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


@needs_two_cpus
def test_cli_reports_missing_cgroups_before_writing_the_run(tmp_path, capsys, monkeypatch):
    def unavailable(*args, **kwargs):
        raise ThrottleUnavailable("no cgroup cpu controller under '/sys/fs/cgroup' (neither v2 nor v1)")

    monkeypatch.setattr(nodes_module, "detect", unavailable)
    assert main(["run", "--workload", "hetero", "--quick", "--policy", "fixed", "--out", str(tmp_path / "r"),
                 "--cluster", "local-hetero", "--quiet"]) == 2
    assert "needs cgroup CPU quotas, which cannot be set here: no cgroup cpu controller" in capsys.readouterr().err
    assert not (tmp_path / "r" / "config.json").exists()


# ------------------------------------------------------------- real cgroups
@needs_two_cpus
def test_node_cgroups_give_throttled_nodes_a_group_and_others_the_root(cgroups):
    cluster, quotas, _ = typed_cluster(PRESETS["local-hetero"])
    nodes = RunNodes(cluster, quotas)
    try:
        dirs = nodes.command_kwargs({"fast-0": 1, "slow-0": 1})["cgroups"]
        assert dirs["fast-0"] == str(cgroups.cpu_root)
        slow = Path(dirs["slow-0"])
        assert slow.parent.name == PARENT and slow.name == f"{os.getpid()}-slow-0"
        if cgroups.version == 1:
            assert (slow / "cpu.cfs_quota_us").read_text().strip() == "10000"
            assert (slow / "cpu.cfs_period_us").read_text().strip() == "20000"
    finally:
        nodes.close()
    assert not slow.exists()
