"""Metrics from the event log alone, on a hand-written log with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pollux_opt import InvalidProblem
from pollux_opt.records.events import goodput_model_to_json
from pollux_opt.model import BatchLimits, GoodputModel, GradientStats, ThroughputParams
from pollux_opt.records.metrics import compare_table, isolated_rate, jain_index, summarize
from pollux_opt.records.timelines import allocation_timeline, goodput_timeline

# Perfect-scaling model: no sync time, t_c(m) = 0.1 + 0.0125 m seconds, M0 = 32 and
# no gradient noise, so at the fixed batch B = 32 the efficiency is 1 and the
# progress rate is 1 / t_c(32 / K) iterations per second: 2 on one CPU, 1/0.3 on two.
MODEL = GoodputModel(
    ThroughputParams(alpha_c=0.1, beta_c=0.0125, alpha_n=0.0, beta_n=0.0, alpha_r=0.0, beta_r=0.0, gamma=1.0),
    GradientStats(grad_sqr=1.0, grad_var=0.0, init_batch_size=32),
    BatchLimits(init_batch_size=32, max_batch_size=512),
)
RATE_1, RATE_2 = 2.0, 1 / 0.3


def _log():
    """Two jobs on two CPUs: a (t 0..32) and b (t 10..50)."""
    model = goodput_model_to_json(MODEL)
    return [
        {"t": 0.0, "job_id": None, "type": "run_start", "policy": "pollux", "cluster_cpus": 2},
        {"t": 0.0, "job_id": "a", "type": "submit", "submitted_replicas": 1, "submitted_batch_size": 32},
        {"t": 0.0, "job_id": "a", "type": "start", "placement": {"n0": 2}},
        {"t": 0.0, "job_id": None, "type": "allocation", "placement": {"a": {"n0": 2}}, "objective": 2.0,
         "solver_s": 0.02, "overhead_s": 0.05, "interval_s": 10.0},
        {"t": 10.0, "job_id": "b", "type": "submit", "submitted_replicas": 1, "submitted_batch_size": 32},
        {"t": 10.0, "job_id": None, "type": "allocation", "placement": {"a": {"n0": 1}, "b": {"n0": 1}},
         "objective": 1.0, "solver_s": 0.04, "overhead_s": 0.1, "poll_s": 0.05, "interval_s": 10.0},
        {"t": 10.0, "job_id": "a", "type": "rescale_begin", "old_placement": {"n0": 2}, "placement": {"n0": 1}},
        {"t": 10.0, "job_id": "b", "type": "start", "placement": {"n0": 1}},
        {"t": 12.0, "job_id": "a", "type": "rescale_end", "placement": {"n0": 1}, "duration_s": 2.0},
        {"t": 20.0, "job_id": "a", "type": "report", "throughput": 64.0, "goodput": 100.0, "goodput_base": 50.0,
         "progress": 20.0, "replicas": 1},
        {"t": 20.0, "job_id": "b", "type": "report", "throughput": 30.0, "goodput": 30.0, "goodput_base": 30.0,
         "progress": 5.0, "replicas": 1},
        {"t": 25.0, "job_id": "a", "type": "checkpoint", "step": 40},
        {"t": 30.0, "job_id": "a", "type": "validation", "value": 0.97, "progress": 40.0, "target_reached": True},
        {"t": 32.0, "job_id": "a", "type": "complete", "verified": True, "value": 0.97, "progress": 40.0,
         "model": model, "startup_s": 0.0, "verify_s": 2.0},
        {"t": 50.0, "job_id": "b", "type": "complete", "verified": True, "value": 0.5, "progress": 60.0,
         "model": model, "startup_s": 1.0, "verify_s": 0.0},
    ]


def test_summary_on_a_hand_written_log():
    s = summarize(_log())
    assert s["policy"] == "pollux"
    a, b = s["jobs"]
    assert (a["id"], b["id"]) == ("a", "b")
    assert a["jct_s"] == 32.0 and b["jct_s"] == 40.0
    assert a["completed"] and b["completed"] and a["final_metric"] == 0.97
    assert a["restarts"] == 1 and b["restarts"] == 0
    # a: 2 CPUs for 10 s, then 1 CPU until its target at 30 s; b: 1 CPU for 40 s.
    assert a["cpu_seconds"] == pytest.approx(40.0) and b["cpu_seconds"] == pytest.approx(40.0)
    assert s["avg_jct_s"] == 36.0 and s["p50_jct_s"] == 36.0
    assert s["p99_jct_s"] == pytest.approx(32.0 + 0.99 * 8.0)
    assert s["makespan_s"] == 50.0
    assert s["utilization"] == pytest.approx(80.0 / (2 * 50.0))
    # goodput in single-CPU equivalents = progress rate / RATE_1 between progress samples:
    # a: 20 in [0, 20), 20 in [20, 30); b: 5 in [10, 20), 55 in [20, 50).
    ga = [20 / 20 / RATE_1, 20 / 10 / RATE_1]
    gb = [5 / 10 / RATE_1, 55 / 30 / RATE_1]
    integral = ga[0] * 20 + ga[1] * 10 + gb[0] * 10 + gb[1] * 30
    assert s["avg_goodput"] == pytest.approx(integral / 50.0)
    # isolated JCTs: a was active with 1 job for 10 s and 2 for 22 s -> N = 54/32;
    # b with 2 for 22 s and 1 for 18 s -> N = 62/40.  Share = 2 / N CPUs, rate interpolated.
    n_a, n_b = 54 / 32, 62 / 40
    assert a["avg_active_jobs"] == pytest.approx(n_a) and b["avg_active_jobs"] == pytest.approx(n_b)
    iso_a = 40.0 / (RATE_1 + (2 / n_a - 1) * (RATE_2 - RATE_1)) + 2.0
    iso_b = 1.0 + 60.0 / (RATE_1 + (2 / n_b - 1) * (RATE_2 - RATE_1))
    assert a["jct_isolated_s"] == pytest.approx(iso_a)
    assert b["jct_isolated_s"] == pytest.approx(iso_b)
    rho = np.array([32.0 / iso_a, 40.0 / iso_b])
    assert a["rho"] == pytest.approx(rho[0]) and b["rho"] == pytest.approx(rho[1])
    assert s["worst_rho"] == pytest.approx(rho.max())
    assert s["frac_rho_gt_1"] == pytest.approx(np.mean(rho > 1))
    x = 1 / rho
    assert s["jain_index"] == pytest.approx(x.sum() ** 2 / (2 * (x**2).sum()))
    assert s["rounds"] == 2
    assert s["mean_overhead_s"] == pytest.approx(0.1)
    assert s["overhead_pct_of_interval"] == pytest.approx(1.0)
    assert s["max_overhead_pct_of_interval"] == pytest.approx(1.5)
    assert s["overhead_pct_of_wall"] == pytest.approx(100 * 0.2 / 50)
    assert s["cluster_cpus"] == 2 and s["num_completed"] == 2 and s["num_failed"] == 0


def test_event_order_in_the_file_does_not_matter():
    events = _log()
    shuffled = [events[i] for i in np.random.default_rng(5).permutation(len(events))]
    assert shuffled != events
    assert summarize(shuffled) == summarize(events)


def test_failed_and_unfinished_jobs():
    events = _log()[:3] + [
        {"t": 5.0, "job_id": "a", "type": "failed", "reason": "boom"},
        {"t": 6.0, "job_id": "c", "type": "submit", "submitted_replicas": 2, "submitted_batch_size": 8},
        {"t": 6.0, "job_id": "c", "type": "start", "placement": {"n0": 2}},
        {"t": 9.0, "job_id": "c", "type": "restart_after_fault", "placement": {"n0": 2}, "reason": "worker_lost"},
    ]
    s = summarize(events)
    a, c = s["jobs"]
    assert a["failed"] and not a["completed"] and a["jct_s"] is None and a["rho"] is None
    assert not c["completed"] and c["restarts"] == 1
    assert c["cpu_seconds"] == pytest.approx(2 * 3.0)  # held until the end of the log (t = 9)
    assert s["avg_jct_s"] is None and s["worst_rho"] is None and s["num_failed"] == 1


def test_cluster_cpus_is_needed():
    events = [e for e in _log() if e["type"] != "run_start"]
    with pytest.raises(InvalidProblem, match=r"cluster_cpus must be given"):
        summarize(events)
    with pytest.raises(InvalidProblem, match=r"cluster_cpus must be an integer >= 1, got 0"):
        summarize(events, 0)
    assert summarize(events, 2)["policy"] is None


def test_isolated_rate_interpolates_and_time_slices():
    model = goodput_model_to_json(MODEL)
    assert isolated_rate(model, 1.0, 32, None) == pytest.approx(RATE_1)
    assert isolated_rate(model, 2.0, 32, None) == pytest.approx(RATE_2)
    assert isolated_rate(model, 1.5, 32, None) == pytest.approx((RATE_1 + RATE_2) / 2)
    assert isolated_rate(model, 0.25, 32, None) == pytest.approx(RATE_1 / 4)
    assert isolated_rate(model, 2.0, 32, 1) == pytest.approx(RATE_1)  # capped by max_replicas


def test_timelines():
    gp = goodput_timeline(_log())
    assert list(gp["t"]) == [0.0, 10.0, 20.0, 30.0, 50.0]
    assert list(gp["goodput"]) == pytest.approx([0.5, 0.75, 1.0 + 55 / 60, 55 / 60, 0.0])
    alloc = allocation_timeline(_log())
    a = alloc[alloc["job_id"] == "a"]
    assert list(zip(a["t"], a["cpus"])) == [(0.0, 0), (0.0, 2), (10.0, 1), (12.0, 1), (30.0, 0), (32.0, 0)]


def test_goodput_ignores_work_lost_to_a_restart_and_jobs_without_a_model():
    model = goodput_model_to_json(MODEL)
    events = [
        {"t": 0.0, "job_id": "a", "type": "start", "placement": {"n0": 1}},
        {"t": 10.0, "job_id": "a", "type": "report", "progress": 20.0, "goodput": 1, "throughput": 1, "replicas": 1},
        {"t": 12.0, "job_id": "a", "type": "restart_after_fault", "placement": {"n0": 1}},
        {"t": 14.0, "job_id": "a", "type": "checkpoint", "step": 1, "progress": 15.0},  # resumed from 15
        {"t": 20.0, "job_id": "a", "type": "complete", "verified": True, "progress": 27.0, "model": model},
        {"t": 0.0, "job_id": "b", "type": "start", "placement": {"n0": 1}},
        {"t": 10.0, "job_id": "b", "type": "report", "progress": 50.0, "goodput": 1, "throughput": 1, "replicas": 1},
    ]
    gp = goodput_timeline(events)
    # a: 20 in 10 s, none lost-and-redone counted (15 -> 20 is redone work), then 20 -> 27 in 6 s
    assert list(gp["t"]) == [0.0, 10.0, 14.0, 20.0]
    assert list(gp["goodput"]) == pytest.approx([1.0, 0.0, 7 / 6 / RATE_1, 0.0])


def test_jain_index_and_compare_table():
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)
    assert math.isnan(jain_index([]))
    table = compare_table({"x": summarize(_log())})
    assert table.loc["x", "avg JCT (s)"] == 36.0
