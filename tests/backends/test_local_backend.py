"""The real backend's parts that need no jobs: the job-handle protocol, CPU
pinning, the run directory's configuration and the demo's defaults."""

from __future__ import annotations

import inspect
import json
import os

import pytest

from pollux_opt import Cluster, InvalidProblem
from pollux_opt.backends.local import JobHandle, default_cluster, load_run_config
from pollux_opt.backends.local.nodes import CpuPinning
from pollux_opt.backends.local.rundir import CONFIG_FILE, cluster_from_json, cluster_to_json, open_run_config
from pollux_opt.workloads import WORKLOAD_SETS

HANDLE_METHODS = ("start", "stop", "cancel", "poll", "report", "wait", "close")


def _protocol_methods() -> set[str]:
    return {name for name, member in vars(JobHandle).items() if inspect.isfunction(member) and name[0] != "_"}


def test_the_protocol_declares_exactly_what_the_backend_calls():
    assert _protocol_methods() == set(HANDLE_METHODS)


@pytest.fixture(params=["ElasticJob", "FakeJob"])
def handle_class(request, fake_jobs) -> type:
    """The real job handle and the tests' in-process stand-in for it."""
    if request.param == "FakeJob":
        return fake_jobs.job_class
    from pollux_opt.runtime.job import ElasticJob

    return ElasticJob


def test_job_handles_implement_the_protocol(handle_class):
    """Every protocol method exists on the class and accepts the protocol's calls:
    the same leading parameters, every keyword the protocol names, and a
    default wherever the protocol's parameter may be left out."""
    cls = handle_class
    for name in HANDLE_METHODS:
        want = inspect.signature(getattr(JobHandle, name)).parameters
        have = inspect.signature(getattr(cls, name)).parameters
        positional = [p for p in want.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert [p.name for p in positional] == list(have)[: len(positional)], name
        for p in want.values():
            assert p.name in have, (name, p.name)
            if p.default is not inspect.Parameter.empty:
                assert have[p.name].default is not inspect.Parameter.empty, (name, p.name)


def test_a_class_missing_a_command_is_not_a_job_handle():
    class Partial:
        def start(self, replicas, num_nodes=None, *, cpus=None):
            pass

    assert not isinstance(Partial(), JobHandle)


def test_pinning_gives_each_replica_its_own_cpu_and_frees_them():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    pin = CpuPinning(Cluster.uniform(2, 1), pin=True)
    assert pin.enabled
    assert pin.grow("a", {"n0": 1}) == [cpus[0]]
    assert pin.grow("b", {"n0": 1}) is None  # n0's one CPU is a's
    assert pin.grow("b", {"n1": 1}) == [cpus[1]]
    pin.shrink("a", {})
    assert pin.grow("b", {"n0": 1, "n1": 1}) == [cpus[0], cpus[1]]
    pin.release("b")
    assert pin.grow("a", {"n1": 1}) == [cpus[1]]


def test_pinning_is_off_for_a_cluster_larger_than_this_machine():
    too_big = len(os.sched_getaffinity(0)) + 1
    pin = CpuPinning(Cluster.uniform(1, too_big), pin=True)
    assert not pin.enabled and pin.grow("a", {"n0": 1}) is None


def test_default_cluster_splits_the_cpus_and_names_bad_arguments():
    assert default_cluster(2, 5).nodes[0].cpus == 3 and default_cluster(2, 5).total_cpus == 5
    with pytest.raises(InvalidProblem, match=r"cpus must be an integer >= 1, got 0"):
        default_cluster(1, 0)
    with pytest.raises(InvalidProblem, match=r"num_nodes must be an integer in \[1, 2\], got 3"):
        default_cluster(3, 2)


def test_default_cluster_refuses_zero_nodes_or_cpus_rather_than_defaulting():
    with pytest.raises(InvalidProblem, match=r"num_nodes must be an integer in \[1, 2\], got 0"):
        default_cluster(0, 2)
    with pytest.raises(InvalidProblem, match=r"cpus must be an integer >= 1, got 0"):
        default_cluster(2, 0)
    with pytest.raises(InvalidProblem, match=r"cpus must be an integer >= 1, got True"):
        default_cluster(1, True)
    with pytest.raises(InvalidProblem, match=r"num_nodes must be an integer in \[1, 2\], got None"):
        default_cluster(None, 2)


def test_run_config_is_written_once_and_resumed(tmp_path):
    wl = WORKLOAD_SETS["mixed"]
    cluster = Cluster.uniform(2, 1)
    cfg, resumed = open_run_config(tmp_path, wl, "fixed", cluster=cluster, interval=5.0, pin_cpus=False,
                                   runtime_options=None)
    assert not resumed and load_run_config(tmp_path) == cfg == json.loads((tmp_path / CONFIG_FILE).read_text())
    assert cluster_from_json(cfg["cluster"]) == cluster and cluster_to_json(cluster) == cfg["cluster"]
    again, resumed = open_run_config(tmp_path, None, None, cluster=None, interval=99.0, pin_cpus=True,
                                     runtime_options=None)
    assert resumed and again == cfg
    with pytest.raises(InvalidProblem, match=r"interval must be a finite number of seconds > 0, got nan"):
        open_run_config(tmp_path / "new", wl, "fixed", cluster=None, interval=float("nan"), pin_cpus=False,
                        runtime_options=None)
    with pytest.raises(InvalidProblem, match=r"bad cluster in run config"):
        cluster_from_json([{"cpus": 1}])
    with pytest.raises(InvalidProblem, match=r"has no config.json"):
        load_run_config(tmp_path / "none")
