"""The real backend over an open job source (the service's queue): jobs that
arrive while it runs, cancel and weight requests applied once each, also
across a restart, on in-process stand-ins for the elastic jobs."""

from __future__ import annotations

from pollux_opt import Cluster
from pollux_opt.backends.local import RealBackend
from pollux_opt.lifecycle import JobState
from pollux_opt.records.events import EventLog, read_events
from pollux_opt.records.replay import replay
from pollux_opt.scheduling.loop import run
from pollux_opt.scheduling.policies import make_policy
from pollux_opt.workloads import Workload, WorkloadJob
from pollux_opt.workloads.source import ClosedSource, JobSource, Request


class ScriptedQueue:
    """An open source on the fake clock: ``jobs`` and ``requests`` become visible at their times."""

    name = "queue"
    closed = False

    def __init__(self, clock, jobs: dict[float, WorkloadJob], requests: dict[float, Request]) -> None:
        self.clock, self.t0 = clock, clock.time()
        self.jobs, self.reqs = dict(jobs), dict(requests)
        self.given: set[str] = set()

    def _due(self, table):
        now = self.clock.time() - self.t0
        return [x for t, x in sorted(table.items()) if t <= now]

    def new_jobs(self):
        out = [j for j in self._due(self.jobs) if j.id not in self.given]
        self.given.update(j.id for j in out)
        return out

    def requests(self, after):
        return [r for r in self._due(self.reqs) if r.seq > after]

    def wait(self, seconds):
        self.clock.sleep(seconds)


def _job(job_id: str, arrival: float = 0.0) -> WorkloadJob:
    return WorkloadJob(job_id, "digits-cnn", arrival, 1, 32)


def _backend(tmp_path, source, fake_jobs, clock, **kwargs):
    events = EventLog(tmp_path / "events.jsonl")
    return RealBackend(tmp_path, source, Cluster.uniform(1, 4), events, fixed_batch=False,
                       started_unix=clock.start, pin_cpus=False, **fake_jobs.backend_kwargs(clock), **kwargs), events


def test_an_open_queue_and_a_workload_are_job_sources(fake_jobs):
    assert isinstance(ScriptedQueue(fake_jobs.clock(), {}, {}), JobSource)
    assert isinstance(ClosedSource(Workload("w", (_job("a"),))), JobSource)


def test_jobs_arriving_while_it_runs_start_and_requests_apply_once(tmp_path, fake_jobs):
    clock = fake_jobs.clock()
    queue = ScriptedQueue(clock, {0.0: _job("a"), 6.0: _job("b", 6.0)},
                          {8.0: Request(1, "a", "cancel"), 9.0: Request(2, "b", "weight", weight=3.0)})
    backend, events = _backend(tmp_path, queue, fake_jobs, clock)
    try:
        run(backend, make_policy("pollux"), backend.cluster, events, interval=2.0, max_rounds=60)
    finally:
        backend.close(graceful=False)
        events.close()
    assert not backend.finished()  # an open source never ends the run
    logged = read_events(tmp_path / "events.jsonl")
    jobs = replay(logged)
    assert jobs["a"].state is JobState.CANCELLED and jobs["b"].state is JobState.SUCCEEDED
    assert jobs["b"].weight == 3.0
    kinds = [(e["type"], e.get("request")) for e in logged if e["type"] in ("cancel", "weight")]
    assert kinds == [("cancel", 1), ("weight", 2)]
    cancel_t = next(e["t"] for e in logged if e["type"] == "cancel")
    assert all("a" not in e["placement"] for e in logged if e["type"] == "allocation" and e["t"] > cancel_t)
    b_submit = next(e["t"] for e in logged if e["type"] == "submit" and e["job_id"] == "b")
    assert 6.0 <= b_submit < 8.0  # submitted at the first poll after it was queued


def test_a_restart_applies_no_request_twice_and_recancels_a_job_still_stopping(tmp_path, fake_jobs):
    clock = fake_jobs.clock()
    queue = ScriptedQueue(clock, {0.0: _job("a"), 0.5: _job("b")}, {5.0: Request(1, "a", "cancel")})
    backend, events = _backend(tmp_path, queue, fake_jobs, clock)
    run(backend, make_policy("pollux"), backend.cluster, events, interval=2.0, max_rounds=5)
    backend.close(graceful=False)
    events.close()
    queue.given.clear()  # a new server reads every job again
    again, events = _backend(tmp_path, queue, fake_jobs, clock, history=read_events(tmp_path / "events.jsonl"))
    try:
        run(again, make_policy("pollux"), again.cluster, events, interval=2.0, max_rounds=40)
    finally:
        again.close(graceful=False)
        events.close()
    logged = read_events(tmp_path / "events.jsonl")
    assert [e["request"] for e in logged if e["type"] == "cancel"] == [1]
    assert sorted(e["job_id"] for e in logged if e["type"] == "submit") == ["a", "b"]
    jobs = replay(logged)
    assert jobs["a"].state is JobState.CANCELLED and jobs["b"].state is JobState.SUCCEEDED
