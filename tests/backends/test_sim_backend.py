"""Simulator: profiles, workloads, backend, baselines, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pollux_opt import Cluster, InvalidProblem
from pollux_opt.agent.batch import split_batch
from pollux_opt.lifecycle import JobState
from pollux_opt.model import BatchLimits
from pollux_opt.scheduling.loop import Decision
from pollux_opt.backends.sim import (
    ParametricProfile,
    SimBackend,
    SimConfig,
    default_trace_dir,
    load_profiles,
    simulate,
)
from pollux_opt.scheduling.policies import TiresiasPolicy
from pollux_opt.workloads import WorkloadJob, philly_workload, read_adaptdl_csv, tuned_config, write_adaptdl_csv
from pollux_opt.workloads.adaptdl import pinned_config
from pollux_opt.scheduling.policies.packing import pack
from pollux_opt.scheduling.policies.views import replica_cap

TRACES = default_trace_dir()
needs_traces = pytest.mark.skipif(
    not (TRACES / "profiles").is_dir(), reason=f"AdaptDL traces not found at {TRACES}"
)

SYNTH = {"synth": ParametricProfile("synth", max_epochs=3, epoch_progress=200.0)}


def _jobs(n=4, spacing=30.0, replicas=2, batch=256):
    return [WorkloadJob(f"j{i}", "synth", i * spacing, replicas, batch) for i in range(n)]


def test_split_batch_fits_max_local():
    limits = BatchLimits(1, 4096, max_local_bsz=128)
    assert split_batch(1000, 3, limits) == (112, 2)  # 334 per replica in 3 micro-batches
    assert split_batch(64, 4, limits) == (16, 0)
    assert split_batch(64, 4, BatchLimits(1, 4096, min_local_bsz=32, max_local_bsz=128)) == (32, 0)


def test_parametric_profile_rejects_bad_fields_naming_them():
    with pytest.raises(InvalidProblem, match=r"gamma must be a finite number in \[1, 10\], got 0\.5"):
        ParametricProfile("x", gamma=0.5)
    with pytest.raises(InvalidProblem, match=r"max_epochs must be an integer >= 1, got 0"):
        ParametricProfile("x", max_epochs=0)
    with pytest.raises(InvalidProblem, match=r"beta_c must be a finite number >= 0, got True"):
        ParametricProfile("x", beta_c=True)


def test_unknown_application_named():
    with pytest.raises(InvalidProblem, match="no profile for application 'nope'"):
        SimBackend([WorkloadJob("a", "nope", 0.0, 1, 128)], SYNTH, Cluster.uniform(1, 4))


def test_views_hide_truth_until_measured():
    b = SimBackend(_jobs(1), SYNTH, Cluster.uniform(2, 4))
    (v,) = b.views()
    assert v.goodput_model is None and v.max_profiled_replicas == 0 and v.state is JobState.QUEUED
    assert v.max_replicas == 64 and replica_cap(v, b.cluster) == 1  # the policy's exploration cap
    b.apply(Decision({"j0": {"n0": 1}}, math.nan, 0.0, "test"))
    b.advance(60.0)
    (v,) = b.views()
    assert v.goodput_model is not None and v.max_profiled_replicas == 1 and v.max_replicas == 64
    assert replica_cap(v, b.cluster) == 2  # exploration cap: 2 x measured
    assert v.progress > 0 and v.attained_service == pytest.approx(60.0)


def test_restart_delay_costs_progress():
    def progress(delay):
        b = SimBackend(_jobs(1), SYNTH, Cluster.uniform(1, 4), config=SimConfig(restart_delay=delay))
        b.apply(Decision({"j0": {"n0": 1}}, math.nan, 0.0, "t"))
        b.advance(60.0)
        return b.views()[0].progress

    assert progress(0.0) == pytest.approx(2 * progress(30.0))


def test_interference_slows_shared_multi_node_jobs():
    jobs = [WorkloadJob("a", "synth", 0, 2, 256), WorkloadJob("b", "synth", 0, 2, 256)]
    dec = Decision({"a": {"n0": 1, "n1": 1}, "b": {"n0": 1, "n1": 1}}, math.nan, 0.0, "t")
    out = {}
    for x in (0.0, 0.5):
        b = SimBackend(jobs, SYNTH, Cluster.uniform(2, 4), config=SimConfig(restart_delay=0, interference=x))
        b.apply(dec)
        b.advance(10.0)
        out[x] = b.views()[0].progress
    assert out[0.5] == pytest.approx(0.5 * out[0.0])


def test_fixed_applications_run_their_pinned_configuration():
    """The paper's simulator pins NCF to its tuned configuration: one replica at
    the tuned batch (synth: 128), not the submitted 2 replicas at 256."""
    with pytest.raises(InvalidProblem, match="fixed_applications must be a tuple of application names, got 'ncf'"):
        SimConfig(fixed_applications="ncf")
    assert SimConfig().fixed_applications == ("ncf",)
    assert pinned_config(SYNTH["synth"]) == (1, 128)
    for fixed, want_batch, want_max in [(("synth",), 128, 1), ((), 256, 8)]:
        b = SimBackend(_jobs(1), SYNTH, Cluster.uniform(2, 4), config=SimConfig(fixed_applications=fixed),
                       fixed_batch=True)
        b.apply(Decision({"j0": {"n0": 2}}, math.nan, 0.0, "t"))
        b.advance(60.0)
        assert b._jobs["j0"].batch_size == want_batch
        b.apply(Decision({"j0": {"n0": 4}}, math.nan, 0.0, "t"))
        b.advance(60.0)
        (v,) = b.views()
        assert v.max_profiled_replicas == 4 and v.max_replicas == (1 if fixed else 64)
        assert (v.submitted_replicas, v.submitted_batch_size) == ((1, 128) if fixed else (2, 256))
        assert replica_cap(v, b.cluster) == want_max  # exploration cap 2 x 4 measured, unless pinned


@needs_traces
@pytest.mark.parametrize("policy", ["pollux", "tiresias", "optimus"])
def test_pinned_ncf_ignores_its_workload_row(policy):
    """NCF rows submitted at 1 replica, batch 256 run as Pollux's simulator runs
    NCF (one replica at batch 32768): the same JCTs as rows holding that."""
    profiles = load_profiles(TRACES, names=["ncf"])

    def jcts(ncf_batch):
        jobs = [WorkloadJob(f"ncf-{i}", "ncf", 60.0 * i, 1, ncf_batch) for i in range(3)]
        sim = simulate(jobs, profiles, policy, cluster=Cluster.uniform(1, 4), interval=60.0, max_rounds=200)
        assert sim.completed == 3
        return sim

    user, tuned = jcts(256), jcts(32768)
    assert user.avg_jct == tuned.avg_jct and user.makespan == tuned.makespan


def test_overload_rejected():
    b = SimBackend(_jobs(1), SYNTH, Cluster.uniform(1, 4))
    with pytest.raises(InvalidProblem, match="overloads node 'n0': 5 replicas > 4"):
        b.apply(Decision({"j0": {"n0": 5}}, math.nan, 0.0, "t"))


def test_pack_keeps_unchanged_placements():
    c = Cluster.uniform(2, 4)
    out = pack(c, {"a": 2, "b": 4}, {"a": {"n1": 2}}, ["a", "b"])
    assert out["a"] == {"n1": 2} and out["b"] == {"n0": 4}


@pytest.mark.parametrize("policy", ["tiresias", "optimus"])
def test_baselines_complete_synthetic_workload(tmp_path, policy):
    res = simulate(_jobs(6), SYNTH, policy, cluster=Cluster.uniform(2, 4), interval=30.0, out_dir=tmp_path)
    assert res.completed == 6 and res.avg_jct > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["simulation"]["completed"] == 6
    events = [json.loads(l) for l in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert sum(e["type"] == "complete" for e in events) == 6
    assert sum(e["type"] == "submit" for e in events) == 6


def test_tiresias_demotes_by_attained_service():
    from pollux_opt.scheduling.loop import JobView

    def view(jid, submit, attained):
        return JobView(jid, submit, JobState.QUEUED, {}, 0, 0.0, 0, 4, 4, 128, None, 30.0, 0.0, attained)

    d = TiresiasPolicy(thresholds=(100.0,)).decide(
        0.0, Cluster.uniform(1, 4), [view("old", 0.0, 500.0), view("new", 10.0, 0.0)]
    )
    assert sum(d.placement["new"].values()) == 4 and not d.placement["old"]


@needs_traces
def test_trace_profile_interpolates_between_measurements():
    cifar = load_profiles(names=["cifar10"])["cifar10"]
    lo, hi = cifar.step_sync((1,), 32), cifar.step_sync((1,), 45)
    mid = cifar.step_sync((1,), 38)
    assert min(lo[0], hi[0]) <= mid[0] <= max(lo[0], hi[0])
    # An unmeasured spread (6 nodes) interpolates over scalability.csv: finite, slower than 1 node.
    assert cifar.step_sync((4,) * 6, 32)[0] > lo[0]
    assert cifar.init_batch_size == 128 and cifar.max_batch_size == 4096 and cifar.max_epochs == 100


@pytest.mark.parametrize("profile", [pytest.param("cifar10", marks=needs_traces), "parametric"])
def test_gradient_statistics_of_many_batch_sizes_are_those_of_each(profile):
    p = SYNTH["synth"] if profile == "parametric" else load_profiles(names=[profile])[profile]
    batches = np.array([128.0, 300.0, 1000.0, 4096.0])
    for epoch in (0, 2):
        sqr, var = p.grad_stats(batches, epoch)
        assert sqr.shape == var.shape == batches.shape
        each = [p.grad_stats(float(b), epoch) for b in batches]
        assert sqr.tolist() == pytest.approx([s for s, _ in each])
        assert var.tolist() == pytest.approx([v for _, v in each])


@needs_traces
def test_tuned_configs_match_workload_csv():
    """The workload CSVs' fixed configurations are the tuned ones (artifact rule)."""
    profiles = load_profiles()
    jobs = read_adaptdl_csv(TRACES / "workloads" / "workload-6.csv")
    assert len(jobs) == 160
    for j in jobs[:40]:
        assert tuned_config(profiles[j.kind], j.replicas)[0] == j.batch_size


@needs_traces
def test_philly_generator_scales_with_load():
    profiles = load_profiles()
    a = philly_workload(TRACES / "philly.csv", profiles, load=0.5, num_jobs=40, seed=3)
    b = philly_workload(TRACES / "philly.csv", profiles, load=2.0, num_jobs=40, seed=3)
    assert len(a) == 20 and len(b) == 80
    assert all(0 <= j.arrival_s <= 8 * 3600 and j.kind in profiles for j in b)


def test_cli_simulate(tmp_path, monkeypatch):
    from pollux_opt.cli.main import main

    prof = tmp_path / "missing"
    wl = tmp_path / "w.csv"
    write_adaptdl_csv(_jobs(2), wl)
    assert main(["simulate", "--workload", str(wl), "--profiles", str(prof), "--policy", "tiresias",
                 "--out", str(tmp_path / "out")]) == 2


@pytest.mark.parametrize("changes, message", [
    ({"completion_delay": -1.0}, r"completion_delay must be a finite number >= 0, got -1.0"),
    ({"completion_delay": {"synth": float("nan")}},
     r"completion_delay\['synth'\] must be a finite number >= 0, got nan"),
    ({"wake_every": 0.0}, r"wake_every must be a finite number of seconds > 0 or None, got 0\.0"),
    ({"start_delay": "x"}, r"start_delay must be a finite number >= 0, got 'x'"),
    ({"start_delay": {"ncf": -2}}, r"start_delay\['ncf'\] must be a finite number >= 0, got -2"),
    ({"interference": 1.0}, r"interference must be a finite number in \[0, 1\), got 1\.0"),
    ({"split_single": 1}, r"split_single must be true or false, got 1"),
    ({"seed": -1}, r"seed must be an integer >= 0, got -1"),
])
def test_sim_config_rejects_bad_fidelity_settings(changes, message):
    with pytest.raises(InvalidProblem, match=message):
        SimConfig(**changes)


def _alone_jct(config: SimConfig) -> float:
    return simulate(_jobs(1), SYNTH, "tiresias", cluster=Cluster.uniform(1, 4), interval=60.0, config=config).avg_jct


def test_completion_delay_adds_to_jct_and_frees_cpus_meanwhile():
    base = _alone_jct(SimConfig(restart_delay=0.0))
    assert _alone_jct(SimConfig(restart_delay=0.0, completion_delay={"synth": 7.0})) == pytest.approx(base + 7.0)
    b = SimBackend(_jobs(1), SYNTH, Cluster.uniform(1, 4), config=SimConfig(restart_delay=0.0, completion_delay=1e6))
    b.apply(Decision({"j0": {"n0": 4}}, math.nan, 0.0, "t"))
    while not b.jcts():
        b.advance(60.0)
    assert b.views() == [] and b.jcts()["j0"] > 1e6  # verifying: no CPUs, not schedulable


def test_start_delay_replaces_the_restart_delay_for_the_first_start_only():
    base = _alone_jct(SimConfig(restart_delay=0.0))
    assert _alone_jct(SimConfig(restart_delay=30.0)) == pytest.approx(base + 30.0)  # the job never moves
    assert _alone_jct(SimConfig(restart_delay=30.0, start_delay={"synth": 4.0})) == pytest.approx(base + 4.0)


def test_a_co_adapting_job_starts_at_m0_and_grows_its_batch_as_its_model_improves():
    """The policy decides only the placement: the job picks its batch, at M0
    until measured, then the goodput-best on the same allocation, without a restart."""
    b = SimBackend(_jobs(1), SYNTH, Cluster.uniform(1, 4))
    batches = []
    for _ in range(3):
        b.apply(Decision({"j0": {"n0": 2}}, math.nan, 0.0, "t"))
        (v,) = b.views()
        batches.append(v.batch_size)
        b.advance(60.0)
    assert batches[0] == SYNTH["synth"].init_batch_size and batches[-1] > batches[0]
    assert v.restarts == 0


def test_split_single_runs_one_replica_as_two_micro_batches():
    for split, expected in ((False, (256, 0)), (True, (128, 1))):
        b = SimBackend(_jobs(1), SYNTH, Cluster.uniform(1, 4), config=SimConfig(split_single=split), fixed_batch=True)
        b.apply(Decision({"j0": {"n0": 1}}, math.nan, 0.0, "t"))
        job = b._jobs["j0"]
        assert (job.local_bsz, job.accum_steps) == expected


def test_wake_every_starts_a_round_when_a_job_finishes(tmp_path):
    """Two jobs that each want the whole node: the second starts at the poll
    after the first completes, not at the next 10-minute round."""
    jobs = [WorkloadJob("a", "synth", 0.0, 4, 256), WorkloadJob("b", "synth", 1.0, 4, 256)]
    runs = {}
    for name, wake in (("fixed", None), ("woken", 1.0)):
        simulate(jobs, SYNTH, "tiresias", cluster=Cluster.uniform(1, 4), interval=600.0,
                 config=SimConfig(restart_delay=0.0, wake_every=wake), out_dir=tmp_path / name)
        events = [json.loads(line) for line in (tmp_path / name / "events.jsonl").read_text().splitlines()]
        runs[name] = {(e["type"], e["job_id"]): e["t"] for e in events if e["type"] in ("start", "complete")}
    done_a = runs["woken"][("complete", "a")]
    assert runs["woken"][("start", "b")] == pytest.approx(math.ceil(done_a))
    assert runs["fixed"][("start", "b")] % 600.0 == pytest.approx(0.0)
    assert runs["fixed"][("start", "b")] > runs["woken"][("start", "b")]


def test_wake_every_starts_a_round_when_a_job_arrives(tmp_path):
    jobs = [WorkloadJob("a", "synth", 0.0, 2, 256), WorkloadJob("b", "synth", 7.0, 2, 256)]
    fixed = simulate(jobs, SYNTH, "tiresias", cluster=Cluster.uniform(1, 4), interval=60.0,
                     config=SimConfig(restart_delay=0.0), out_dir=tmp_path / "fixed")
    woken = simulate(jobs, SYNTH, "tiresias", cluster=Cluster.uniform(1, 4), interval=60.0,
                     config=SimConfig(restart_delay=0.0, wake_every=1.0), out_dir=tmp_path / "woken")

    def starts(run):
        events = [json.loads(line) for line in (tmp_path / run / "events.jsonl").read_text().splitlines()]
        return {e["job_id"]: e["t"] for e in events if e["type"] == "start"}

    assert starts("fixed")["b"] == pytest.approx(60.0)  # waited for the next round
    assert starts("woken")["b"] == pytest.approx(7.0)  # the poll after its arrival
    assert woken.avg_jct < fixed.avg_jct


def test_cli_completion_delay(tmp_path):
    from pollux_opt.cli.simulate import completion_delays

    assert completion_delays("2.5", None) == 2.5
    (tmp_path / "export.json").write_text(json.dumps({"a": {"verify_seconds": 3.0}, "b": {"verify_seconds": None}}))
    assert completion_delays("measured", str(tmp_path)) == {"a": 3.0, "b": 0.0}
    with pytest.raises(InvalidProblem, match="--completion-delay measured needs --profiles with an export.json"):
        completion_delays("measured", str(tmp_path / "nope"))
    with pytest.raises(InvalidProblem, match="--completion-delay must be a number of seconds or 'measured', got 'x'"):
        completion_delays("x", None)
    (tmp_path / "export.json").write_text(json.dumps({"a": {"start_seconds": 1.5}}))
    assert completion_delays("measured", str(tmp_path), option="--start-delay", field="start_seconds") == {"a": 1.5}
    with pytest.raises(InvalidProblem, match="--start-delay must be a number of seconds or 'measured', got 'y'"):
        completion_delays("y", None, option="--start-delay", field="start_seconds")


@pytest.mark.parametrize("flag, expected", [(None, ("ncf",)), ([], ()), (["bert", "ncf"], ("bert", "ncf"))])
def test_cli_fixed_apps_reaches_the_simulation(tmp_path, monkeypatch, flag, expected):
    from pollux_opt.backends.sim import profile_files as _files, run as _run
    from pollux_opt.cli.simulate import simulate_one

    wl = tmp_path / "w.csv"
    write_adaptdl_csv(_jobs(1), wl)
    seen = {}

    def fake_simulate(jobs, profiles, policy, *, config, **kwargs):
        seen["config"] = config
        return _run.SimResult(policy, 1, 1, 1.0, 1.0, 1.0, 1, 0.0, 0.0, None)

    monkeypatch.setattr(_files, "load_profiles", lambda root=None, names=None: SYNTH)
    monkeypatch.setattr(_run, "simulate", fake_simulate)
    simulate_one({"workload": str(wl), "profiles": None, "policy": "tiresias", "nodes": 1, "cpus_per_node": 4,
                  "interval": 60.0, "restart_delay": 30.0, "interference": 0.0, "report_noise": 0.0,
                  "completion_delay": 0.0, "wake_every": None, "start_delay": None, "split_single": False,
                  "fixed_apps": flag, "out_dir": None})
    assert seen["config"].fixed_applications == expected


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_tasks_keeps_task_order_and_reports_each_result(jobs):
    from pollux_opt.backends.sim import run_tasks

    seen = []
    out = run_tasks(math.sqrt, [16.0, 1.0, 9.0], jobs=jobs, on_result=lambda t, r: seen.append((t, r)))
    assert out == [4.0, 1.0, 3.0] and sorted(seen) == [(1.0, 1.0), (9.0, 3.0), (16.0, 4.0)]
    with pytest.raises(InvalidProblem, match="jobs must be an integer >= 1, got 0"):
        run_tasks(math.sqrt, [1.0], jobs=0)
