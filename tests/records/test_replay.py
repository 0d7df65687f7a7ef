"""The one replay of the event log, on a hand-written log with known answers."""

from __future__ import annotations

import math

from pollux_opt.records.replay import JobTrack, clean_placement, replay

LOG = [
    {"t": 0.0, "job_id": None, "type": "run_start", "policy": "fixed", "cluster_cpus": 4},
    {"t": 0.0, "job_id": "a", "type": "submit", "submitted_replicas": 2, "submitted_batch_size": 64,
     "max_replicas": 4},
    {"t": 1.0, "job_id": "a", "type": "start", "placement": {"n0": 2}, "cpus": [0, 1]},
    {"t": 5.0, "job_id": "a", "type": "checkpoint", "step": 10, "progress": 10.0},
    {"t": 6.0, "job_id": "a", "type": "rescale_begin", "placement": {"n0": 1, "n1": 0}},
    {"t": 7.0, "job_id": "a", "type": "rescale_end", "placement": {"n0": 1}, "duration_s": 1.0,
     "src_time": 1_000_007.0},
    {"t": 8.0, "job_id": "b", "type": "submit", "submitted_replicas": 1, "submitted_batch_size": 32},
    {"t": 9.0, "job_id": "a", "type": "validation", "value": 0.5},
    {"t": 10.0, "job_id": "a", "type": "validation", "value": 0.9, "target_reached": True},
    {"t": 12.0, "job_id": "a", "type": "complete", "verified": True, "value": 0.91, "progress": 30.0,
     "startup_s": 1.0},
    {"t": 13.0, "job_id": "b", "type": "start", "placement": {"n0": 1}},
    {"t": 14.0, "job_id": "b", "type": "restart_after_fault", "placement": {"n0": 1}, "reason": "worker_lost"},
    {"t": 15.0, "job_id": "b", "type": "rescale_begin", "placement": {}},
    {"t": 16.0, "job_id": "b", "type": "failed", "reason": "boom"},
]


def test_replay_builds_one_track_per_job():
    tracks = replay(LOG)
    assert set(tracks) == {"a", "b"}
    a, b = tracks["a"], tracks["b"]
    assert (a.submit, a.end, a.completed, a.failed, a.verified) == (0.0, 12.0, True, False, True)
    assert (a.submitted_replicas, a.submitted_batch_size, a.max_replicas) == (2, 64, 4)
    assert (a.final_metric, a.progress, a.startup_s, a.verify_s) == (0.91, 30.0, 1.0, 0.0)
    assert a.restarts == 1 and a.started and a.placement == {} and a.held == 0
    assert a.cpu_seconds == 2 * 5.0 + 1 * 4.0  # two CPUs from 1 to 6 s, one from 6 to 10 s (target reached)
    assert a.replicas == [(0.0, 0), (1.0, 2), (6.0, 1), (7.0, 1), (10.0, 0), (12.0, 0)]
    assert (a.target_t, a.last_metric, a.last_ckpt_step, a.src_time) == (10.0, 0.9, 10, 1_000_007.0)
    assert b.failed and not b.completed and b.finished and b.end == 16.0
    assert b.restarts == 1  # the fault recovery; the stop (to {}) is not a restart
    assert b.cpu_seconds == 2.0 and math.isnan(b.progress)


def test_replay_into_given_tracks_reads_only_their_jobs():
    mine = {"b": JobTrack(id="b")}
    out = replay(LOG, mine)
    assert out is mine and set(out) == {"b"} and out["b"].failed


def test_hold_accounts_cpu_seconds_and_cleans_placements():
    job = JobTrack(id="x")
    job.submit_at(2.0)
    job.hold(3.0, {"n0": 2, "n1": 0})
    job.account(5.0)
    assert (job.cpu_seconds, job.held_since, job.placement) == (4.0, 5.0, {"n0": 2})
    job.hold(6.0, None)
    assert job.cpu_seconds == 6.0 and job.held == 0
    assert clean_placement({1: 2.0, "n2": 0}) == {"1": 2}
