"""End to end on real CPU jobs: two tiny jobs under ``pollux``, and (slow)
a scheduler killed with SIGKILL and resumed from its run directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="real jobs need the CPU build of torch (pip install 'pollux-opt[jobs]')")
pytest.importorskip("sklearn", reason="the digits job needs scikit-learn (pip install 'pollux-opt[jobs]')")

from pollux_opt.records.events import read_events  # noqa: E402
from pollux_opt.backends.local import default_cluster, run_workload  # noqa: E402
from pollux_opt.workloads import Workload, WorkloadJob  # noqa: E402

#: Two tiny jobs: easy targets, so that each trains for a few seconds.
TINY = Workload("tiny", (
    WorkloadJob("digits", "digits-cnn", 0.0, 1, 32, spec={"target": 0.85, "eval_every": 10}),
    WorkloadJob("regress", "synth-regress", 2.0, 1, 32,
                spec={"target": 0.3, "eval_every": 20, "config": {"samples": 20_000, "width": 64}}),
))


def test_two_tiny_real_jobs_under_pollux(tmp_path):
    t0 = time.monotonic()
    summary = run_workload(tmp_path, TINY, "pollux", cluster=default_cluster(1, min(2, os.cpu_count() or 1)),
                       interval=5.0, progress=False, backend_kwargs={"report_every_s": 1.0})
    elapsed = time.monotonic() - t0
    jobs = {j["id"]: j for j in summary["jobs"]}
    assert set(jobs) == {"digits", "regress"}
    for j in jobs.values():
        assert j["completed"] and j["verified"] and not j["failed"]
        assert j["jct_s"] > 0 and j["cpu_seconds"] > 0
        assert j["rho"] is not None and j["rho"] > 0
    assert jobs["digits"]["final_metric"] >= 0.85 and jobs["regress"]["final_metric"] <= 0.3
    events = read_events(tmp_path / "events.jsonl")
    kinds = Counter(e["type"] for e in events)
    for kind in ("run_start", "submit", "start", "allocation", "checkpoint", "validation", "complete"):
        assert kinds[kind] >= 1, kind
    assert kinds["submit"] == kinds["complete"] == 2
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)
    allocs = [e for e in events if e["type"] == "allocation"]
    assert all(e["policy"] == "pollux" and e["status"] == "optimal" for e in allocs)
    assert json.loads((tmp_path / "summary.json").read_text())["avg_jct_s"] == summary["avg_jct_s"]
    assert summary["makespan_s"] <= elapsed
    for jid in jobs:
        assert (tmp_path / "jobs" / jid / "checkpoints").is_dir()


@pytest.mark.slow
def test_scheduler_killed_with_sigkill_resumes(tmp_path):
    """``pollux-opt run`` killed mid-run and started again on the same directory."""
    workload = {"name": "kill", "jobs": [
        {"id": "charlm", "kind": "stdlib-charlm", "arrival_s": 0, "replicas": 1, "batch_size": 64,
         "spec": {"target": 2.1}},
        {"id": "digits", "kind": "digits-cnn", "arrival_s": 1, "replicas": 1, "batch_size": 32,
         "spec": {"target": 0.9}},
    ]}
    wl_file = tmp_path / "wl.json"
    wl_file.write_text(json.dumps(workload))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "pollux_opt.cli.main", "run", "--out", str(out), "--quiet", "--interval", "5"]
    proc = subprocess.Popen(cmd + ["--workload", str(wl_file), "--policy", "pollux"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until a job has trained and checkpointed
            if (out / "events.jsonl").exists() and '"checkpoint"' in (out / "events.jsonl").read_text():
                break
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGKILL)  # the scheduler and its workers, no cleanup
    finally:
        proc.wait()
    before = read_events(out / "events.jsonl")
    assert not any(e["type"] == "complete" and e["job_id"] == "charlm" for e in before)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    events = read_events(out / "events.jsonl")
    assert events[: len(before)] == before
    per_job = Counter((e["job_id"], e["type"]) for e in events)
    for jid in ("charlm", "digits"):
        assert per_job[(jid, "submit")] == 1 and per_job[(jid, "complete")] == 1
    assert [e["resumed"] for e in events if e["type"] == "run_start"] == [False, True]
    summary = json.loads((out / "summary.json").read_text())
    assert all(j["completed"] and j["verified"] for j in summary["jobs"])
    # charlm resumed from a checkpoint: its first report after the restart is past zero progress
    restart_t = next(e["t"] for e in events if e["type"] == "run_start" and e["resumed"])
    ckpts = [e for e in events if e["type"] == "checkpoint" and e["job_id"] == "charlm" and e["t"] > restart_t]
    assert ckpts and ckpts[0]["step"] > 0
    assert Path(out / "config.json").exists()
