"""What ends the pool's processes and temporary folders once their scheduler is gone
(:mod:`pollux_opt.runtime.lifeline`), and the checkpoints' one-writer lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pollux_opt.runtime import lifeline
from pollux_opt.runtime.checkpoint import WriterLock, wait_for_writer
from pollux_opt.runtime.lifeline import (
    ORPHAN_EXIT_STATUS, ORPHAN_GRACE_S, TEMP_PREFIX, WATCH_S, process_exists, process_identity, sweep_temp_dirs,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@linux_only
def test_a_process_exists_until_it_ends_and_a_reused_pid_is_another_process():
    me = process_identity()
    assert me[0] == os.getpid() and me[1] is not None and process_exists(me)
    assert not process_exists((me[0], me[1] + 1))  # same pid, another start time: another process
    child = _sleeper()
    ident = process_identity(child.pid)
    assert process_exists(ident)
    child.kill()
    deadline = time.monotonic() + 5
    while process_exists(ident) and time.monotonic() < deadline:  # a zombie does not count
        time.sleep(0.01)
    assert not process_exists(ident)
    child.wait()
    assert not process_exists(ident)


@linux_only
def test_an_orphaned_pool_process_ends_soon_after_its_scheduler():
    scheduler = _sleeper()
    code = ("import sys, time; from pollux_opt.runtime.lifeline import pool_process_main; "
            f"pool_process_main(({scheduler.pid}, {process_identity(scheduler.pid)[1]}), time.sleep, (60,))")
    orphan = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(3 * WATCH_S)
        assert orphan.poll() is None  # its scheduler lives
        scheduler.kill()
        t0 = time.monotonic()
        assert orphan.wait(timeout=30) == ORPHAN_EXIT_STATUS
        assert time.monotonic() - t0 < 10 * WATCH_S  # nothing to save: no grace
    finally:
        for p in (scheduler, orphan):
            p.kill()
            p.wait()


@linux_only
def test_an_orphan_saving_its_state_gets_the_grace_before_its_lifeline_ends_it():
    scheduler = _sleeper()
    code = ("import time; from pollux_opt.runtime.lifeline import Lifeline; "
            f"lifeline = Lifeline(({scheduler.pid}, {process_identity(scheduler.pid)[1]})).start()\n"
            "with lifeline.saving_state(): time.sleep(60)")
    orphan = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(3 * WATCH_S)
        scheduler.kill()
        t0 = time.monotonic()
        time.sleep(ORPHAN_GRACE_S / 2)
        assert orphan.poll() is None  # still saving, within its grace
        assert orphan.wait(timeout=30) == ORPHAN_EXIT_STATUS
        assert time.monotonic() - t0 >= ORPHAN_GRACE_S
    finally:
        for p in (scheduler, orphan):
            p.kill()
            p.wait()


@linux_only
def test_sweep_removes_only_the_folders_of_ended_processes(tmp_path, monkeypatch):
    monkeypatch.setattr(lifeline.tempfile, "gettempdir", lambda: str(tmp_path))
    ended = _sleeper()
    ended.kill()
    ended.wait()
    live = tmp_path / f"{TEMP_PREFIX}{os.getpid()}-abc"
    dead = tmp_path / f"{TEMP_PREFIX}{ended.pid}-def"
    other = tmp_path / "pymp-xyz"
    for d in (live, dead, other):
        d.mkdir()
        (d / "listener-1").write_text("")
    assert sweep_temp_dirs() == [dead]
    assert live.exists() and other.exists() and not dead.exists()


def test_the_writer_lock_has_one_holder_at_a_time(tmp_path):
    pytest.importorskip("fcntl")
    first, second = WriterLock(tmp_path), WriterLock(tmp_path)
    assert first.acquire(timeout_s=0.0)
    t0 = time.monotonic()
    assert not second.acquire(timeout_s=0.2) and time.monotonic() - t0 >= 0.2
    assert not wait_for_writer(tmp_path, timeout_s=0.0)
    first.release()
    assert wait_for_writer(tmp_path, timeout_s=0.0) and second.acquire(timeout_s=0.0)
    second.release()
    assert (tmp_path / "checkpoints" / "writer.lock").exists()
