"""Stand-ins shared by the tests of several folders, given to tests as fixtures:
in-process jobs on a fake clock for the real backend (``fake_jobs``) and the
repository's experiment scripts as modules (``experiment``)."""

from __future__ import annotations

import importlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.backends.local import JobHandle
from pollux_opt.model import GradientStats, ThroughputParams
from pollux_opt.lifecycle import JobState
from pollux_opt.runtime.report import Event, JobReport, Measurements
from pollux_opt.workloads import WorkloadJob

#: The repository's experiment scripts (run as ``python experiments/NAME.py``).
EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
#: Epoch seconds at which a fake clock starts.
FAKE_START_T = 1_000_000.0


class FakeClock:
    """Wall-clock seconds that move only when the backend sleeps."""

    def __init__(self, t: float = FAKE_START_T) -> None:
        self.start = self.t = t

    def time(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


#: Progress (M0-iterations) each fake job needs; a replica makes 1 per second.
FAKE_WORK = 30.0
#: Seconds a fake (re)start, rescale and verification take.
FAKE_START_S, FAKE_RESCALE_S, FAKE_VERIFY_S = 2.0, 1.0, 1.0
#: Progress between fake checkpoints.
FAKE_CKPT_EVERY = 5.0


class FakeJob(JobHandle):
    """In-process stand-in for ElasticJob (a :class:`JobHandle`): progress at one unit per replica-second,
    persisted in ``fake.json`` at each checkpoint (resume restarts from it).
    Jobs whose id starts with ``bad`` fail after 3 s of training."""

    def __init__(self, spec, workdir, job_id, options, pool, clock: FakeClock, *, saved: dict | None = None):
        self.spec, self.workdir, self.job_id, self.options, self.clock = spec, Path(workdir), job_id, options, clock
        self.workdir.mkdir(parents=True, exist_ok=True)
        s = saved or {}
        self.state = JobState(s.get("state", JobState.QUEUED))
        if self.state.holds_workers:
            self.state = JobState.QUEUED  # the controller went away
        self.verifying = False
        self.progress = s.get("progress", 0.0)
        self.events: list[Event] = [Event(**e) for e in s.get("events", [])]
        self.final_metric = s.get("final_metric")
        self.start_times: list[float] = s.get("start_times", [])
        self.rescale_times: list[float] = s.get("rescale_times", [])
        self.placement: dict[str, int] = {}
        self.until = self.last = 0.0
        self.kind = ""
        self.trained = 0.0
        self.closed = False
        if saved is None:
            self._persist()

    @classmethod
    def opener(cls, clock):
        def open_(workdir, pool):
            path = Path(workdir) / "fake.json"
            if not path.exists():
                raise InvalidProblem("no job")
            saved = json.loads(path.read_text())
            return cls(None, workdir, saved["job_id"], None, pool, clock, saved=saved)
        return open_

    def _persist(self) -> None:
        ckpt = math.floor(self.progress / FAKE_CKPT_EVERY) * FAKE_CKPT_EVERY
        progress = self.progress if self.state is JobState.SUCCEEDED else ckpt
        data = {"job_id": self.job_id, "state": self.state.value, "progress": progress,
                "final_metric": self.final_metric, "start_times": self.start_times,
                "rescale_times": self.rescale_times,
                "events": [{"time": e.time, "kind": e.kind, "details": dict(e.details)} for e in self.events]}
        (self.workdir / "fake.json").write_text(json.dumps(data))

    def _record(self, t, kind, **details):
        self.events.append(Event(t, kind, details))
        self._persist()

    def _update(self) -> None:
        now = self.clock.time()
        if self.state is JobState.RESCALING and now >= self.until:
            seconds = self.until - self.t0
            (self.start_times if self.kind == "start" else self.rescale_times).append(seconds)
            self.state, self.last = JobState.RUNNING, self.until
            self._record(self.until, "started" if self.kind == "start" else "rescaled", seconds=seconds,
                         placement=self.placement)
        if self.state is JobState.RUNNING and not self.verifying:
            k = sum(self.placement.values())
            dt = now - self.last
            if self.job_id.startswith("bad") and self.trained + dt >= 3.0:
                self.state, self.error = JobState.FAILED, "rank 0: boom"
                self._record(now, "failed", error="boom")
                return
            before = self.progress
            self.progress += k * dt
            self.trained += dt
            self.last = now
            if math.floor(self.progress / FAKE_CKPT_EVERY) > math.floor(before / FAKE_CKPT_EVERY):
                self._persist()
            if self.progress >= FAKE_WORK:
                t_hit = now - (self.progress - FAKE_WORK) / k
                self.progress = FAKE_WORK
                self.verifying, self.until, self.placement = True, t_hit + FAKE_VERIFY_S, {}
                self._record(t_hit, "target_reached", metric=0.99, step=int(FAKE_WORK))
        if self.verifying and now >= self.until:
            self.state, self.final_metric, self.verifying = JobState.SUCCEEDED, 0.99, False
            self._record(self.until, "verified", metric=0.99, reached=True)

    def start(self, replicas, num_nodes=None, *, cpus=None, local_bsz=None, accum_steps=None, node_types=None,
              cgroups=None, gpus=None):
        self._update()
        if self.state is JobState.QUEUED:
            self._go(dict(replicas), "start", FAKE_START_S)
        elif self.state.holds_workers and dict(replicas) == self.placement:
            pass  # only the batch changes: applied without a restart, as ElasticJob does
        else:
            self._go(dict(replicas), "rescale", FAKE_RESCALE_S)

    def _go(self, placement, kind, seconds):
        if self.state.terminal:
            raise InvalidProblem(f"job {self.job_id!r} has ended ({self.state.value})")
        self.t0 = self.clock.time()
        self.placement, self.kind, self.state, self.until = placement, kind, JobState.RESCALING, self.t0 + seconds
        self._persist()

    def stop(self):
        self._update()
        if self.state.holds_workers and not self.verifying:
            self.state, self.placement = JobState.QUEUED, {}
            self._record(self.clock.time(), "stopped", reason="request")

    def cancel(self):
        self._update()
        if self.state.terminal:
            raise InvalidProblem(f"job {self.job_id!r} has ended ({self.state.value})")
        if not self.verifying:
            self.state, self.placement = JobState.CANCELLED, {}
            self._record(self.clock.time(), "cancelled", reason="request")

    def poll(self) -> JobState:
        self._update()
        return self.state

    def wait(self, timeout=None):
        return self.report()

    def close(self):
        self.closed = True

    def report(self) -> JobReport:
        self._update()
        spec = self.spec or WorkloadJob("x", "digits-cnn", 0.0, 1, 32).job_spec()
        running = self.state.holds_workers
        k = sum(self.placement.values()) if running else 0
        return JobReport(
            job_id=self.job_id, kind="fake", state=self.state, step=int(self.progress),
            progress=self.progress, samples=int(self.progress * 32), epoch=math.nan, metric_name="accuracy",
            target=0.9, higher_is_better=True, metric=None, final_metric=self.final_metric,
            placement=dict(self.placement) if running else {}, num_replicas=k, num_nodes=len(self.placement),
            local_bsz=32, accum_steps=0, batch_size=32 * k, fixed_batch_size=None,
            measurements=Measurements.from_profile({}),
            throughput_params=ThroughputParams(0.01, 0.001, 0.001, 0.0, 0.01, 0.0, 1.0) if self.start_times else None,
            grad_stats=GradientStats(1.0, 10.0, 32) if self.start_times else None, limits=spec.limits(),
            restart_delay=None, rescale_times=tuple(self.rescale_times), start_times=tuple(self.start_times),
            num_restarts=0, age=0.0, worker_pids=(), error=getattr(self, "error", None), events=tuple(self.events),
            verifying=self.verifying,
        )


@dataclass(frozen=True)
class FakeJobs:
    """The real backend's jobs replaced by :class:`FakeJob` on a :class:`FakeClock`;
    the durations are the fake jobs' (seconds, and progress in M0-iterations)."""

    job_class: type = FakeJob
    work: float = FAKE_WORK
    start_s: float = FAKE_START_S
    verify_s: float = FAKE_VERIFY_S

    @staticmethod
    def clock() -> FakeClock:
        """A new clock at :data:`FAKE_START_T`."""
        return FakeClock()

    def backend_kwargs(self, clock: FakeClock) -> dict:
        """``backend_kwargs`` of ``run_workload`` that start and reopen fake jobs and time the run on ``clock``."""
        job_class = self.job_class
        return {
            "job_factory": lambda spec, workdir, job_id, options, pool: job_class(spec, workdir, job_id, options,
                                                                                  pool, clock),
            "job_opener": job_class.opener(clock), "clock": clock.time, "sleep": clock.sleep,
        }


@pytest.fixture
def fake_jobs() -> FakeJobs:
    """In-process stand-ins for the elastic jobs of the real backend (see :class:`FakeJobs`)."""
    return FakeJobs()


@pytest.fixture
def experiment():
    """``load(name)``: the experiment script ``experiments/NAME.py`` as a module, imported
    with its folder on ``sys.path`` as when it is run (the scripts import their siblings)."""
    folder = str(EXPERIMENTS)
    sys.path.insert(0, folder)

    def load(name: str) -> ModuleType:
        return importlib.import_module(name)

    yield load
    sys.path.remove(folder)


# ------------------------------------------------------------ a served state
#: Seconds a ``pollux-opt serve`` subprocess gets to answer, and a job to end.
SERVER_START_S, SERVER_JOB_S = 60.0, 300.0


class ServerProcess:
    """A ``pollux-opt serve`` subprocess on ``state`` and a free port (its own
    process group: a SIGKILL ends the server and its helpers; its worker pool,
    detached by setsid, ends by its watchdog within seconds); ``args`` are
    extra command-line arguments (e.g. ``--backend ray``)."""

    def __init__(self, state: Path, port: int | None = None, args: tuple[str, ...] = ()) -> None:
        import os
        import socket

        if port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        self.state, self.port, self.proc = Path(state), port, None
        self.args = args or ("--cpus", str(min(2, os.cpu_count() or 1)))
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = self.state.parent / f"{self.state.name}-server.log"

    def start(self) -> "ServerProcess":
        import subprocess
        import time

        import httpx

        cmd = [sys.executable, "-m", "pollux_opt", "serve", "--state", str(self.state), "--port", str(self.port),
               "--interval", "5", *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited with {self.proc.returncode}: {self.log()}"
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server did not answer within {SERVER_START_S} s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def kill(self, sig: int) -> int:
        """Send ``sig`` (SIGKILL: to the whole process group); the server's exit status."""
        import os
        import signal

        if sig == signal.SIGKILL:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=120)

    def submit(self, job: dict) -> str:
        import httpx

        answer = httpx.post(f"{self.url}/api/v1/jobs", json=job, timeout=30.0)
        assert answer.status_code in (200, 201), answer.text
        return answer.json()["id"]

    def job(self, job_id: str) -> dict:
        import httpx

        return httpx.get(f"{self.url}/api/v1/jobs/{job_id}", timeout=10.0).json()

    def wait_state(self, job_id: str, states: set[str], limit: float = SERVER_JOB_S) -> dict:
        """The job once its state is one of ``states`` (AssertionError after ``limit`` seconds)."""
        import time

        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not in {states} within {limit} s: {self.job(job_id)}\n{self.log()}")


@pytest.fixture
def serve_process():
    """``start(state, port=None, args=())``: a :class:`ServerProcess` (not yet started); every one
    still running at the test's end is stopped with SIGKILL."""
    import signal

    made: list[ServerProcess] = []

    def make(state, port=None, args=()):
        made.append(ServerProcess(state, port, tuple(args)))
        return made[-1]

    yield make
    for server in made:
        if server.proc is not None and server.proc.poll() is None:
            server.kill(signal.SIGKILL)
