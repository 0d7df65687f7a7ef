"""A run on a real Ray autoscaler: Ray's fake multi-node provider on this machine
(what ``ray.cluster_utils.AutoscalingCluster`` starts), driven by ``pollux-opt
run --backend ray --autoscale``.  A burst of jobs makes the run ask for nodes,
the jobs run on them, and the nodes go once the jobs no longer need them (slow:
a minute or two)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from pollux_opt.records.events import read_events
from pollux_opt.workloads import Workload, WorkloadJob

pytestmark = pytest.mark.slow

#: Seconds Ray's autoscaler waits before removing an idle node (the fake cluster's setting).
IDLE_TIMEOUT_S = 6.0
#: Seconds from the autoscaler launching a fake node to its joining: its update
#: loop (1 s, AUTOSCALER_UPDATE_INTERVAL_S) and a raylet's start (about 3 s here;
#: a loaded 2-core machine takes longer).
FAKE_NODE_START_S = 15.0
#: Seconds between the autoscaler's updates (AUTOSCALER_UPDATE_INTERVAL_S, set for the head).
AUTOSCALER_UPDATE_S = 1
#: The run's scheduling interval, seconds.
INTERVAL_S = 2.0
#: Most worker nodes, of one CPU each.
MAX_WORKERS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(gcs_address: str) -> dict:
    """The fake provider's cluster configuration.  ``AutoscalingCluster`` reads a
    default one (``fake_multi_node/example.yaml``) that some Ray wheels lack,
    and its ``start`` runs ``ray stop --force``, which would end every Ray
    process of the machine, so the test writes its own configuration and starts
    the head itself: no CPUs on the head, worker nodes of one CPU, none at first."""
    return {
        "cluster_name": "pollux-opt-autoscaling-test",
        "max_workers": MAX_WORKERS,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": IDLE_TIMEOUT_S / 60.0,
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": gcs_address},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            "cpu1": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": MAX_WORKERS},
        },
        "head_node_type": "ray.head.default",
        "auth": {"ssh_user": "ray"}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


@pytest.fixture
def autoscaling_cluster(tmp_path):
    """The address of a fake autoscaling Ray cluster this test starts (its head
    leads a process group of its own, stopped afterwards: no other Ray process is touched)."""
    ray = pytest.importorskip("ray", reason="the Ray backend needs Ray (pip install 'pollux-opt[ray]')")
    pytest.importorskip("torch", reason="real jobs need the CPU build of torch (pip install 'pollux-opt[jobs]')")
    ray_cli = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if ray_cli is None:
        pytest.skip("the ray command is not installed beside this Python")
    port = _free_port()
    address = f"{ray._private.services.get_node_ip_address()}:{port}"
    config = tmp_path / "autoscaler.json"
    config.write_text(json.dumps(_config(address)))
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": str(AUTOSCALER_UPDATE_S)}
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=0", "--include-dashboard=false",
         f"--autoscaling-config={config}"],
        env=env, start_new_session=True, stdout=open(tmp_path / "head.log", "w"), stderr=subprocess.STDOUT)
    try:
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the head drains its nodes, then stops its process group
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)


def _free_since(events: list[dict]) -> dict[str, float]:
    """Each node's time of last holding no replica, from the run's events."""
    held: dict[str, dict[str, int]] = {}
    since: dict[str, float] = {}
    for e in events:
        if e["type"] in ("start", "rescale_begin", "restart_after_fault"):
            held[e["job_id"]] = dict(e["placement"])
        elif e["type"] in ("complete", "failed", "cancelled"):
            held.pop(e["job_id"], None)
        else:
            continue
        busy = {n for p in held.values() for n in p}
        for n in busy | set(since):
            if n in busy:
                since[n] = float("inf")
            elif since[n] == float("inf"):
                since[n] = e["t"]
    return since


def _requested_at_most(scales: list[dict], nodes: int, t: float) -> float:
    """Since when, up to ``t``, the run's request has been ``nodes`` nodes or fewer."""
    since = None
    for e in scales:
        if e["t"] > t:
            break
        since = (since if since is not None else e["t"]) if e["sizes"]["default"] <= nodes else None
    assert since is not None, f"nodes left at {t} s while more than {nodes} were requested"
    return since


def _alive_workers(address: str, timeout: float) -> list[tuple[float, int]]:
    """``(seconds, worker nodes alive)`` samples from a fresh driver, until none is
    alive or ``timeout`` seconds pass."""
    script = textwrap.dedent(f"""
        import json, time, ray
        ray.init(address={address!r}, logging_level="ERROR", log_to_driver=False)
        t0, out = time.monotonic(), []
        while True:
            n = sum(1 for x in ray.nodes() if x["Alive"] and x["Resources"].get("CPU", 0) > 0)
            out.append((time.monotonic() - t0, n))
            if n == 0 or time.monotonic() - t0 > {timeout}:
                break
            time.sleep(0.5)
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout + 120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_burst_adds_nodes_the_jobs_use_and_they_go_when_the_jobs_finish(autoscaling_cluster, tmp_path):
    # three one-replica jobs at once, one of them longer (a fixed amount of progress,
    # about a minute): the cluster grows to three nodes, then shrinks while it still runs
    long = {"target": 0.3, "progress_target": 60_000}
    jobs = [WorkloadJob(f"r{i}", "synth-regress", 0.0, 1, 32,
                        spec={**({"target": 0.13} if i else long), "eval_every": 50, "seed": i,
                              "config": {"samples": 20_000, "width": 64}}) for i in range(3)]
    wl = tmp_path / "burst.json"
    wl.write_text(json.dumps(Workload("burst", tuple(jobs)).to_json()))
    run = subprocess.run(
        [sys.executable, "-m", "pollux_opt", "run", "--backend", "ray", "--ray-address", autoscaling_cluster,
         "--workload", str(wl), "--policy", "pollux", "--out", str(tmp_path / "run"), "--interval", str(INTERVAL_S),
         "--autoscale", f"1:{MAX_WORKERS}", "--node-cpus", "1", "--node-startup", str(INTERVAL_S), "--quiet"],
        capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    events = read_events(tmp_path / "run" / "events.jsonl")
    assert sum(e["type"] == "complete" for e in events) == 3
    scales = [e for e in events if e["type"] == "scale"]
    nodes = [e for e in events if e["type"] == "nodes"]
    # grown: the request for more nodes is met within the provider's start-up and a round
    grow = next(e for e in scales if e["sizes"]["default"] == MAX_WORKERS)
    joined = [e["t"] for e in nodes for _ in e["joined"] if e["t"] >= grow["t"]]
    assert len(joined) >= MAX_WORKERS - 1
    assert joined[MAX_WORKERS - 2] - grow["t"] <= FAKE_NODE_START_S + INTERVAL_S
    # used: the jobs ran on every node the cluster had
    used = {n for e in events if e["type"] in ("start", "rescale_begin") for n in e["placement"]}
    every = {nid for e in nodes for nid in e["joined"]}
    assert used == every and len(used) == MAX_WORKERS
    # shrunk while a job still ran: each node left within the idle timeout and a round
    # (and the autoscaler's update) of its being both unrequested and free of replicas
    last_complete = max(e["t"] for e in events if e["type"] == "complete")
    departures = [(e["t"], nid) for e in nodes for nid in e["left"]]
    assert departures and departures[0][0] < last_complete
    free = _free_since(events)
    for i, (t, nid) in enumerate(departures):
        unrequested = _requested_at_most(scales, MAX_WORKERS - 1 - i, t)
        assert t - max(unrequested, free.get(nid, 0.0)) <= IDLE_TIMEOUT_S + INTERVAL_S + AUTOSCALER_UPDATE_S, (t, nid)
    # released: once the run has ended, its request is withdrawn and the last node goes too
    samples = _alive_workers(autoscaling_cluster, timeout=IDLE_TIMEOUT_S + 60)
    assert samples[-1][1] == 0, samples
