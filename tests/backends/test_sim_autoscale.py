"""The simulator's autoscaled nodes: start-up, draining, billing, and whole runs."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from pollux_opt import Cluster, InvalidProblem
from pollux_opt.backends.sim import (
    ParametricProfile, SimBackend, SimConfig, default_trace_dir, load_profiles, simulate,
)
from pollux_opt.backends.sim.provision import NodeState, SimNodes
from pollux_opt.model import Node
from pollux_opt.records.events import read_events
from pollux_opt.records.metrics import node_usage
from pollux_opt.records.timelines import node_timeline
from pollux_opt.scheduling.autoscale import ScaleOptions
from pollux_opt.scheduling.loop import Decision, DecisionStatus
from pollux_opt.workloads import WorkloadJob, write_adaptdl_csv

SYNTH = {"synth": ParametricProfile("synth", max_epochs=3, epoch_progress=200.0)}


def _jobs(n=8, spacing=30.0):
    return [WorkloadJob(f"j{i}", "synth", i * spacing, 2, 256) for i in range(n)]


class _Log:
    def __init__(self):
        self.events = []

    def emit(self, kind, t, job_id, **fields):
        event = {"type": kind, "t": t, "job_id": job_id, **fields}
        self.events.append(event)
        return event


def test_requested_nodes_come_up_after_the_startup_delay():
    nodes = SimNodes(Cluster.uniform(4, 2), {"default": 1}, startup_s=100.0)
    assert nodes.current_cluster().node_ids == ("n0",)
    nodes.provision(10.0, {"default": 3})
    assert nodes.provisioned() == {"default": 3}
    assert nodes.current_cluster().node_ids == ("n0",)  # still starting
    nodes.tick(109.0, {})
    assert nodes.current_cluster().node_ids == ("n0",)
    nodes.tick(110.0, {})
    assert nodes.current_cluster().node_ids == ("n0", "n1", "n2")


def test_shrinking_cancels_starting_nodes_then_drains_the_emptiest():
    nodes = SimNodes(Cluster.uniform(4, 2), {"default": 3}, startup_s=100.0)
    nodes.provision(0.0, {"default": 4})  # n3 starting
    nodes.provision(10.0, {"default": 2}, {"n0": 2, "n1": 1, "n2": 2})
    assert nodes.state["n3"] is NodeState.DOWN  # cancelled first
    assert nodes.state["n1"] is NodeState.DRAINING  # then the up node with the fewest replicas
    assert nodes.current_cluster().node_ids == ("n0", "n2")
    nodes.tick(20.0, {"n0": 2, "n1": 1, "n2": 2})
    assert nodes.state["n1"] is NodeState.DRAINING  # its job has not moved yet
    nodes.provision(30.0, {"default": 3}, {"n0": 2, "n1": 1, "n2": 2})
    assert nodes.state["n1"] is NodeState.UP  # wanted again: taken back, no start-up
    nodes.provision(40.0, {"default": 2}, {"n0": 2, "n2": 2})
    assert nodes.state["n1"] is NodeState.DOWN  # empty: released at once


def test_billing_runs_from_request_to_release_within_the_run():
    log = _Log()
    nodes = SimNodes(Cluster.uniform(3, 2), {"default": 1}, startup_s=60.0, events=log)
    nodes.announce(0.0)
    nodes.provision(3600.0, {"default": 2})  # n1 billed from 1 h
    nodes.provision(7200.0, {"default": 1}, {"n0": 1})  # n1 empty: released at 2 h
    start = {"type": "run_start", "t": 0.0, "node_prices": {"default": 2.0}}
    usage = node_usage([start, *log.events], 1800.0, 9000.0)
    # n0 from 0.5 h (first submission) to 2.5 h, n1 from 1 h to 2 h
    assert usage["node_hours"] == pytest.approx(2.0 + 1.0)
    assert usage["cost"] == pytest.approx(6.0)
    assert nodes.history == [e for e in log.events if e["type"] == "scale"]


def test_a_fixed_cluster_bills_every_node_throughout():
    start = {"type": "run_start", "t": 0.0, "nodes": {"a": 2, "b": 1}, "node_prices": {"a": 1.0, "b": 3.0}}
    usage = node_usage([start], 0.0, 7200.0)
    assert usage == {"node_hours": pytest.approx(6.0), "cost": pytest.approx(2 * 2 + 2 * 3.0)}
    assert math.isnan(node_usage([{"type": "run_start", "t": 0.0}], 0.0, 10.0)["node_hours"])  # the log does not say


def test_the_policy_sees_no_draining_node_and_cannot_place_on_one():
    cluster = Cluster.uniform(2, 4)
    nodes = SimNodes(cluster, {"default": 2}, startup_s=0.0)
    backend = SimBackend(_jobs(1, 0.0), SYNTH, cluster, nodes=nodes)
    backend.apply(Decision({"j0": {"n0": 2, "n1": 2}}, 0.0, 0.0, DecisionStatus.FIFO))
    backend.provision(0.0, {"default": 1})
    assert backend.current_cluster().node_ids == ("n0",)
    assert backend.views()[0].placement == {"n0": 2}  # the part on the draining node is not offered
    with pytest.raises(InvalidProblem, match="decision places job 'j0' on a down node 'n1'"):
        backend.apply(Decision({"j0": {"n1": 2}}, 0.0, 0.0, DecisionStatus.FIFO))
    backend.apply(Decision({"j0": {"n0": 2}}, 0.0, 0.0, DecisionStatus.FIFO))
    assert nodes.state["n1"] is NodeState.DOWN  # its job moved off: released


def test_a_fixed_backend_refuses_to_provision():
    backend = SimBackend(_jobs(1), SYNTH, Cluster.uniform(1, 4))
    with pytest.raises(InvalidProblem, match="this simulation's cluster is fixed"):
        backend.provision(0.0, {"default": 1})


@pytest.mark.parametrize("policy", ["pollux", "fixed"])
def test_an_autoscaled_run_completes_every_job_on_fewer_node_hours(tmp_path, policy):
    jobs, cluster = _jobs(), Cluster.uniform(6, 4)
    fixed = simulate(jobs, SYNTH, policy, cluster=cluster, out_dir=tmp_path / "fixed")
    auto = simulate(jobs, SYNTH, policy, cluster=cluster, out_dir=tmp_path / "auto",
                    autoscale=ScaleOptions(min_nodes=1, startup_s=60.0), prices={"default": 0.5})
    assert auto.completed == fixed.completed == len(jobs)
    assert 0 < auto.node_hours < fixed.node_hours
    assert fixed.node_hours == pytest.approx(6 * fixed.makespan / 3600)
    assert auto.cost == pytest.approx(0.5 * auto.node_hours) and fixed.cost is None
    summary = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert summary["node_hours"] == pytest.approx(auto.node_hours)
    sizes = node_timeline(read_events(tmp_path / "auto" / "events.jsonl"))
    assert sizes.provisioned.max() > 1 and sizes.provisioned.iloc[-1] >= 1
    assert (sizes.up <= sizes.provisioned.cummax()).all()


def test_weak_scaling_jobs_grow_their_batch_with_their_replicas():
    cluster = Cluster.uniform(2, 4)
    backend = SimBackend(_jobs(1, 0.0), SYNTH, cluster, config=SimConfig(weak_scaling=True))
    backend.apply(Decision({"j0": {"n0": 4}}, 0.0, 0.0, DecisionStatus.FIFO))
    job = backend._jobs["j0"]
    assert job.batch_size == 4 * (256 // 2)
    backend.apply(Decision({"j0": {"n0": 4, "n1": 4}}, 0.0, 0.0, DecisionStatus.FIFO))
    assert job.batch_size == 8 * (256 // 2)


def test_typed_autoscaling_bills_each_type_at_its_price(tmp_path):
    nodes = tuple(Node(f"a-{i}", 4, "a") for i in range(3)) + tuple(Node(f"b-{i}", 4, "b") for i in range(3))
    profiles = {"synth": {"a": SYNTH["synth"], "b": ParametricProfile("synth", max_epochs=3, epoch_progress=200.0,
                                                                      alpha_c=0.025, beta_c=0.001)}}
    res = simulate(_jobs(), profiles, "pollux", cluster=Cluster(nodes), out_dir=tmp_path,
                   autoscale=ScaleOptions(min_nodes=1, startup_s=60.0), prices={"a": 1.0, "b": 3.0})
    assert res.completed == 8
    scales = [e for e in read_events(tmp_path / "events.jsonl") if e["type"] == "scale"]
    assert scales[0]["requested"] == {"a-0": "a"}  # min_nodes on the cheapest type per slot
    bought = {kind for e in scales for kind in e["requested"].values()}
    assert (res.cost > res.node_hours) == ("b" in bought)


TRACES = default_trace_dir()


@pytest.mark.skipif(not (TRACES / "profiles").is_dir(), reason=f"AdaptDL traces not found at {TRACES}")
def test_cli_simulate_autoscales_and_prices_the_run(tmp_path, capsys):
    from pollux_opt.cli.main import main

    wl = tmp_path / "w.csv"
    write_adaptdl_csv([WorkloadJob(f"c{i}", "cifar10", 60.0 * i, 1, 128) for i in range(3)], wl)
    assert main(["simulate", "--workload", str(wl), "--profiles", str(TRACES), "--nodes", "4",
                 "--autoscale", "1:3", "--node-startup", "60", "--node-cost", "default=1.5",
                 "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{"):])[str(wl)]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert result["completed"] == summary["num_completed"] == 3
    assert result["node_hours"] == pytest.approx(summary["node_hours"])
    assert summary["cost"] == pytest.approx(1.5 * summary["node_hours"])
    assert summary["node_hours"] <= 3 * summary["makespan_s"] / 3600 + 1e-9
    start = next(e for e in read_events(tmp_path / "out" / "events.jsonl") if e["type"] == "run_start")
    assert start["autoscale"]["max_nodes"] == 3 and start["node_prices"] == {"default": 1.5}


@pytest.mark.skipif(not (TRACES / "profiles").is_dir(), reason=f"AdaptDL traces not found at {TRACES}")
@pytest.mark.parametrize("nodes, slots", [(1, 1), (2, 4), (16, 4)])
def test_the_node_hours_bound_lies_below_a_simulated_job_alone(tmp_path, experiment, nodes, slots):
    """autoscale_bound's relaxation: a job alone uses at least the slot-seconds of its cheapest way
    (time value 0) and takes at least the time of its fastest (a huge time value); on one slot the
    cheapest way is the simulator's own run, nearly."""
    bound = experiment("autoscale_bound")
    profiles = load_profiles(TRACES, ["bert"])
    bert = profiles["bert"]
    rate = bound.best_goodput(bert)
    start = SimConfig().restart_delay
    cheapest, slow = bound.relaxation(bert, rate, 0.0, start)
    dear, fastest = bound.relaxation(bert, rate, 1e9, start)
    assert cheapest < dear and fastest < slow
    res = simulate([WorkloadJob("b", "bert", 0.0, 1, bert.init_batch_size)], profiles, "pollux",
                   cluster=Cluster.uniform(nodes, slots), out_dir=tmp_path)
    assert res.completed == 1
    job = pd.read_csv(tmp_path / "jobs.csv").iloc[0]
    assert job.attained_service >= cheapest and job.jct >= fastest
    if nodes * slots == 1:
        assert job.attained_service <= 1.1 * cheapest
