"""The simulator on clusters of several node types: per-type truth, per-type reports, bootstrapping."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pollux_opt import Cluster, InvalidProblem
from pollux_opt.backends.sim import ParametricProfile, SimBackend, SimConfig, simulate
from pollux_opt.backends.sim.state import SiaSimSettings
from pollux_opt.backends.sim.profile_files import load_typed_profiles
from pollux_opt.cli.simulate import cluster_and_profiles
from pollux_opt.model.cluster_types import ClusterTypes, NodeType
from pollux_opt.scheduling.loop import Decision
from pollux_opt.workloads import WorkloadJob


def _toy(speed: float, max_local: int = 256, progress: float = 200.0) -> ParametricProfile:
    """A job whose every time is ``1 / speed`` of the reference's."""
    base = ParametricProfile("toy", max_epochs=3, epoch_progress=progress, max_local_bsz=max_local)
    times = {f: getattr(base, f) / speed for f in ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r")}
    return ParametricProfile("toy", max_epochs=3, epoch_progress=progress, max_local_bsz=max_local, **times)


TYPED = {"toy": {"slow": _toy(1.0), "fast": _toy(3.0, max_local=128)}}


def _cluster(slow=1, fast=1, size=4):
    return Cluster.from_types(ClusterTypes((NodeType("slow", slow, size), NodeType("fast", fast, size))))


def _jobs(n=3, spacing=30.0):
    return [WorkloadJob(f"j{i}", "toy", i * spacing, 1, 256) for i in range(n)]


def _run(backend, placement, seconds=60.0):
    backend.apply(Decision(placement, 0.0, 0.0, "fifo"))
    backend.advance(seconds)


def test_new_jobs_are_profiled_on_one_replica_of_every_type():
    backend = SimBackend(_jobs(1), TYPED, _cluster())
    job = backend._jobs["j0"]
    assert set(job.typed.one_replica) == {"slow", "fast"}
    assert job.typed.one_replica["fast"] == pytest.approx(3.0 * job.typed.one_replica["slow"], rel=0.01)
    assert backend.views()[0].max_profiled_replicas == 1


def test_unmeasured_types_are_projected_from_the_measured_one():
    long = {"toy": {"slow": _toy(1.0, progress=1e5), "fast": _toy(3.0, 128, progress=1e5)}}
    backend = SimBackend(_jobs(1), long, _cluster(slow=1, fast=1))
    _run(backend, {"j0": {"slow-0": 2}})
    _run(backend, {"j0": {"slow-0": 4}})
    models = backend.views()[0].goodput_models
    slow, fast = models["slow"], models["fast"]
    m = np.array([32, 64])
    ratio = fast.throughput(1, 4, m) / slow.throughput(1, 4, m)
    assert ratio == pytest.approx(np.full(2, 3.0), rel=0.02)  # slow's curve at fast's one-replica speed
    assert fast.limits.max_local_bsz == 128 and slow.limits.max_local_bsz == 256
    # once it runs there, the type's own measurements replace the projection
    _run(backend, {"j0": {"fast-0": 2}}, seconds=60.0)
    assert backend._jobs["j0"].completion_time is None
    state = backend._jobs["j0"].typed
    assert state.models()["fast"] is state.agents["fast"].model()


def test_a_job_runs_at_its_type_speed_and_over_two_types_at_the_slowest():
    rates = {}
    for name, placement in (("slow", {"slow-0": 2}), ("fast", {"fast-0": 2}), ("mixed", {"slow-0": 1, "fast-0": 1})):
        backend = SimBackend(_jobs(1), TYPED, _cluster(), fixed_batch=True)  # one batch on every type
        _run(backend, {"j0": placement}, seconds=600.0)
        rates[name] = backend._jobs["j0"].last_throughput
    assert rates["fast"] > 2.5 * rates["slow"]
    # two replicas on two nodes: inter-node sync, at the slow type's compute speed
    assert rates["mixed"] <= rates["slow"]


def test_typed_profile_must_cover_the_clusters_types():
    other = Cluster.from_types(ClusterTypes((NodeType("slow", 1, 4), NodeType("rtx", 1, 4))))
    with pytest.raises(InvalidProblem, match=r"profile of 'toy' has no node type 'rtx' \(its types: \['slow', 'fast'\]\)"):
        SimBackend(_jobs(1), TYPED, other)


@pytest.mark.parametrize("policy, options", [("pollux", {"options": {"solver": "greedy"}}), ("sia", {}),
                                             ("pollux-unaware", {"options": {"solver": "greedy"}})])
def test_policies_finish_a_typed_workload_and_the_aware_ones_never_mix_types(policy, options, tmp_path):
    from pollux_opt.model import Options

    opts = {k: (Options(**v) if k == "options" else v) for k, v in options.items()}
    res = simulate(_jobs(3), TYPED, policy, cluster=_cluster(), interval=60.0, out_dir=tmp_path,
                   policy_options=opts, max_rounds=400)
    assert res.completed == 3
    kinds = {"slow-0": "slow", "fast-0": "fast"}
    for line in (tmp_path / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "allocation" and policy != "pollux-unaware":
            for p in event["placement"].values():
                assert len({kinds[n] for n in p}) <= 1


def test_one_type_cluster_gives_the_untyped_simulation():
    from pollux_opt.backends.sim import ParametricProfile as P

    profiles = {"toy": P("toy", max_epochs=3, epoch_progress=200.0)}
    jobs = [WorkloadJob(f"j{i}", "toy", i * 40.0, 2, 256) for i in range(5)]
    plain = simulate(jobs, profiles, "pollux", cluster=Cluster.uniform(2, 4), interval=60.0)
    one = Cluster.from_types(ClusterTypes((NodeType("aws", 2, 4),)))
    typed = simulate(jobs, profiles, "pollux", cluster=one, interval=60.0)
    assert typed.avg_jct == plain.avg_jct and typed.makespan == plain.makespan


def test_sia_calibration_slows_goodput_and_sets_restart_delays():
    jobs = [WorkloadJob("cifar10-0", "toy", 0.0, 1, 256)]
    profiles = {"toy": _toy(1.0)}
    on = SimConfig(sia=SiaSimSettings(enabled=True))
    backend = SimBackend(jobs, profiles, Cluster.uniform(1, 4), config=on)
    assert backend.views()[0].restart_delay == 30.0  # the application "toy" is not one of Sia's
    times = {}
    for name, config in (("off", SimConfig()), ("on", on)):
        b = SimBackend([WorkloadJob("a", "toy", 0.0, 1, 256)], {"toy": _toy(1.0)}, Cluster.uniform(1, 4),
                       config=config)
        _run(b, {"a": {"n0": 1}}, seconds=120.0)
        times[name] = b._jobs["a"].last_goodput
    assert times["on"] == times["off"]  # no calibration factor for an unknown application
    assert SimConfig().sia.enabled is False


# ------------------------------------------------------------------------ Sia's layout, read by the CLI
def _write_sia_app(folder, types):
    """A toy application in Sia's layout: ``placements-T.csv`` per type (``1/speed`` times) and validation."""
    folder.mkdir(parents=True)
    for b in (128, 512):
        pd.DataFrame({"progress": [100.0, 200.0, 300.0], "iteration": [100.0, 200.0, 300.0],
                      "metric": [0.1, 0.5, 0.9], "grad_sqr": [1.0] * 3,
                      "grad_var": [1.0, 2.0, 3.0]}).to_csv(folder / f"validation-{b}.csv", index=False)
    for t, (speed, per_node) in types.items():
        rows = []
        for n in (1, 2):
            for k in range(1, per_node + 1):
                for m in (16, 32, 64):
                    sync = 0.0 if n * k == 1 else (0.02 if n > 1 else 0.005) * (n * k - 1)
                    rows.append({"local_bsz": m, "step_time": (0.05 + 0.002 * m) / speed + sync,
                                 "sync_time": sync, "placement": str(k) * n})
        pd.DataFrame(rows).to_csv(folder / f"placements-{t}.csv", index=False)


def test_cli_reads_a_typed_cluster_with_profiles_in_sias_layout(tmp_path):
    _write_sia_app(tmp_path / "traces" / "toy", {"aws": (1.0, 4), "rtx": (2.0, 8)})
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"node_types": [{"name": "aws", "count": 1, "replicas_per_node": 4},
                                               {"name": "rtx", "count": 1, "replicas_per_node": 8}]}))
    cluster, profiles = cluster_and_profiles(str(spec), None, None, None, str(tmp_path))
    assert cluster.types == ("aws", "rtx") and cluster.total_cpus == 12
    assert tuple(profiles["toy"]) == ("aws", "rtx")
    assert profiles["toy"]["rtx"].step_sync((1,), 32)[0] < profiles["toy"]["aws"].step_sync((1,), 32)[0]
    jobs = [WorkloadJob(f"toy-{i}", "toy", i * 30.0, 1, 128) for i in range(2)]
    res = simulate(jobs, profiles, "sia", cluster=cluster, interval=60.0, max_rounds=500)
    assert res.completed == 2
    assert tuple(load_typed_profiles(tmp_path, types=("aws",))["toy"]) == ("aws",)


def test_cli_cluster_and_nodes_are_exclusive():
    with pytest.raises(InvalidProblem, match=r"give --cluster or --nodes/--cpus-per-node, not both"):
        cluster_and_profiles("sia-64", 4, None, None, None)
    with pytest.raises(InvalidProblem, match=r"--typed-profiles needs --cluster"):
        cluster_and_profiles(None, None, None, None, "x")


def test_cli_simulate_runs_a_typed_cluster_end_to_end(tmp_path, capsys):
    from pollux_opt.cli.main import main
    from pollux_opt.workloads import write_adaptdl_csv

    _write_sia_app(tmp_path / "traces" / "toy", {"aws": (1.0, 4), "rtx": (2.0, 8)})
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"node_types": [{"name": "aws", "count": 1, "replicas_per_node": 4},
                                               {"name": "rtx", "count": 1, "replicas_per_node": 8}]}))
    wl = tmp_path / "w.csv"
    write_adaptdl_csv([WorkloadJob(f"toy-{i}", "toy", i * 30.0, 1, 128) for i in range(2)], wl)
    assert main(["simulate", "--workload", str(wl), "--policy", "sia", "--cluster", str(spec),
                 "--typed-profiles", str(tmp_path), "--sia-calibration", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["simulation"]["cpus"] == 12 and summary["simulation"]["config"]["sia"]["enabled"] is True
    assert main(["simulate", "--workload", str(wl), "--cluster", "sia-64", "--nodes", "2",
                 "--out", str(tmp_path / "bad")]) == 2
    assert "give --cluster or --nodes/--cpus-per-node, not both" in capsys.readouterr().err


def test_cli_simulate_reads_only_the_applications_its_workload_runs(tmp_path, capsys):
    # an application measured on one of the cluster's types only (as one in Sia's
    # published traces): ignored while no job runs it, named once one does
    from pollux_opt.cli.main import main
    from pollux_opt.workloads import write_adaptdl_csv

    _write_sia_app(tmp_path / "traces" / "toy", {"aws": (1.0, 4), "rtx": (2.0, 8)})
    _write_sia_app(tmp_path / "traces" / "partial", {"aws": (1.0, 4)})
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"node_types": [{"name": "aws", "count": 1, "replicas_per_node": 4},
                                               {"name": "rtx", "count": 1, "replicas_per_node": 8}]}))
    _, profiles = cluster_and_profiles(str(spec), None, None, None, str(tmp_path), apps=["toy"])
    assert list(profiles) == ["toy"]
    wl = tmp_path / "w.csv"
    write_adaptdl_csv([WorkloadJob(f"toy-{i}", "toy", i * 30.0, 1, 128) for i in range(2)], wl)
    args = ["simulate", "--policy", "sia", "--cluster", str(spec), "--typed-profiles", str(tmp_path)]
    assert main([*args, "--workload", str(wl), "--out", str(tmp_path / "out")]) == 0
    write_adaptdl_csv([WorkloadJob("toy-0", "toy", 0.0, 1, 128), WorkloadJob("partial-1", "partial", 5.0, 1, 128)],
                      wl)
    assert main([*args, "--workload", str(wl), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "partial" in err and "placements-rtx.csv" in err
