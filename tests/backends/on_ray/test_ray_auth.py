"""Joining a Ray cluster started with token authentication (``RAY_AUTH_MODE=token``,
as docs/ray.md starts one): without the token ``pollux-opt run --backend ray``
ends with one line naming the address and the cause (exit status 2); with
``RAY_AUTH_MODE=token`` and the token in ``~/.ray/auth_token`` it connects.

The head is a ``ray start --head --block`` this test starts in a process group of
its own (its own port and temporary directory), ended by signalling that group only.
Clients run in fresh processes: Ray reads its authentication mode once per process.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray backend needs Ray (pip install 'pollux-opt[ray]')")

#: Seconds the head may take to answer on its port, and to end after SIGTERM (it drains up to 30 s).
HEAD_START_S, HEAD_STOP_S = 60.0, 45.0
#: Seconds a client may take (Ray retries a refused connection for about 20 s).
CLIENT_S = 120.0
#: Environment variables of this process that would say how to reach or authenticate to Ray.
RAY_VARS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def token_head():
    """``(address, token)`` of a one-CPU Ray head with token authentication on."""
    token = secrets.token_hex(32)
    port = _free_port()
    # Short path: Ray's Unix sockets live under its temporary directory.
    temp = tempfile.mkdtemp(prefix="pxray-")
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}", "--num-cpus=1",
         f"--temp-dir={temp}", "--include-dashboard=false", "--disable-usage-stats", "--block"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + HEAD_START_S
        while not _answers(port):
            assert head.poll() is None and time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", token
    finally:
        # ``ray start`` drains its node and ends its processes on SIGTERM; the
        # group's SIGKILL is for a head that does not.
        head.terminate()
        try:
            head.wait(HEAD_STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def _client(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in RAY_VARS}
    base.update(HOME=str(home), PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, *args], env=base, cwd=home, capture_output=True, text=True,
                          timeout=CLIENT_S)


def test_joining_a_token_cluster_without_the_token_is_one_clear_line(token_head, tmp_path):
    address, _ = token_head
    done = _client(["-m", "pollux_opt", "run", "--backend", "ray", "--ray-address", address, "--workload", "mixed",
                    "--quick", "--policy", "pollux", "--out", str(tmp_path / "run"), "--quiet"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pollux-opt: error: could not connect to the Ray cluster at address={address!r}")
    assert "token authentication refused this machine: set RAY_AUTH_MODE=token" in last


def test_joining_a_token_cluster_with_the_token_in_the_default_file_connects(token_head, tmp_path):
    address, token = token_head
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(token)
    probe = ("from pollux_opt.backends.ray.nodes import RayNodes\n"
             "from pollux_opt.backends.ray.backend import connect\n"
             f"ray, _ = connect({address!r})\n"
             "print(sum(n.cpus for n in RayNodes(ray).cluster().nodes))\n")
    done = _client(["-c", probe], tmp_path, RAY_AUTH_MODE="token")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1"]
