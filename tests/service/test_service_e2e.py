"""``pollux-opt serve`` as a user runs it: a real server in a subprocess on a
free port, real CPU jobs submitted over HTTP, watched, re-weighted, cancelled,
and the server killed with SIGKILL and restarted on the same state."""

from __future__ import annotations

import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service needs its extra (pip install 'pollux-opt[service]')")
pytest.importorskip("torch", reason="real jobs need the CPU build of torch (pip install 'pollux-opt[jobs]')")
pytest.importorskip("sklearn", reason="the digits job needs scikit-learn (pip install 'pollux-opt[jobs]')")
httpx = pytest.importorskip("httpx")

from pollux_opt.lifecycle import JobState  # noqa: E402
from pollux_opt.records.events import read_events  # noqa: E402
from pollux_opt.records.replay import replay  # noqa: E402
from pollux_opt.service.db import DB_FILE, Store  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc")

#: A job that reaches its target in seconds of training (as the tiny end-to-end run's).
QUICK = {"kind": "synth-regress", "replicas": 1, "batch_size": 32,
         "spec": {"target": 0.3, "eval_every": 20, "config": {"samples": 20_000, "width": 64}}}
#: A job that would train for many minutes: one to cancel.
LONG = {"kind": "digits-cnn", "replicas": 1, "batch_size": 32, "spec": {"target": 0.999, "eval_every": 50}}
#: Seconds a job may take to start.
START_LIMIT_S = 60.0


def _index_agrees_with_log(state: Path) -> None:
    """Every job's state in the database is the one its events in the log give."""
    tracks = replay(read_events(state / "events.jsonl"))
    store = Store(state / DB_FILE)
    try:
        for job in store.jobs():
            expected = tracks[job["id"]].state.value if job["id"] in tracks else JobState.QUEUED.value
            assert job["state"] == expected, (job["id"], job["state"], expected)
    finally:
        store.close()


def test_a_job_submitted_watched_reweighted_and_cancelled_over_http(tmp_path, serve_process):
    server = serve_process(tmp_path / "state").start()
    try:
        t0 = time.monotonic()
        quick = server.submit(QUICK)
        running = server.wait_state(quick, {"running", "rescaling", "succeeded"}, START_LIMIT_S)
        first_replica_s = time.monotonic() - t0
        long = server.submit(LONG)
        server.wait_state(long, {"running"})
        assert httpx.patch(f"{server.url}/api/v1/jobs/{long}", json={"weight": 2.5}, timeout=10).status_code == 200
        done = server.wait_state(quick, {"succeeded", "failed"})
        assert done["state"] == "succeeded" and done["verified"], done
        logs = httpx.get(f"{server.url}/api/v1/jobs/{quick}/logs", params={"rank": 0}, timeout=10)
        assert logs.status_code == 200 and logs.text.strip(), "rank 0's log is readable after the job ended"
        assert httpx.post(f"{server.url}/api/v1/jobs/{quick}/cancel", timeout=10).status_code == 409
        assert httpx.post(f"{server.url}/api/v1/jobs/{long}/cancel", timeout=10).status_code == 202
        cancelled = server.wait_state(long, {"cancelled", "failed", "succeeded"}, 120.0)
        assert cancelled["state"] == "cancelled" and cancelled["weight"] == 2.5
        moves = [(m["old"], m["new"]) for m in cancelled["transitions"]]
        assert moves[0] == (None, "queued") and moves[-1][1] == "cancelled"
        cluster = httpx.get(f"{server.url}/api/v1/cluster", timeout=10).json()
        assert cluster["last_round"] is not None and not cluster["holders"]
        assert running["state"] in ("running", "rescaling", "succeeded") and first_replica_s < START_LIMIT_S
        held = server.submit(LONG)
        server.wait_state(held, {"running"})
    finally:
        status = server.kill(signal.SIGTERM)  # checkpoints and stops the job holding CPUs
    assert status == 128 + signal.SIGTERM, server.log()
    assert "Traceback" not in server.log()
    _index_agrees_with_log(tmp_path / "state")
    store = Store(tmp_path / "state" / DB_FILE)
    assert store.job(held)["state"] == "queued"  # stopped with a checkpoint: it resumes with the next server
    store.close()
    events = read_events(tmp_path / "state" / "events.jsonl")
    assert Counter(e["type"] for e in events if e["job_id"] == long)["cancelled"] == 1


@pytest.mark.slow
def test_sigkills_of_the_server_lose_no_acknowledged_job_and_run_none_twice(tmp_path, serve_process):
    """SIGKILL the server at random moments, while jobs train and while
    submissions are in flight; each restart on the same state resumes: every
    job whose submission was answered finishes verified, once."""
    rng = random.Random(20240)
    state = tmp_path / "state"
    acked: list[str] = []
    server = serve_process(state).start()
    for kill in range(4):
        stop = threading.Event()

        def submit_until_stopped() -> None:
            while not stop.is_set() and len(acked) < 6:
                try:
                    acked.append(server.submit(QUICK))
                except (httpx.TransportError, AssertionError):
                    return  # killed in flight: not acknowledged, so it may or may not exist
                time.sleep(rng.uniform(0.0, 1.0))

        thread = threading.Thread(target=submit_until_stopped)
        thread.start()
        time.sleep(rng.uniform(3.0, 12.0))
        server.kill(signal.SIGKILL)
        stop.set()
        thread.join()
        server = serve_process(state, port=server.port).start()
    try:
        for job_id in acked:
            done = server.wait_state(job_id, {"succeeded", "failed", "cancelled"})
            assert done["state"] == "succeeded" and done["verified"], done
        listed = {j["id"] for j in httpx.get(f"{server.url}/api/v1/jobs", timeout=10).json()}
        assert set(acked) <= listed
    finally:
        server.kill(signal.SIGTERM)
    events = read_events(state / "events.jsonl")
    for job_id in acked:
        kinds = Counter(e["type"] for e in events if e["job_id"] == job_id)
        assert kinds["submit"] == 1 and kinds["complete"] == 1, (job_id, kinds)
    _index_agrees_with_log(state)
