"""GPUs as a node type of a real run, without CUDA: the GPUs torch would report are
stood in for, and the jobs are the ``fake_jobs`` stand-ins.  Which GPU each replica
holds, what the run records, and what the CLI's ``--gpus`` builds or refuses."""

from __future__ import annotations

import logging
import os

import pytest

import pollux_opt.backends.local.backend as rb
from pollux_opt import InvalidProblem
from pollux_opt.backends.local import nodes as nodes_module
from pollux_opt.backends.local import run_workload
from pollux_opt.backends.local.nodes import GpuSlots, ReplicaSlots, gpu_cluster, typed_cluster
from pollux_opt.backends.local.rundir import load_run_config
from pollux_opt.cli.main import main
from pollux_opt.model import Cluster
from pollux_opt.model.cluster_types import ClusterTypes, NodeType
from pollux_opt.records.events import read_events
from pollux_opt.workloads import Workload, WorkloadJob

TWO_CPUS = len(os.sched_getaffinity(0)) >= 2
needs_two_cpus = pytest.mark.skipif(not TWO_CPUS, reason="a GPU and a CPU node need two CPUs this process may use")


def _gpus_seen(monkeypatch, count: int) -> None:
    monkeypatch.setattr(nodes_module, "machine_gpus", lambda: count)


def _gpu_types(gpu_nodes: int = 2, per_node: int = 2) -> ClusterTypes:
    return ClusterTypes((NodeType("a100", gpu_nodes, per_node, slot="gpu"), NodeType("cores", 1, 2)))


def test_each_replica_on_a_gpu_node_holds_a_gpu_of_its_own():
    slots = GpuSlots(Cluster.from_types(_gpu_types()), ("a100",))
    assert slots.grow("a", {"a100-1": 1, "cores-0": 1}) == [2, None]
    assert slots.grow("b", {"a100-0": 2}) == [0, 1]
    assert slots.grow("c", {"a100-1": 2}) is None  # one of its GPUs is a's
    slots.shrink("a", {"cores-0": 1})
    assert slots.grow("c", {"a100-1": 2}) == [2, 3]
    assert slots.grow("a", {"cores-0": 1}) is None  # no GPU node in the placement
    slots.release("b")
    assert slots.grow("a", {"a100-0": 1}) == [0]


def test_cpu_pins_and_gpus_are_held_and_freed_together():
    cluster = Cluster.from_types(_gpu_types(gpu_nodes=1, per_node=1))
    slots = ReplicaSlots(cluster, False, ("a100",))
    assert slots.grow("a", {"a100-0": 1}) == (None, [0])
    assert slots.grow("b", {"a100-0": 1}) == (None, None)
    slots.release("a")
    assert slots.grow("b", {"a100-0": 1}) == (None, [0])


@needs_two_cpus
def test_the_machine_cluster_offers_its_gpus_beside_the_remaining_cores(monkeypatch):
    _gpus_seen(monkeypatch, 1)
    types = gpu_cluster(1, 2)
    assert [(t.name, t.count, t.replicas_per_node, t.slot) for t in types.types] == [("gpu", 1, 1, "gpu"),
                                                                                   ("cpu", 1, 1, "cpu")]
    assert [t.name for t in gpu_cluster(1, 1).types] == ["gpu"]  # no core left for CPU replicas
    with pytest.raises(InvalidProblem, match="gpus must be at most the 1 GPUs torch sees here"):
        gpu_cluster(2, 2)
    _gpus_seen(monkeypatch, 3)
    with pytest.raises(InvalidProblem, match=r"gpus must be at most cpus \(1\)"):
        gpu_cluster(2, 1)


def test_a_description_with_more_gpu_slots_than_gpus_is_refused(monkeypatch):
    _gpus_seen(monkeypatch, 0)
    one_gpu = ClusterTypes((NodeType("h100", 1, 1, slot="gpu"),))
    with pytest.raises(InvalidProblem, match="node type 'h100' has 1 GPU slots but torch sees 0 GPUs here"):
        typed_cluster(one_gpu)
    _gpus_seen(monkeypatch, 1)
    cluster, quotas, gpu_types = typed_cluster(one_gpu)
    assert gpu_types == ("h100",) and quotas == {} and cluster.total_cpus == 1


@needs_two_cpus
def test_a_run_on_gpus_gives_each_job_its_own_gpu_and_records_them(tmp_path, monkeypatch, fake_jobs):
    _gpus_seen(monkeypatch, 2)
    workload = Workload("gpus", (WorkloadJob("a", "digits-cnn", 0.0, 1, 32),
                                 WorkloadJob("b", "digits-cnn", 1.0, 1, 32)))
    types = ClusterTypes((NodeType("gpu", 1, 2, slot="gpu"),))
    clock = fake_jobs.clock()
    monkeypatch.setattr(rb.time, "time", clock.time)  # run_workload's own timestamps
    summary = run_workload(tmp_path, workload, "fixed", cluster=types, interval=10.0, progress=False,
                           pin_cpus=False, backend_kwargs=fake_jobs.backend_kwargs(clock))
    assert all(j["completed"] for j in summary["jobs"])
    assert load_run_config(tmp_path)["gpu_types"] == ["gpu"]
    events = read_events(tmp_path / "events.jsonl")
    held: dict[str, list[int]] = {}
    for e in events:
        if e["type"] in ("start", "rescale_begin"):
            held[e["job_id"]] = e.get("gpus") or []
            assert len(held[e["job_id"]]) == sum(e["placement"].values())
            taken = [g for gpus in held.values() for g in gpus]
            assert len(taken) == len(set(taken)) and set(taken) <= {0, 1}
    assert sorted(e["gpus"][0] for e in events if e["type"] == "start") == [0, 1]  # both ran at once


def _cluster_args(*flags: str):
    import argparse

    from pollux_opt.cli.options import add_cluster_args, cluster_from_args

    p = argparse.ArgumentParser()
    add_cluster_args(p)
    return cluster_from_args(p.parse_args(list(flags)))


@needs_two_cpus
def test_cli_gpus_builds_the_machine_cluster_or_refuses(monkeypatch, caplog):
    _gpus_seen(monkeypatch, 1)
    import pollux_opt.runtime.device as device_module

    monkeypatch.setattr(device_module, "machine_gpus", lambda: 1)
    assert [t.name for t in _cluster_args("--gpus", "1", "--cpus", "2").types] == ["gpu", "cpu"]
    assert [t.name for t in _cluster_args("--gpus", "all", "--cpus", "2").types] == ["gpu", "cpu"]
    assert _cluster_args("--gpus", "0", "--cpus", "2").total_cpus == 2  # CPU cores only, untyped
    with pytest.raises(InvalidProblem, match="--gpus must be a number of GPUs or 'all', got 'two'"):
        _cluster_args("--gpus", "two")
    with pytest.raises(InvalidProblem, match="describe other nodes with --cluster, not --nodes"):
        _cluster_args("--gpus", "1", "--nodes", "2")
    with pytest.raises(InvalidProblem, match="give it without --nodes, --cpus and --gpus"):
        _cluster_args("--gpus", "1", "--cluster", "local-hetero")
    monkeypatch.setattr(device_module, "machine_gpus", lambda: 0)
    with caplog.at_level(logging.WARNING):
        assert _cluster_args("--gpus", "all", "--cpus", "1").total_cpus == 1
    assert "torch sees no GPU here" in caplog.text


def test_cli_run_refuses_gpus_it_cannot_see(tmp_path, monkeypatch, capsys):
    _gpus_seen(monkeypatch, 0)
    assert main(["run", "--workload", "mixed", "--policy", "fixed", "--out", str(tmp_path), "--gpus", "1"]) == 2
    assert "gpus must be at most the 0 GPUs torch sees here" in capsys.readouterr().err
