"""Killing ``pollux-opt run`` and its workers at random, and stopping it with
Ctrl-C, on real CPU jobs (slow: minutes).

What a kill may cost and what it may not:

* A scheduler killed with SIGKILL leaves no process behind (its workers, the
  fork server and multiprocessing's resource tracker end within seconds) and
  no temporary folder; rank 0 of each training job checkpoints its last step
  first, so the resumed run repeats no step.
* A killed worker other than rank 0 costs no step either (rank 0 checkpoints
  its last completed step when its collective fails); a killed rank 0
  repeats at most the steps since its last checkpoint
  (``RuntimeOptions.checkpoint_interval_s`` of training).
* Every job ends verified, exactly once, and never trains past its target.

Under ``fixed`` the jobs train at their submitted batch sizes, deterministically,
so the killed run must end every job exactly as a run without kills does: the
same final step, progress and verified metric.  Under ``pollux`` a job re-picks
its batch size from its measured step times, so two runs (killed or not) take
different step sequences to the same target and cannot be compared step by
step; the test checks instead what makes a run's outcome that of an
uninterrupted one: the job's evaluations, carried through every checkpoint it
resumed from, are one increasing sequence that ends at the first one to reach
the target, on the job's final step, and no step a kill interrupted is lost or
(but for a killed rank 0) done twice.  Both policies get these checks.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import random
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
from pollux_opt.runtime.status import STEP_COLUMNS  # noqa: E402
from pollux_opt.runtime.lifeline import TEMP_PREFIX  # noqa: E402
from pollux_opt.runtime.report import RuntimeOptions  # noqa: E402

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

#: Four small jobs of different kinds (the ``mixed`` kinds at about its quick
#: targets, arriving at once): 1-2 minutes of training on 2 cores without kills,
#: enough for the kills to land while they train.
WORKLOAD = {"name": "kills", "jobs": [
    {"id": "digits", "kind": "digits-cnn", "arrival_s": 0, "replicas": 1, "batch_size": 64,
     "spec": {"target": 0.97}},
    {"id": "regress", "kind": "synth-regress", "arrival_s": 1, "replicas": 2, "batch_size": 64,
     "spec": {"target": 0.13, "config": {"samples": 20000, "width": 64}}},
    {"id": "charlm", "kind": "stdlib-charlm", "arrival_s": 2, "replicas": 1, "batch_size": 128,
     "spec": {"target": 1.95}},
    {"id": "ratings", "kind": "ratings-mf", "arrival_s": 3, "replicas": 1, "batch_size": 512,
     "spec": {"target": 0.60, "config": {"lr": 5e-4}}},
]}
#: CPUs the runs use (two, as the machine this was sized on, so that a larger
#: machine does not finish the jobs before the kills).
CPUS = 2
#: Random kills in one run (scheduler and workers mixed).
KILLS = 10
#: Seed of the kill schedule (override with POLLUX_KILL_SEED to explore others).
SEED = int(os.environ.get("POLLUX_KILL_SEED", "20211"))
#: Steps (of all jobs together) to see after a kill before the next one, and
#: then the range of a random pause, seconds.
STEPS_BETWEEN_KILLS, PAUSE_S = 20, (0.5, 2.5)
#: Most seconds a killed scheduler's processes may outlive it (the lifeline's
#: watch period and grace, plus the fork server's exit, on a loaded machine).
ORPHAN_LIMIT_S = 15.0
#: Slack on the bound of a killed rank 0's repeated training, seconds (a step and a checkpoint).
REPEAT_SLACK_S = 3.0
#: Fault restarts a job allows (RuntimeOptions default): more worker kills of one job would fail it.
MAX_RESTARTS = RuntimeOptions().max_restarts
#: Generous limits, seconds.
RUN_LIMIT_S, PROGRESS_LIMIT_S = 900.0, 240.0
#: A CSV the tests append their figures to when set (``experiments/kill_runs.py`` sets it).
RECORD_ENV = "POLLUX_KILL_RECORD"
#: Its columns.
RECORD_COLUMNS = ["test", "policy", "kills", "scheduler_kills", "worker_kills", "rank0_kills", "jobs", "verified",
                  "steps_repeated_where_none_may_be", "steps_repeated_after_rank0_kills", "processes_left",
                  "temp_dirs_left", "same_outcome_as_without_kills", "seconds"]


def _record(**row) -> None:
    """Append ``row`` (RECORD_COLUMNS, missing ones empty) to the CSV named by RECORD_ENV, if set."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    new = not Path(path).exists()
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=RECORD_COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


# ------------------------------------------------------------------ processes
def _stats() -> dict[int, list[str]]:
    """The fields after the command of every live (non-zombie) process's /proc stat, by pid."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] not in ("Z", "X"):
            found[int(entry)] = fields
    return found


#: SIDs (setsid groups) of the schedulers' descendants (the worker pool calls setsid), by scheduler pid.
_SIDS: dict[int, set[int]] = {}


def _group(pgid: int) -> list[int]:
    """Live processes of the scheduler whose process group is ``pgid`` (started by setsid): its group's,
    and those of the SIDs its descendants were seen in (its worker pool's)."""
    stats = _stats()
    sids = _SIDS.setdefault(pgid, {pgid})
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    todo = [pgid] if pgid in stats else []
    while todo:  # the live descendants' SIDs, remembered for after the scheduler's death
        pid = todo.pop()
        sids.add(int(stats[pid][3]))
        todo.extend(children.get(pid, []))
    return [pid for pid, fields in stats.items() if int(fields[2]) == pgid or int(fields[3]) in sids]


def _wait_empty(pgid: int, limit: float) -> float | None:
    """Seconds until group ``pgid`` has no live process (None: not within ``limit``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if not _group(pgid):
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def _command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pollux_opt.cli.main", "run", "--out", str(out), "--quiet", "--interval", "5",
            "--cpus", str(CPUS), *extra]


def _start(out: Path, wl_file: Path | None, policy: str = "pollux") -> subprocess.Popen:
    extra = ("--workload", str(wl_file), "--policy", policy) if wl_file else ()
    err = open(out.parent / f"stderr-{time.time_ns()}.txt", "w")
    return subprocess.Popen(_command(out, *extra), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


# ----------------------------------------------------------------- job files
def _steps(workdir: Path) -> list[dict]:
    """Rank 0's step rows of ``steps.csv`` in append order (a row torn by a kill is left out)."""
    path = workdir / "steps.csv"
    if not path.exists():
        return []
    rows = []
    with open(path, newline="") as fh:
        for row in csv.reader(fh):
            if len(row) != len(STEP_COLUMNS) or row[0] == "generation":
                continue
            try:
                rows.append({"generation": int(row[0]), "step": int(row[1]), "time": float(row[2])})
            except ValueError:
                continue
    return rows


def _segments(rows: list[dict]) -> list[list[dict]]:
    """Runs of consecutive steps of one generation (a new one after each restart or rescale)."""
    out: list[list[dict]] = []
    for row in rows:
        last = out[-1][-1] if out else None
        if last is None or row["generation"] != last["generation"] or row["step"] != last["step"] + 1:
            out.append([])
        out[-1].append(row)
    return out


def _live_workers(out: Path, pgid: int) -> list[tuple[str, int, int]]:
    """``(job, rank, pid)`` of the training workers of process group ``pgid``, for
    jobs that can still afford a fault restart."""
    found = []
    for workdir in sorted((out / "jobs").glob("*")):
        try:
            state = json.loads((workdir / "state.json").read_text())
            events = [json.loads(line) for line in (workdir / "events.jsonl").read_text().splitlines() if line]
        except (OSError, ValueError):
            continue
        if state.get("state") != "running" or state.get("verifying") or state.get("num_restarts", 0) >= MAX_RESTARTS:
            continue
        launch = [e for e in events if e.get("kind") in ("started", "restarted", "rescaled")]
        for rank, pid in enumerate(launch[-1]["details"]["pids"] if launch else []):
            if pid in _group(pgid):
                found.append((workdir.name, rank, pid))
    return found


def _total_steps(out: Path) -> int:
    return sum(len(_steps(d)) for d in (out / "jobs").glob("*")) if (out / "jobs").exists() else 0


def _wait_for_steps(out: Path, since: int, proc: subprocess.Popen) -> bool:
    """Wait until the jobs have logged STEPS_BETWEEN_KILLS more steps; False if the run ended first."""
    deadline = time.monotonic() + PROGRESS_LIMIT_S
    while _total_steps(out) < since + STEPS_BETWEEN_KILLS:
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, f"no progress {PROGRESS_LIMIT_S} s after a kill"
        time.sleep(0.5)
    return True


# ------------------------------------------------------------------- checks
def _check_log(out: Path, jobs: set[str], schedulers: int) -> list[dict]:
    """The event log parses line by line into one history: time never runs
    backwards, each job completes once and has no event after that."""
    lines = (out / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert all(isinstance(e, dict) for e in events)
    times = [e["t"] for e in events]
    assert times == sorted(times), "time ran backwards"
    assert [e["resumed"] for e in events if e["type"] == "run_start"] == [False] + [True] * (schedulers - 1)
    for jid in jobs:
        mine = [e for e in events if e["job_id"] == jid]
        kinds = [e["type"] for e in mine]
        assert kinds.count("complete") == 1 and kinds[-1] == "complete", (jid, kinds[-5:])
        assert kinds.count("submit") == 1
    return events


def _check_completion_rule(out: Path, events: list[dict], jid: str) -> None:
    """The job ended at its first evaluation that reached its target, on its final step."""
    workdir = out / "jobs" / jid
    spec = json.loads(json.loads((workdir / "job.json").read_text())["spec"])
    final = sorted((workdir / "checkpoints").glob("ckpt-*.json"))[-1]
    meta = json.loads(final.read_text())
    history = meta["eval_history"]  # [step, progress, metric, seconds], carried through every resume
    reached = [(m >= spec["target"]) if spec.get("higher_is_better", True) else (m <= spec["target"])
               for _, _, m, _ in history]
    assert meta["final"] and reached[-1] and not any(reached[:-1]), (jid, history[-3:])
    steps, progress = [h[0] for h in history], [h[1] for h in history]
    assert steps == sorted(set(steps)) and progress == sorted(progress)
    complete = next(e for e in events if e["job_id"] == jid and e["type"] == "complete")
    assert complete["step"] == meta["step"] == steps[-1] and complete["verified"]
    assert json.loads((workdir / "verification.json").read_text())["metric"] == complete["value"]


def _repeated_steps(out: Path, jid: str, rank0_kills: list[float]) -> tuple[int, int]:
    """(steps repeated after restarts that must repeat none, steps repeated after
    killed rank-0 workers); asserts the latter stay within the checkpoint interval."""
    must_not, allowed = 0, 0
    segments = _segments(_steps(out / "jobs" / jid))
    for old, new in zip(segments, segments[1:]):
        repeated = old[-1]["step"] - (new[0]["step"] - 1)
        if repeated <= 0:
            continue
        killed = [t for t in rank0_kills if old[-1]["time"] - 1.0 <= t <= new[0]["time"]]
        if not killed:
            must_not += repeated
            continue
        allowed += repeated
        # Trained since the checkpoint resumed from, or since the generation began if that came before it.
        since = next((r["time"] for r in old if r["step"] == new[0]["step"] - 1), old[0]["time"])
        interval = RuntimeOptions().checkpoint_interval_s
        assert old[-1]["time"] - since <= interval + REPEAT_SLACK_S, (jid, repeated)
    return must_not, allowed


def _our_temp_dirs(pids: set[int]) -> list[str]:
    import tempfile

    root = Path(tempfile.gettempdir())
    return [p.name for p in root.glob(f"{TEMP_PREFIX}*") if int(p.name[len(TEMP_PREFIX):].split("-")[0]) in pids]


# -------------------------------------------------------------------- tests
def _killed_run(tmp_path: Path, policy: str) -> tuple[Path, list[tuple[str, str, int, float]], int]:
    """Run WORKLOAD under ``policy`` with KILLS random kills (half of the
    scheduler, resumed at once, half of a training worker), to the end; checks
    what every such run must hold and returns the run directory, the kills
    ``(what, job, rank, unix time)`` and the number of scheduler processes."""
    rng = random.Random(SEED)
    plan = ["scheduler", "worker"] * (KILLS // 2) + ["scheduler"] * (KILLS % 2)
    rng.shuffle(plan)
    wl_file = tmp_path / "wl.json"
    wl_file.write_text(json.dumps(WORKLOAD))
    out = tmp_path / "run"
    schedulers = [_start(out, wl_file, policy)]
    kills: list[tuple[str, str, int, float]] = []
    killed_groups: list[int] = []
    seen: set[int] = set()
    t_start = time.monotonic()
    while len(kills) < KILLS and _wait_for_steps(out, _total_steps(out), schedulers[-1]):
        proc = schedulers[-1]
        time.sleep(rng.uniform(*PAUSE_S))
        seen.update(_group(proc.pid))
        victims = _live_workers(out, proc.pid)
        log.info("kill %d (%s) at %.0f s, workers that may be killed: %s", len(kills) + 1, plan[len(kills)],
                 time.monotonic() - t_start, victims)
        if victims and plan[len(kills)] == "worker":  # else (no training worker now) the scheduler
            job, rank, pid = rng.choice(victims)
            os.kill(pid, signal.SIGKILL)
            kills.append(("worker", job, rank, time.time()))
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the scheduler only, as `kill -9 PID` does
            kills.append(("scheduler", "", -1, time.time()))
            proc.wait()
            killed_groups.append(proc.pid)
            schedulers.append(_start(out, None))  # resume at once: its old workers may still be saving
    assert len(kills) >= KILLS, f"the run finished after {len(kills)} kills: make the workload longer"
    assert schedulers[-1].wait(timeout=RUN_LIMIT_S) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {j["id"] for j in summary["jobs"]} == {j["id"] for j in WORKLOAD["jobs"]}
    assert all(j["completed"] and j["verified"] and not j["failed"] for j in summary["jobs"])
    left = {pgid: _group(pgid) for pgid in killed_groups}
    temp_left = _our_temp_dirs(seen)
    figures = {"policy": policy, "kills": len(kills), "scheduler_kills": sum(k[0] == "scheduler" for k in kills),
               "worker_kills": sum(k[0] == "worker" for k in kills),
               "rank0_kills": sum(k[0] == "worker" and k[2] == 0 for k in kills), "jobs": len(summary["jobs"]),
               "verified": sum(bool(j["verified"]) for j in summary["jobs"]),
               "processes_left": sum(len(v) for v in left.values()), "temp_dirs_left": len(temp_left),
               "seconds": round(time.monotonic() - t_start, 1)}
    assert not any(left.values()), left
    assert temp_left == []
    log.info("%s: kills %s (seed %d) in %.0f s; no process or temporary folder left", policy,
             Counter(k[0] if k[0] == "scheduler" else f"worker rank {k[2]}" for k in kills), SEED,
             time.monotonic() - t_start)
    return out, kills, len(schedulers), figures


def _check_steps(out: Path, kills: list, schedulers: int, figures: dict) -> list[dict]:
    """The log is one history; each job ended by its completion rule; no step
    was repeated but after a killed rank 0 (and those within the checkpoint
    interval).  Adds the repeated steps to ``figures``."""
    jobs = {j["id"] for j in WORKLOAD["jobs"]}
    events = _check_log(out, jobs, schedulers)
    repeated = {}
    for jid in sorted(jobs):
        _check_completion_rule(out, events, jid)
        rank0 = [t for what, job, rank, t in kills if what == "worker" and job == jid and rank == 0]
        repeated[jid] = _repeated_steps(out, jid, rank0)
    log.info("repeated steps per job (where none may be, after killed rank 0): %s", repeated)
    figures["steps_repeated_where_none_may_be"] = sum(must_not for must_not, _ in repeated.values())
    figures["steps_repeated_after_rank0_kills"] = sum(allowed for _, allowed in repeated.values())
    assert all(must_not == 0 for must_not, _ in repeated.values()), repeated
    return events


def _outcomes(events: list[dict]) -> dict[str, tuple]:
    return {e["job_id"]: (e["step"], e["progress"], e["value"]) for e in events if e["type"] == "complete"}


def test_random_kills_under_pollux_lose_no_completed_step(tmp_path):
    out, kills, schedulers, figures = _killed_run(tmp_path, "pollux")
    _check_steps(out, kills, schedulers, figures)
    _record(test="random kills", **figures)


def test_random_kills_under_fixed_end_every_job_as_a_run_without_kills_to_the_bit(tmp_path):
    """At the submitted batch sizes the jobs train deterministically: each
    job's final step, progress and verified metric equal those of a run without kills."""
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "wl.json").write_text(json.dumps(WORKLOAD))
    assert _start(reference / "run", reference / "wl.json", "fixed").wait(timeout=RUN_LIMIT_S) == 0
    expected = _outcomes(read_events(reference / "run" / "events.jsonl"))
    killed = tmp_path / "killed"
    killed.mkdir()
    out, kills, schedulers, figures = _killed_run(killed, "fixed")
    got = _outcomes(_check_steps(out, kills, schedulers, figures))
    log.info("final (step, progress, metric) per job, killed vs not: %s vs %s", got, expected)
    _record(test="random kills", same_outcome_as_without_kills=got == expected, **figures)
    assert got == expected


def test_a_killed_scheduler_leaves_no_process_and_no_temporary_folder(tmp_path):
    wl_file = tmp_path / "wl.json"
    wl_file.write_text(json.dumps(WORKLOAD))
    out = tmp_path / "run"
    proc = _start(out, wl_file)
    try:
        assert _wait_for_steps(out, 0, proc)
        members = set(_group(proc.pid))
        assert len(members) >= 4  # scheduler, resource tracker, fork server, workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        seconds = _wait_empty(proc.pid, ORPHAN_LIMIT_S)
        log.info("%d processes of the killed scheduler's group ended %.1f s after it", len(members) - 1,
                 seconds or -1)
        temp_left = _our_temp_dirs(members)
        _record(test="scheduler SIGKILL", policy="pollux", kills=1, scheduler_kills=1, worker_kills=0,
                processes_left=len(_group(proc.pid)), temp_dirs_left=len(temp_left))
        assert seconds is not None, _group(proc.pid)
        assert temp_left == []
    finally:
        for pid in _group(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_ctrl_c_stops_with_every_job_checkpointed_and_a_rerun_resumes_them(tmp_path):
    wl_file = tmp_path / "wl.json"
    wl_file.write_text(json.dumps(WORKLOAD))
    out = tmp_path / "run"
    err = tmp_path / "stderr.txt"
    proc = subprocess.Popen(_command(out, "--workload", str(wl_file), "--policy", "pollux"),
                            stdout=subprocess.DEVNULL, stderr=open(err, "w"), start_new_session=True)
    assert _wait_for_steps(out, 0, proc)
    before = {d.name: _steps(d) for d in (out / "jobs").glob("*")}
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C: the whole group
    t0 = time.monotonic()
    assert proc.wait(timeout=60) == 130
    log.info("Ctrl-C: the run stopped %.1f s after it", time.monotonic() - t0)
    text = err.read_text()
    assert "Traceback" not in text and "stopped by SIGINT" in text, text
    assert _wait_empty(proc.pid, ORPHAN_LIMIT_S) is not None
    stop = read_events(out / "events.jsonl")[-1]
    assert stop["type"] == "run_stop" and stop["reason"] == "SIGINT"
    states = {d.name: json.loads((d / "state.json").read_text())["state"] if (d / "state.json").exists()
              else "queued" for d in (out / "jobs").glob("*")}  # no state.json: never started
    assert set(stop["stopped"]) == {j for j, s in states.items() if s != "succeeded"} and stop["stopped"]
    assert all(states[j] == "queued" for j in stop["stopped"]), states
    trained = [j for j in stop["stopped"] if before.get(j)]
    assert trained  # some job was interrupted mid-training

    assert subprocess.run(_command(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=RUN_LIMIT_S).returncode == 0
    summary = json.loads((out / "summary.json").read_text())
    assert all(j["completed"] and j["verified"] for j in summary["jobs"])
    repeated = {jid: _repeated_steps(out, jid, [])[0] for jid in trained}
    _record(test="Ctrl-C and rerun", policy="pollux", jobs=len(summary["jobs"]),
            verified=sum(bool(j["verified"]) for j in summary["jobs"]),
            steps_repeated_where_none_may_be=sum(repeated.values()))
    assert all(n == 0 for n in repeated.values()), repeated  # each resumed from the step it stopped at
