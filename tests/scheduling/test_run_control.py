"""Stopping and guarding a real run, with in-process stand-ins for its jobs (the
``fake_jobs`` fixture): Ctrl-C checkpoints and stops every job and a rerun resumes
them; a second scheduler on the same directory is refused; an unreadable line
of the event log names its file, its line and the recovery."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter

import pytest

import pollux_opt.backends.local.backend as rb
from pollux_opt import Cluster, InvalidProblem
from pollux_opt.backends.local import run_workload
from pollux_opt.backends.local.rundir import hold_run_lock
from pollux_opt.backends.local.run import RunInterrupted
from pollux_opt.cli.main import main
from pollux_opt.records.events import read_events
from pollux_opt.workloads import Workload, WorkloadJob

WORKLOAD = Workload("stop", (
    WorkloadJob("a", "digits-cnn", 0.0, 1, 32),
    WorkloadJob("b", "digits-cnn", 1.0, 1, 32),
    WorkloadJob("late", "digits-cnn", 200.0, 1, 32),
))
#: Run seconds at which the stand-in terminal sends its first Ctrl-C (both jobs train).
CTRL_C_AT_S = 12.0


def _interrupting(clock, at_s: float, signum: int = signal.SIGINT):
    """A ``sleep`` for the backend that, once the run is ``at_s`` old, sends this process ``signum`` once."""
    sent = []

    def sleep(dt: float) -> None:
        clock.sleep(dt)
        if clock.t - clock.start >= at_s and not sent:
            sent.append(clock.t)
            os.kill(os.getpid(), signum)
    return sleep


def _run(tmp_path, fake_jobs, clock, sleep=None, **kw):
    kwargs = fake_jobs.backend_kwargs(clock) | ({"sleep": sleep} if sleep else {})
    return run_workload(tmp_path, WORKLOAD, "fixed", cluster=Cluster.uniform(1, 2), interval=10.0,
                        progress=False, pin_cpus=False, backend_kwargs=kwargs, **kw)


def _interrupted_run(tmp_path, monkeypatch, fake_jobs, signum: int = signal.SIGINT) -> tuple:
    """``(clock, the run's RunInterrupted)`` of a run that ``signum`` stopped at :data:`CTRL_C_AT_S`."""
    clock = fake_jobs.clock()
    monkeypatch.setattr(rb.time, "time", clock.time)
    handler = signal.getsignal(signum)
    with pytest.raises(RunInterrupted) as info:
        _run(tmp_path, fake_jobs, clock, _interrupting(clock, CTRL_C_AT_S, signum))
    assert signal.getsignal(signum) is handler  # the run's handlers are gone with it
    return clock, info.value


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_checkpoints_and_stops_every_job_and_a_rerun_resumes_them(tmp_path, monkeypatch, fake_jobs, signum,
                                                                          status):
    clock, stop = _interrupted_run(tmp_path, monkeypatch, fake_jobs, signum)
    name = signal.Signals(signum).name
    assert stop.signum == signum and stop.exit_status == status and stop.stopped == ["a", "b"]
    assert re.search(rf"stopped by {name}: 2 unfinished job\(s\) checkpointed and stopped in .*; "
                     r"run the same command again to resume", str(stop))
    events = read_events(tmp_path / "events.jsonl")
    assert events[-1]["type"] == "run_stop" and events[-1]["reason"] == name and events[-1]["stopped"] == ["a", "b"]
    for jid in ("a", "b"):
        mine = [e for e in events if e["job_id"] == jid]
        assert [(e["type"], e["placement"]) for e in mine[-2:]] == [("rescale_begin", {}), ("rescale_end", {})]
        assert mine[-2]["reason"] == name
        assert json.loads((tmp_path / "jobs" / jid / "fake.json").read_text())["state"] == "queued"
    summary = run_workload(tmp_path, progress=False, backend_kwargs=fake_jobs.backend_kwargs(clock))
    assert all(j["completed"] for j in summary["jobs"]) and len(summary["jobs"]) == 3
    events = read_events(tmp_path / "events.jsonl")
    per_job = Counter((e["job_id"], e["type"]) for e in events)
    assert all(per_job[(j, "submit")] == per_job[(j, "complete")] == 1 for j in ("a", "b", "late"))
    assert [e["resumed"] for e in events if e["type"] == "run_start"] == [False, True]
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)


def test_a_second_ctrl_c_stops_at_once_and_the_run_still_resumes(tmp_path, monkeypatch, fake_jobs):
    clock = fake_jobs.clock()
    monkeypatch.setattr(rb.time, "time", clock.time)

    def wait_interrupted(self, timeout=None):  # the user presses Ctrl-C again while jobs checkpoint
        os.kill(os.getpid(), signal.SIGINT)
        return self.report()

    monkeypatch.setattr(fake_jobs.job_class, "wait", wait_interrupted)
    with pytest.raises(KeyboardInterrupt) as info:
        _run(tmp_path, fake_jobs, clock, _interrupting(clock, CTRL_C_AT_S))
    assert not isinstance(info.value, RunInterrupted)
    assert read_events(tmp_path / "events.jsonl")[-1]["type"] != "run_stop"
    monkeypatch.undo()
    monkeypatch.setattr(rb.time, "time", clock.time)
    summary = run_workload(tmp_path, progress=False, backend_kwargs=fake_jobs.backend_kwargs(clock))
    assert all(j["completed"] for j in summary["jobs"])


def test_a_second_scheduler_on_the_same_directory_is_refused(tmp_path, capsys, fake_jobs):
    refusal = (rf"run directory {re.escape(repr(str(tmp_path)))} is in use by another scheduler "
               rf"\(process {os.getpid()} holds scheduler.lock\); wait for it to end, or stop it \(Ctrl-C\) "
               r"and rerun, or use another --out")
    with hold_run_lock(tmp_path):
        with pytest.raises(InvalidProblem, match=refusal):
            _run(tmp_path, fake_jobs, fake_jobs.clock())
        assert main(["run", "--out", str(tmp_path), "--quiet"]) == 2
    assert re.search(refusal, capsys.readouterr().err)
    assert not (tmp_path / "events.jsonl").exists() and not (tmp_path / "config.json").exists()


def test_the_run_lock_ends_with_the_process_that_held_it(tmp_path):
    pytest.importorskip("fcntl")
    code = ("import sys, time; from pollux_opt.backends.local.rundir import hold_run_lock\n"
            f"with hold_run_lock({str(tmp_path)!r}):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InvalidProblem, match=rf"\(process {holder.pid} holds scheduler.lock\)"):
            with hold_run_lock(tmp_path):
                pass
    finally:
        holder.kill()  # SIGKILL: no cleanup, the kernel drops the lock
        holder.wait()
    with hold_run_lock(tmp_path) as path:
        assert path.read_text() == f"{os.getpid()}\n"


def test_an_unreadable_event_line_names_its_recovery_and_repair_resumes(tmp_path, monkeypatch, capsys, fake_jobs):
    clock, _ = _interrupted_run(tmp_path, monkeypatch, fake_jobs)
    log = tmp_path / "events.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:3] + ["garbage {"] + lines[3:]) + "\n")
    recovery = (r"line 4 is not JSON: .*; to keep every readable event and set the unreadable lines aside "
                r"\(into events.jsonl.rejected\), rerun with --repair-log \(pollux-opt run\)")
    with pytest.raises(InvalidProblem, match=rf"event log {re.escape(repr(str(log)))} {recovery}"):
        run_workload(tmp_path, progress=False, backend_kwargs=fake_jobs.backend_kwargs(clock))
    assert log.read_text().splitlines()[-1] == lines[-1]  # refused before writing anything
    assert main(["run", "--out", str(tmp_path), "--quiet"]) == 2
    assert re.search(recovery, capsys.readouterr().err)
    summary = run_workload(tmp_path, progress=False, backend_kwargs=fake_jobs.backend_kwargs(clock), repair=True)
    assert all(j["completed"] for j in summary["jobs"])
    assert (tmp_path / "events.jsonl.rejected").read_text() == "4: garbage {\n"
    events = read_events(log)
    assert [json.dumps(e, separators=(",", ":")) for e in events[: len(lines)]] == lines
