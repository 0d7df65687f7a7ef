"""``pollux-opt run --backend ray``: the flags that do not go together are refused
before anything runs (no Ray needed), and (slow) a scheduler on a Ray cluster
killed with SIGKILL resumes with one consistent event log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from pollux_opt.cli.main import main
from pollux_opt.records.events import read_events

RUN = ["run", "--workload", "mixed", "--quick", "--policy", "pollux"]


@pytest.mark.parametrize("flags, message", [
    (["--backend", "ray", "--nodes", "2"], "--nodes, --cpus, --gpus and --cluster do not apply with --backend ray"),
    (["--backend", "ray", "--cluster", "local-hetero"], "--nodes, --cpus, --gpus and --cluster do not apply with --backend ray"),
    (["--ray-address", "10.0.0.1:6379"], "--ray-address, --checkpoint-dir and --autoscale need --backend ray"),
    (["--checkpoint-dir", "/tmp/x"], "--ray-address, --checkpoint-dir and --autoscale need --backend ray"),
    (["--autoscale", "1:4"], "--ray-address, --checkpoint-dir and --autoscale need --backend ray"),
])
def test_flags_that_do_not_go_together_are_refused(flags, message, tmp_path, capsys):
    assert main([*RUN, "--out", str(tmp_path / "r"), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r" / "config.json").exists()


#: Seconds the killed scheduler may take to complete its first job, and the resumed run may take.
FIRST_COMPLETE_TIMEOUT_S, RESUME_TIMEOUT_S = 300.0, 900.0


def _completed_any(events_path) -> bool:
    """Whether the live log at ``events_path`` has a ``complete`` event yet (a torn last line is skipped)."""
    if not events_path.exists():
        return False
    for line in events_path.read_text().splitlines():
        try:
            if json.loads(line).get("type") == "complete":
                return True
        except json.JSONDecodeError:
            continue
    return False


@pytest.mark.slow
def test_a_scheduler_on_ray_killed_with_sigkill_resumes_with_one_consistent_log(two_nodes, tmp_path):
    cluster, _ = two_nodes
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "pollux_opt", *RUN, "--backend", "ray", "--ray-address", cluster.address,
           "--out", str(out), "--quiet", "--interval", "5"]
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Killed once one job has completed and the others still run (the workload's
    # last job arrives after its first completes), whatever the machine's speed.
    deadline = time.monotonic() + FIRST_COMPLETE_TIMEOUT_S
    while time.monotonic() < deadline and first.poll() is None and not _completed_any(out / "events.jsonl"):
        time.sleep(0.2)
    assert first.poll() is None, "the run ended before the kill"
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = read_events(out / "events.jsonl")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RESUME_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    log = read_events(out / "events.jsonl")
    assert [e["resumed"] for e in log if e["type"] == "run_start"] == [False, True]
    assert log[: len(before)] == before  # the killed run's history, kept as it was
    completes = [e["job_id"] for e in log if e["type"] == "complete"]
    assert sorted(completes) == sorted({e["job_id"] for e in log if e["type"] == "submit"})
    assert all(e["verified"] for e in log if e["type"] == "complete")
