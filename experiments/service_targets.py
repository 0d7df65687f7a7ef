"""Measure ``pollux-opt serve`` against its targets (``docs/service.md``).

Four measurements, each a few rows of ``target, metric, value, unit, limit,
passed, n, machine`` in one CSV (``results_service.py`` renders it):

1. *submit to first replica*: a served state on 2 CPUs whose rounds come every
   30 s, so that only the wake-up on a submission can start a job at once;
   quick ``synth-regress`` jobs one after another, each timed from just before
   its POST to its ``running`` transition (the server's Unix time; same machine).
2. *200 submissions from 8 concurrent clients* while two jobs train, and the
   latency of ``GET /api/v1/jobs`` polled meanwhile from another process (with
   that of ``GET /healthz``, the machine's floor under the same load), over
   five bursts on fresh servers; no acknowledged job may be lost.
3. *1000 queued jobs*: the scheduling round with 1000 jobs on a simulated
   16 x 4-CPU cluster, in this process with stand-in jobs that hold their CPUs
   without training, served (the queue in ``service.db``) and as a closed
   workload of the same jobs; the service's round may cost at most 10 % more.
4. *SIGKILLs of the server*: real jobs on 2 CPUs, the server's process group
   (its worker pool, detached by setsid, then ends by its watchdog)
   killed at random moments (seeded; some kills while a submission is in
   flight, retried with its idempotency key) and restarted on the same state;
   no acknowledged job lost or run twice, and no completed step lost beyond
   the documented bound.

    python experiments/service_targets.py            # -> experiments/results/service.csv (up to 15 min on 2 cores)
    python experiments/service_targets.py --quick    # smoke run -> experiments/results/service_quick.csv (< 3 minutes)
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import multiprocessing
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from pollux_opt import InvalidProblem
from pollux_opt.lifecycle import JobState
from pollux_opt.records.files import atomic_write_csv
from pollux_opt.runtime.report import RuntimeOptions
from pollux_opt.runtime.status import STEP_COLUMNS, STEPS_FILE
from solver_speed import machine_name

log = logging.getLogger("service_targets")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
COLUMNS = ["target", "metric", "value", "unit", "limit", "passed", "n", "machine"]
#: CPUs of the served runs (the development machine's two).
CPUS = 2
#: A job that reaches its target in seconds of training (the service's end-to-end test's).
QUICK_JOB = {"kind": "synth-regress", "replicas": 1, "batch_size": 32,
             "spec": {"target": 0.3, "eval_every": 20, "config": {"samples": 20_000, "width": 64}}}
#: A job cheap to check that never reaches its (MSE) target: it stays queued or trains until cancelled.
ENDLESS_JOB = {"kind": "synth-regress", "replicas": 1, "batch_size": 32,
               "spec": {"target": 1e-9, "config": {"samples": 20_000, "width": 64}}}
#: Jobs that train for minutes: the background load of the concurrent submissions.
TRAINING_JOB = {"kind": "digits-cnn", "replicas": 1, "batch_size": 32, "spec": {"target": 0.999, "eval_every": 50}}
#: Real jobs of mixed kinds, 20-60 s of training each on 2 CPUs (``tests/e2e/test_kills.py``'s workload).
KILL_JOBS = [
    {"kind": "digits-cnn", "replicas": 1, "batch_size": 64, "spec": {"target": 0.97}},
    {"kind": "synth-regress", "replicas": 2, "batch_size": 64,
     "spec": {"target": 0.13, "config": {"samples": 20000, "width": 64}}},
    {"kind": "stdlib-charlm", "replicas": 1, "batch_size": 128, "spec": {"target": 1.95}},
    {"kind": "ratings-mf", "replicas": 1, "batch_size": 512, "spec": {"target": 0.60, "config": {"lr": 5e-4}}},
    {"kind": "synth-regress", "replicas": 1, "batch_size": 32,
     "spec": {"target": 0.2, "config": {"samples": 20000, "width": 64}}},
    {"kind": "digits-cnn", "replicas": 1, "batch_size": 32, "spec": {"target": 0.95}},
]
#: Seconds a server gets to answer /healthz, a job to start, and a job or the kill run's jobs to end.
SERVER_START_S, JOB_START_S, JOB_END_S, KILLED_RUN_END_S = 60.0, 120.0, 300.0, 600.0
#: Seconds between polls of a job's state while timing its start (the resolution of the wait, not of the time).
POLL_S = 0.05
#: Slack on the bound of steps repeated after a kill, seconds (a step and a checkpoint; as tests/e2e/test_kills.py).
REPEAT_SLACK_S = 3.0
#: Seed of the kill schedule.
SEED = 20211
#: Steps (of all jobs together) to see after a restart before the next kill, and the most seconds to wait for
#: them (a restarted job's workers take seconds to start: a kill before then would land on no training).
STEPS_BETWEEN_KILLS, TRAINING_WAIT_S = 20, 30.0


@dataclass(frozen=True)
class Sizes:
    """How much of each measurement a run does (the full run and ``--quick``)."""

    first_replica_jobs: int  # measurement 1: jobs timed one after another
    clients: int  # measurement 2: concurrent submitting clients ...
    per_client: int  # ... and the submissions of each ...
    bursts: int  # ... in each of these bursts (a fresh server each)
    queued_jobs: int  # measurement 3: jobs in the queue
    rounds: int  # measurement 3: rounds timed in each of the two runs (after the first)
    round_interval_s: float  # measurement 3: seconds between rounds
    kills: int  # measurement 4: SIGKILLs of the server
    kill_jobs: int  # measurement 4: jobs submitted before the first kill ...
    in_flight: int  # ... and submitted at the moment of a kill
    kill_pause_s: tuple[float, float]  # measurement 4: range of the random wait before a kill once jobs train, s


FULL = Sizes(10, 8, 25, 5, 1000, 5, 3.0, 20, 4, 2, (0.5, 3.0))
QUICK = Sizes(3, 8, 3, 1, 200, 3, 2.0, 3, 1, 1, (0.5, 3.0))


def row(target: str, metric: str, value: float, unit: str, limit: float | None = None, *, at_most: bool = True,
        n: int) -> dict:
    """One CSV row; ``passed`` is empty for a figure without a limit."""
    passed = "" if limit is None else (value <= limit if at_most else value >= limit)
    return {"target": target, "metric": metric, "value": float(value), "unit": unit,
            "limit": "" if limit is None else limit, "passed": passed, "n": n, "machine": machine_name()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ``pollux-opt serve`` subprocess on ``state`` (its own process group:
    a SIGKILL of the group ends the server; its worker pool, detached by
    setsid, ends by its watchdog), on one port for its life."""

    def __init__(self, state: Path, *, interval: float) -> None:
        self.state, self.port, self.interval, self.proc = Path(state), free_port(), interval, None
        self.url = f"http://127.0.0.1:{self.port}/api/v1"
        self.log_path = self.state.parent / f"{self.state.name}-server.log"

    def start(self) -> "Server":
        cmd = [sys.executable, "-m", "pollux_opt", "serve", "--state", str(self.state), "--port", str(self.port),
               "--cpus", str(CPUS), "--interval", str(self.interval)]
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.url.replace("/api/v1", "/healthz"), timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not answer within {SERVER_START_S} s; see {self.log_path}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` (SIGKILL: to the whole process group); the server's exit status."""
        if sig == signal.SIGKILL:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        status = self.proc.wait(timeout=120)
        if sig != signal.SIGKILL and status not in (0, 128 + sig):
            log.warning("the server exited with status %d on %s: see %s", status, signal.Signals(sig).name,
                        self.log_path)
        return status

    def submit(self, job: dict, key: str | None = None) -> str:
        headers = {} if key is None else {"Idempotency-Key": key}
        answer = httpx.post(f"{self.url}/jobs", json=job, headers=headers, timeout=30.0)
        answer.raise_for_status()
        return answer.json()["id"]

    def job(self, job_id: str) -> dict:
        return httpx.get(f"{self.url}/jobs/{job_id}", timeout=10.0).json()

    def wait(self, job_id: str, done, limit: float, poll: float = 0.5) -> dict:
        """The job once ``done(job)`` holds (RuntimeError after ``limit`` seconds)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if done(job):
                return job
            time.sleep(poll)
        raise RuntimeError(f"job {job_id} not done within {limit} s: state {self.job(job_id)['state']}")


def _ended(job: dict) -> bool:
    return JobState(job["state"]).terminal


def first_replica(out: Path, sizes: Sizes) -> list[dict]:
    """Measurement 1: seconds from a submission to its ``running`` transition, jobs one after another."""
    server = Server(out / "first-replica", interval=30.0).start()
    seconds = []
    try:
        for i in range(sizes.first_replica_jobs):
            t0 = time.time()
            job_id = server.submit(QUICK_JOB)
            job = server.wait(job_id, lambda j: any(m["new"] == "running" for m in j["transitions"]), JOB_START_S,
                              POLL_S)
            seconds.append(next(m["t"] for m in job["transitions"] if m["new"] == "running") - t0)
            log.info("job %d: running %.3f s after its POST", i + 1, seconds[-1])
            server.wait(job_id, _ended, JOB_END_S)
    finally:
        server.stop()
    target, n = "submit to first replica", len(seconds)
    return [row(target, "median", statistics.median(seconds), "s", 1.0, n=n),
            row(target, "max", max(seconds), "s", n=n),
            row(target, "first (fresh server)", seconds[0], "s", n=1),
            row(target, "median of the others", statistics.median(seconds[1:] or seconds), "s", n=max(n - 1, 1))]


def _poll_latencies(url: str, stop, ready, out) -> None:
    """GET ``/api/v1/jobs`` and ``/healthz`` in turn until ``stop`` is set; puts
    ``[(path, start, ms)]`` on ``out``.  Its own process, as a watching client is:
    the submitting threads' interpreter lock is not in its times."""
    paths, latencies = (f"{url}/jobs", url.replace("/api/v1", "/healthz")), []
    with httpx.Client(timeout=30.0) as client:
        ready.set()
        while not stop.is_set():
            path = paths[len(latencies) % 2]
            t0 = time.perf_counter()
            try:
                client.get(path).raise_for_status()
            except httpx.HTTPError as exc:
                log.warning("GET %s failed: %s", path, exc)
                continue
            latencies.append((path, t0, 1000 * (time.perf_counter() - t0)))
    out.put(latencies)


def _burst(state: Path, sizes: Sizes) -> tuple[float, int, int, list[float], list[float]]:
    """One burst of submissions on a fresh server while two jobs train: its
    seconds, the acknowledged and lost jobs, and the latencies (ms) of ``GET
    /api/v1/jobs`` and of ``GET /healthz`` polled during it."""
    server = Server(state, interval=30.0).start()
    context = multiprocessing.get_context("spawn")
    stop, ready, results = context.Event(), context.Event(), context.Queue()
    acked: list[str] = []
    refused: list = []

    def submitter() -> None:
        with httpx.Client(timeout=30.0) as client:
            for _ in range(sizes.per_client):
                try:
                    answer = client.post(f"{server.url}/jobs", json=ENDLESS_JOB)
                except httpx.HTTPError as exc:  # not acknowledged: counted as refused
                    refused.append(type(exc).__name__)
                    continue
                acked.append(answer.json()["id"]) if answer.status_code == 201 else refused.append(answer.status_code)

    try:
        for training in [server.submit(TRAINING_JOB) for _ in range(2)]:
            server.wait(training, lambda j: j["state"] == "running", JOB_START_S)
        watcher = context.Process(target=_poll_latencies, args=(server.url, stop, ready, results))
        watcher.start()
        ready.wait(SERVER_START_S)
        clients = [threading.Thread(target=submitter) for _ in range(sizes.clients)]
        t0 = time.perf_counter()
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        t1 = time.perf_counter()
        stop.set()
        polled = results.get(timeout=SERVER_START_S)
        watcher.join()
        listed = {j["id"] for j in httpx.get(f"{server.url}/jobs", timeout=30.0).json()}
    finally:
        server.stop()
        shutil.rmtree(server.state, ignore_errors=True)
    lost = len(set(acked) - listed)
    jobs, floor = ([ms for path, start, ms in polled if path.endswith(end) and t0 <= start <= t1]
                   for end in ("/jobs", "/healthz"))
    log.info("%d submissions accepted in %.2f s (refused: %s), %d lost; GET /jobs %d times", len(acked), t1 - t0,
             refused, lost, len(jobs))
    return t1 - t0, len(acked), lost, jobs, floor


def concurrent_submissions(out: Path, sizes: Sizes) -> list[dict]:
    """Measurement 2: clients submitting at once while two jobs train, and
    ``GET /api/v1/jobs`` meanwhile (with ``GET /healthz``, a route that does no
    work, as the floor of the machine under the same load), over ``sizes.bursts``
    bursts on fresh servers (the latencies pooled)."""
    bursts = [_burst(out / f"concurrent-{i}", sizes) for i in range(sizes.bursts)]
    wanted = sizes.clients * sizes.per_client
    jobs, floor = [ms for b in bursts for ms in b[3]], [ms for b in bursts for ms in b[4]]
    target, p, n = f"{wanted} submissions from {sizes.clients} concurrent clients", np.percentile, len(bursts)
    return [row(target, "all submitted (slowest burst)", max(b[0] for b in bursts), "s", 10.0, n=n),
            row(target, "accepted (fewest of a burst)", min(b[1] for b in bursts), "jobs", wanted, at_most=False,
                n=n),
            row(target, "lost", sum(b[2] for b in bursts), "jobs", 0, n=sum(b[1] for b in bursts)),
            row(target, "GET /api/v1/jobs p50", p(jobs, 50), "ms", n=len(jobs)),
            row(target, "GET /api/v1/jobs p99", p(jobs, 99), "ms", 50.0, n=len(jobs)),
            row(target, "GET /healthz p50 (floor)", p(floor, 50), "ms", n=len(floor)),
            row(target, "GET /healthz p99 (floor)", p(floor, 99), "ms", n=len(floor))]


class HoldingJob:
    """An in-process stand-in for a training job (a
    :class:`~pollux_opt.backends.local.handle.JobHandle`) that never trains: it
    holds the placement it is given, with a fixed throughput model and gradient
    statistics so that pollux has something to allocate by."""

    #: The (re)start time it reports, seconds (the scheduler's restart penalty; nothing waits for it).
    START_S = 1.0

    def __init__(self, spec, workdir, job_id, options, pool) -> None:
        self.spec, self.job_id, self.state = spec, job_id, JobState.QUEUED
        self.placement: dict[str, int] = {}
        self.events: list = []
        self.start_times: list[float] = []

    @staticmethod
    def opener(workdir, pool):
        raise InvalidProblem(f"workdir {str(workdir)!r}: a stand-in job keeps no state to reopen")

    def start(self, replicas, num_nodes=None, **placement_options) -> None:
        from pollux_opt.runtime.report import Event

        if self.state.terminal:
            raise InvalidProblem(f"job {self.job_id!r} has ended ({self.state.value})")
        kind = "started" if self.state is JobState.QUEUED else "rescaled"
        self.placement, self.state = {n: int(k) for n, k in replicas.items() if k}, JobState.RUNNING
        self.start_times.append(self.START_S)
        self.events.append(Event(time.time(), kind, {"seconds": self.START_S, "placement": dict(self.placement)}))

    def stop(self) -> None:
        from pollux_opt.runtime.report import Event

        if self.state.holds_workers:
            self.state, self.placement = JobState.QUEUED, {}
            self.events.append(Event(time.time(), "stopped", {"reason": "request"}))

    def cancel(self) -> None:
        if self.state.terminal:
            raise InvalidProblem(f"job {self.job_id!r} has ended ({self.state.value})")
        self.state, self.placement = JobState.CANCELLED, {}

    def poll(self) -> JobState:
        return self.state

    def wait(self, timeout=None):
        return self.report()

    def close(self) -> None:
        pass

    def report(self):
        from pollux_opt.model import GradientStats, ThroughputParams
        from pollux_opt.runtime.report import JobReport, Measurements

        k = sum(self.placement.values())
        return JobReport(
            job_id=self.job_id, kind="holding", state=self.state, step=0, progress=0.0, samples=0, epoch=0.0,
            metric_name="accuracy", target=0.9, higher_is_better=True, metric=None, final_metric=None,
            placement=dict(self.placement), num_replicas=k, num_nodes=len(self.placement), local_bsz=32,
            accum_steps=0, batch_size=32 * k, fixed_batch_size=None, measurements=Measurements.from_profile({}),
            throughput_params=ThroughputParams(0.01, 0.001, 0.001, 0.0, 0.01, 0.0, 1.0),
            grad_stats=GradientStats(1.0, 10.0, 32), limits=self.spec.limits(), restart_delay=self.START_S,
            rescale_times=(), start_times=tuple(self.start_times), num_restarts=0, age=0.0, worker_pids=(),
            error=None, events=tuple(self.events), verifying=False)


def _stop_after_rounds(run_dir: Path, rounds: int) -> threading.Thread:
    """A thread that sends this process SIGINT once ``run_dir``'s log has ``rounds`` allocation events."""
    def watch() -> None:
        while len(_allocations(run_dir)) < rounds:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _allocations(run_dir: Path) -> list[dict]:
    """The ``allocation`` events of ``run_dir``'s log."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if '"allocation"' in line]
    return [e for e in events if e["type"] == "allocation"]


def queued_rounds(out: Path, sizes: Sizes) -> list[dict]:
    """Measurement 3: rounds with many queued jobs, served and as a closed workload (this process)."""
    from pollux_opt import Cluster
    from pollux_opt.backends.local import run_workload
    from pollux_opt.backends.local.run import RunInterrupted
    from pollux_opt.service.db import DB_FILE, Store
    from pollux_opt.service.server import Service
    from pollux_opt.workloads.job import Workload, WorkloadJob

    jobs = [WorkloadJob(f"q{i}", ENDLESS_JOB["kind"], 0.0, 1, 32, spec=ENDLESS_JOB["spec"])
            for i in range(sizes.queued_jobs)]
    kwargs = {"cluster": Cluster.uniform(16, 4), "interval": sizes.round_interval_s, "pin_cpus": False,
              "progress": False, "backend_kwargs": {"job_factory": HoldingJob, "job_opener": HoldingJob.opener}}
    means, counts = {}, {}
    for mode in ("service", "closed"):
        run_dir = out / f"queued-{mode}"
        run_dir.mkdir(parents=True)
        if mode == "service":  # the queue filled before the service starts: all arrive at 0, as in the closed run
            store = Store(run_dir / DB_FILE)
            for job in jobs:
                fields = job.to_json()
                del fields["id"], fields["arrival_s"]
                store.submit(fields, None)
            store.close()
            call = {"service": Service(host="127.0.0.1", port=free_port(), token=None)}
        else:
            call = {"workload": Workload(f"queued-{len(jobs)}", tuple(jobs))}
        _stop_after_rounds(run_dir, sizes.rounds + 1)
        try:
            run_workload(run_dir, policy="pollux", **call, **kwargs)
        except RunInterrupted:
            pass
        rounds = _allocations(run_dir)[1:]  # the first round starts every job it places: left out
        counts[mode] = len(rounds)
        means[mode] = {k: statistics.fmean(e[k] for e in rounds) for k in ("solver_s", "overhead_s")}
        log.info("%s run, %d jobs: %d rounds after the first, mean decision %.3f s, mean round %.3f s", mode,
                 len(jobs), len(rounds), means[mode]["solver_s"], means[mode]["overhead_s"])
    target, n = f"{len(jobs)} queued jobs", min(counts.values())
    out_rows = []
    for key, what in (("solver_s", "decision"), ("overhead_s", "whole round")):
        out_rows += [row(target, f"{what}, service", means["service"][key], "s", n=n),
                     row(target, f"{what}, closed workload", means["closed"][key], "s", n=n),
                     row(target, f"{what}, service / closed", means["service"][key] / means["closed"][key], "x",
                         1.10, n=n)]
    return out_rows


def _steps(workdir: Path) -> list[dict]:
    """Rank 0's rows of a job's ``steps.csv`` in append order (a row torn by a kill is left out)."""
    rows = []
    path = workdir / STEPS_FILE
    if path.exists():
        with open(path, newline="") as fh:
            for r in csv.reader(fh):
                try:
                    if len(r) == len(STEP_COLUMNS) and r[0] != "generation":
                        rows.append({"generation": int(r[0]), "step": int(r[1]), "time": float(r[2])})
                except ValueError:
                    continue
    return rows


def _wait_for_training(state: Path) -> None:
    """Wait until the jobs of ``state`` have logged STEPS_BETWEEN_KILLS more steps (at most TRAINING_WAIT_S)."""
    def total() -> int:
        return sum(len(_steps(d)) for d in (state / "jobs").glob("*"))

    start, deadline = total(), time.monotonic() + TRAINING_WAIT_S
    while total() < start + STEPS_BETWEEN_KILLS and time.monotonic() < deadline:
        time.sleep(0.5)


def repeated_steps(workdir: Path, kills: list[float]) -> tuple[int, int, int]:
    """(steps repeated after a kill, of them beyond the bound, steps repeated where no kill explains it).

    A SIGKILL of the server's group kills every rank 0 too: the job may repeat
    the steps since its last checkpoint (at most ``checkpoint_interval_s`` of
    training); a rescale or a stop repeats none."""
    rows, segments = _steps(workdir), []
    for r in rows:
        last = segments[-1][-1] if segments else None
        if last is None or r["generation"] != last["generation"] or r["step"] != last["step"] + 1:
            segments.append([])
        segments[-1].append(r)
    after_kill = beyond = unexplained = 0
    interval = RuntimeOptions().checkpoint_interval_s
    for old, new in zip(segments, segments[1:]):
        repeated = old[-1]["step"] - (new[0]["step"] - 1)
        if repeated <= 0:
            continue
        if not any(old[-1]["time"] - 1.0 <= t <= new[0]["time"] for t in kills):
            unexplained += repeated
            continue
        after_kill += repeated
        since = next((r["time"] for r in old if r["step"] == new[0]["step"] - 1), old[0]["time"])
        beyond += repeated if old[-1]["time"] - since > interval + REPEAT_SLACK_S else 0
    return after_kill, beyond, unexplained


def server_kills(out: Path, sizes: Sizes) -> list[dict]:
    """Measurement 4: SIGKILLs of the server's process group, restarted at once on the same state."""
    rng = random.Random(SEED)
    server = Server(out / "kills", interval=5.0).start()
    acked = [server.submit(job) for job in KILL_JOBS[:sizes.kill_jobs]]
    in_flight_at = set(rng.sample(range(sizes.kills), sizes.in_flight))
    pending = list(KILL_JOBS[sizes.kill_jobs:sizes.kill_jobs + sizes.in_flight])
    submitters, retried, kill_times = [], [], []

    def submit_until_acknowledged(job: dict) -> None:
        key, tries, deadline = uuid.uuid4().hex, 0, time.monotonic() + SERVER_START_S * 2
        while True:
            tries += 1
            try:
                acked.append(server.submit(job, key))
                retried.append(tries > 1)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    for k in range(sizes.kills):
        _wait_for_training(server.state)
        time.sleep(rng.uniform(*sizes.kill_pause_s))
        if k in in_flight_at and pending:
            submitters.append(threading.Thread(target=submit_until_acknowledged, args=(pending.pop(0),)))
            submitters[-1].start()
            time.sleep(rng.uniform(0.0, 0.05))
        kill_times.append(time.time())
        server.stop(signal.SIGKILL)
        log.info("kill %d of %d at %.0f s", k + 1, sizes.kills, kill_times[-1] - kill_times[0])
        server.start()
    for t in submitters:
        t.join()
    deadline = time.monotonic() + KILLED_RUN_END_S
    while not all(_ended(server.job(j)) for j in acked) and time.monotonic() < deadline:
        time.sleep(2.0)
    final = {j["id"]: j for j in httpx.get(f"{server.url}/jobs", timeout=30.0).json()}
    server.stop()
    events = [json.loads(line) for line in (server.state / "events.jsonl").read_text().splitlines() if line]
    lost = [j for j in acked if j not in final or final[j]["state"] != "succeeded" or not final[j]["verified"]]
    twice = [j for j in acked if max(sum(e["job_id"] == j and e["type"] == t for e in events)
                                     for t in ("submit", "complete")) > 1]
    steps = [repeated_steps(server.state / "jobs" / j, kill_times) for j in acked]
    after_kill, beyond, unexplained = (sum(s[i] for s in steps) for i in range(3))
    log.info("jobs %s: lost %s, run twice %s; in-flight submissions retried: %s; steps repeated after kills %d "
             "(%d beyond the bound), elsewhere %d", acked, lost, twice, retried, after_kill, beyond, unexplained)
    target, n = f"{sizes.kills} SIGKILLs of the server", len(acked)
    return [row(target, "jobs lost", len(lost), "jobs", 0, n=n),
            row(target, "jobs run twice", len(twice), "jobs", 0, n=n),
            row(target, "steps lost beyond the bound", beyond + unexplained, "steps", 0, n=n),
            row(target, "steps repeated after kills (within the bound)", after_kill - beyond, "steps", n=n),
            row(target, "in-flight submissions retried", sum(retried), "submissions", n=len(retried))]


MEASUREMENTS = {"first-replica": first_replica, "concurrent": concurrent_submissions, "queued": queued_rounds,
                "kills": server_kills}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="folder of the scratch state directories (default: a temporary one)")
    parser.add_argument("--csv", type=Path, help=f"CSV to write (default {RESULTS / 'service.csv'}, or "
                                                 f"service_quick.csv with --quick)")
    parser.add_argument("--quick", action="store_true", help="a smoke run with small counts")
    parser.add_argument("--only", choices=list(MEASUREMENTS), action="append",
                        help="run only this measurement (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "pollux_opt"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sizes = QUICK if args.quick else FULL
    target = args.csv or RESULTS / ("service_quick.csv" if args.quick else "service.csv")
    with tempfile.TemporaryDirectory(prefix="service-targets-") as tmp:
        out = (args.out or Path(tmp)) / time.strftime("service-targets-%Y%m%d-%H%M%S")
        out.mkdir(parents=True)
        rows = []
        for name in args.only or MEASUREMENTS:
            t0 = time.monotonic()
            rows += MEASUREMENTS[name](out, sizes)
            log.info("%s: %.0f s", name, time.monotonic() - t0)
    import pandas as pd

    df = pd.DataFrame(rows, columns=COLUMNS)
    atomic_write_csv(target, df)
    print(df.drop(columns="machine").to_string(index=False))
    print(f"wrote {target}")
    return 0 if all(p != False for p in df.passed) else 1  # noqa: E712 (empty: no limit)


if __name__ == "__main__":
    sys.exit(main())
