"""``pollux-opt demo`` serves the dashboard's API over each of its runs while
they run: the jobs of its workload show, and nothing can be submitted to it."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the dashboard needs the service extra (pip install 'pollux-opt[service]')")
pytest.importorskip("torch", reason="real jobs need the CPU build of torch (pip install 'pollux-opt[jobs]')")
httpx = pytest.importorskip("httpx")

from pollux_opt.cli.main import main  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="real jobs on this machine's CPUs")

#: One job that reaches its target in seconds of training.
WORKLOAD = {"name": "one-quick-job", "jobs": [
    {"id": "quick", "kind": "synth-regress", "arrival_s": 0.0, "replicas": 1, "batch_size": 32,
     "spec": {"target": 0.3, "eval_every": 20, "config": {"samples": 20000, "width": 64}}}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_demo_serves_each_runs_jobs_and_refuses_submissions(tmp_path, capsys):
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    seen: dict[str, object] = {}

    def watch() -> None:
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline and "refused" not in seen:
            try:
                jobs = httpx.get(f"{url}/api/v1/jobs", timeout=5.0).json()
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            if jobs:
                seen["jobs"] = jobs
                seen["page"] = httpx.get(f"{url}/", timeout=5.0).status_code
                seen["refused"] = httpx.post(f"{url}/api/v1/jobs", json={"kind": "digits-cnn"}, timeout=5.0)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    status = main(["demo", "--quick", "--quiet", "--out", str(tmp_path / "demo"), "--workload", str(workload),
                   "--policies", "fixed", "--cpus", "2", "--port", str(port)])
    watcher.join()
    assert status == 0
    assert f"dashboard: {url}/" in capsys.readouterr().out
    assert [(j["id"], j["kind"]) for j in seen["jobs"]] == [("quick", "synth-regress")]
    assert seen["page"] == 200
    refused = seen["refused"]
    assert refused.status_code == 409 and "workload file" in refused.json()["error"]


def test_a_taken_port_runs_the_demo_without_its_dashboard(tmp_path, capsys):
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["demo", "--quick", "--quiet", "--out", str(tmp_path / "demo"), "--workload", str(workload),
                       "--policies", "fixed", "--cpus", "2", "--port", str(port)])
    assert status == 0
    assert f"port {port} is taken" in capsys.readouterr().err
