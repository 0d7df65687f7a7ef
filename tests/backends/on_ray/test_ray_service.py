"""The service on the Ray backend: ``pollux-opt serve --backend ray`` joined to
the two-node test cluster, its jobs submitted over HTTP, run on the cluster's
nodes, logged per rank, cancelled (slow: a minute)."""

from __future__ import annotations

import signal

import pytest

pytest.importorskip("fastapi", reason="the service needs its extra (pip install 'pollux-opt[service]')")
httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

#: A job that reaches its target in seconds, and one that would train for minutes.
QUICK = {"kind": "synth-regress", "replicas": 1, "batch_size": 32,
         "spec": {"target": 0.13, "eval_every": 50, "config": {"samples": 20_000, "width": 64}}}
LONG = {"kind": "synth-regress", "replicas": 1, "batch_size": 32,
        "spec": {"target": 0.05, "eval_every": 50, "config": {"samples": 20_000, "width": 64}}}


def test_the_service_runs_jobs_on_the_ray_clusters_nodes(two_nodes, tmp_path, serve_process):
    cluster, _ = two_nodes
    server = serve_process(tmp_path / "state", args=("--backend", "ray", "--ray-address", cluster.address)).start()
    try:
        quick, long = server.submit(QUICK), server.submit(LONG)
        server.wait_state(long, {"running"})
        done = server.wait_state(quick, {"succeeded", "failed"})
        assert done["state"] == "succeeded" and done["verified"], done
        nodes = httpx.get(f"{server.url}/api/v1/cluster", timeout=10).json()["nodes"]
        assert len(nodes) == 2 and all(n["id"].startswith("ray-") for n in nodes)
        logs = httpx.get(f"{server.url}/api/v1/jobs/{quick}/logs", params={"rank": 0}, timeout=10)
        assert logs.status_code == 200 and logs.text.strip()
        assert httpx.post(f"{server.url}/api/v1/jobs/{long}/cancel", timeout=10).status_code == 202
        assert server.wait_state(long, {"cancelled", "failed", "succeeded"}, 120.0)["state"] == "cancelled"
    finally:
        status = server.kill(signal.SIGTERM)
    assert status in (0, 128 + signal.SIGTERM), server.log()
