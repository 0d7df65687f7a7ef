"""The scheduler loop with fake backends, and the real backend's bookkeeping and
recovery with in-process stand-ins for the elastic jobs."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from pollux_opt import Cluster, InvalidProblem
from pollux_opt.records.events import EventLog, read_events
from pollux_opt.model import GradientStats, ThroughputParams
from pollux_opt.scheduling.policies import FixedPolicy, PolluxPolicy, TiresiasPolicy
from pollux_opt.backends.local import JobHandle, RealBackend, run_workload
from pollux_opt.runtime.report import Event, JobReport, JobState, Measurements
from pollux_opt.scheduling.loop import Decision, DecisionStatus, JobView, run
from pollux_opt.workloads import Workload, WorkloadJob


# ----------------------------------------------------------- a scripted backend
@dataclass
class ScriptedBackend:
    """Jobs that need ``work`` replica-seconds each; the clock steps by advance()."""

    arrivals: dict[str, float]
    work: float = 20.0
    t: float = 0.0
    done: dict[str, float] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    applied: list[Decision] = field(default_factory=list)
    advanced: list[float] = field(default_factory=list)

    def now(self) -> float:
        return self.t

    def views(self) -> list[JobView]:
        out = []
        for j, a in self.arrivals.items():
            if a <= self.t and self.done.get(j, 0.0) < self.work:
                k = self.held.get(j, 0)
                out.append(JobView(j, a, "running" if k else "pending", {"n0": k} if k else {}, 0, self.t - a,
                                   1, 4, 1, 32, None, 1.0, self.done.get(j, 0.0), 0.0))
        return out

    def apply(self, decision: Decision) -> None:
        self.applied.append(decision)
        self.held = {j: sum(p.values()) for j, p in decision.placement.items()}

    def advance(self, seconds: float) -> None:
        self.advanced.append(seconds)
        for j, k in self.held.items():
            self.done[j] = self.done.get(j, 0.0) + k * seconds
        self.t += seconds

    def finished(self) -> bool:
        return all(self.done.get(j, 0.0) >= self.work for j in self.arrivals)


def test_loop_decides_applies_logs_and_advances(tmp_path):
    backend = ScriptedBackend({"a": 0.0, "b": 15.0}, work=30.0)
    seen = []
    with EventLog(tmp_path / "e.jsonl") as log:
        rounds = run(backend, FixedPolicy(), Cluster.uniform(1, 2), log, interval=10.0,
                     progress=lambda now, views, d: seen.append((now, [v.job_id for v in views])))
    events = read_events(tmp_path / "e.jsonl")
    assert backend.finished() and rounds == len(backend.advanced)
    assert set(backend.advanced) == {10.0}
    allocs = [e for e in events if e["type"] == "allocation"]
    assert len(allocs) == len(backend.applied) == len(seen)
    assert [e["t"] for e in allocs] == [now for now, _ in seen]
    assert allocs[0]["placement"] == {"a": {"n0": 1}} and allocs[0]["policy"] == "fixed"
    assert allocs[2]["placement"] == {"a": {"n0": 1}, "b": {"n0": 1}}  # b arrived at 15 s
    assert all(e["overhead_s"] >= e["solver_s"] >= 0 and e["interval_s"] == 10.0 for e in allocs)
    assert all(e["status"] == "fifo" and e["allocator_s"] == 0.0 for e in allocs)  # the enum's string


def test_loop_times_each_decision(tmp_path, monkeypatch):
    """The loop measures ``decide`` (the policies do not time themselves): the
    event's ``solver_s`` and the decision's ``solver_seconds`` are that wall time;
    ``allocator_s`` is what the policy reports of it spent in a solver."""
    import pollux_opt.scheduling.loop as loop

    clock = [100.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])

    @dataclass
    class Slow:
        name: str = "slow"
        fixed_batch: bool = False

        def decide(self, now, cluster, jobs):
            clock[0] += 2.5  # the decision takes 2.5 s
            return Decision({v.job_id: {"n0": 1} for v in jobs}, 1.0, math.nan, DecisionStatus.GREEDY,
                            allocator_seconds=0.75)

    seen = []
    backend = ScriptedBackend({"a": 0.0}, work=20.0)
    with EventLog(tmp_path / "e.jsonl") as log:
        run(backend, Slow(), Cluster.uniform(1, 2), log, interval=10.0,
            progress=lambda now, views, d: seen.append(d))
    allocs = [e for e in read_events(tmp_path / "e.jsonl") if e["type"] == "allocation"]
    assert len(allocs) == len(seen) == 2
    assert all(e["solver_s"] == 2.5 and e["allocator_s"] == 0.75 and e["status"] == "greedy" for e in allocs)
    assert all(d.solver_seconds == 2.5 and d.allocator_seconds == 0.75 for d in seen)


def test_allocator_policies_report_the_solvers_own_time(tmp_path):
    backend = ScriptedBackend({"a": 0.0}, work=10.0)
    with EventLog(tmp_path / "e.jsonl") as log:
        run(backend, PolluxPolicy(), Cluster.uniform(1, 2), log, interval=10.0)
    (e,) = [e for e in read_events(tmp_path / "e.jsonl") if e["type"] == "allocation"]
    assert e["status"] == "optimal" and 0 < e["allocator_s"] <= e["solver_s"] <= e["overhead_s"]


def test_tiresias_through_the_loop_preempts_the_job_with_more_attained_service(tmp_path):
    """Tiresias reads only what every backend reports: attained service and the submitted configuration."""

    @dataclass
    class Served(ScriptedBackend):
        def views(self):
            return [replace(v, attained_service=self.done.get(v.job_id, 0.0) + (v.job_id == "a") * 50.0,
                            submitted_replicas=2) for v in super().views()]

    backend = Served({"a": 0.0, "b": 10.0}, work=40.0)
    with EventLog(tmp_path / "e.jsonl") as log:
        run(backend, TiresiasPolicy(thresholds=(30.0,)), Cluster.uniform(1, 2), log, interval=10.0)
    placements = [d.placement for d in backend.applied]
    assert placements[0] == {"a": {"n0": 2}}  # alone: its submitted 2 CPUs
    assert placements[1] == {"b": {"n0": 2}, "a": {}}  # b (queue 0) preempts a (queue 1: 50 > 30)
    assert backend.finished()


def test_loop_skips_deciding_while_no_job_is_active(tmp_path):
    backend = ScriptedBackend({"a": 25.0}, work=5.0)  # one replica-second a second: done by 30 s
    with EventLog(tmp_path / "e.jsonl") as log:
        rounds = run(backend, PolluxPolicy(), Cluster.uniform(1, 2), log, interval=10.0)
    assert rounds == 4 and len(backend.applied) == 1  # rounds at 0, 10, 20 see nothing
    assert backend.applied[0].placement == {"a": {"n0": 1}}  # unmeasured: one replica (exploration cap)


def test_loop_max_rounds_and_bad_interval(tmp_path):
    backend = ScriptedBackend({"a": 0.0}, work=1e9)
    with EventLog(tmp_path / "e.jsonl") as log:
        assert run(backend, FixedPolicy(), Cluster.uniform(1, 1), log, interval=1.0, max_rounds=3) == 3
        with pytest.raises(InvalidProblem, match=r"interval must be a finite number of seconds > 0, got 0"):
            run(backend, FixedPolicy(), Cluster.uniform(1, 1), log, interval=0)
        with pytest.raises(InvalidProblem, match=r"max_rounds must be an integer >= 0 or None, got -1"):
            run(backend, FixedPolicy(), Cluster.uniform(1, 1), log, interval=1.0, max_rounds=-1)


# -------------------------------------------- stand-ins for the elastic job runtime
class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

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
        self.state = s.get("state", "pending")
        if self.state in ("running", "rescaling", "verifying"):
            self.state = "stopped"  # the controller went away
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
        data = {"job_id": self.job_id, "state": self.state, "progress": ckpt if self.state != "completed" else
                self.progress, "final_metric": self.final_metric, "start_times": self.start_times,
                "rescale_times": self.rescale_times,
                "events": [{"time": e.time, "kind": e.kind, "details": dict(e.details)} for e in self.events]}
        (self.workdir / "fake.json").write_text(json.dumps(data))

    def _record(self, t, kind, **details):
        self.events.append(Event(t, kind, details))
        self._persist()

    def _update(self) -> None:
        now = self.clock.time()
        if self.state == "rescaling" and now >= self.until:
            seconds = self.until - self.t0
            (self.start_times if self.kind == "start" else self.rescale_times).append(seconds)
            self.state, self.last = "running", self.until
            self._record(self.until, "started" if self.kind == "start" else "rescaled", seconds=seconds,
                         placement=self.placement)
        if self.state == "running":
            k = sum(self.placement.values())
            dt = now - self.last
            if self.job_id.startswith("bad") and self.trained + dt >= 3.0:
                self.state, self.error = "failed", "rank 0: boom"
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
                self.state, self.until, self.placement = "verifying", t_hit + FAKE_VERIFY_S, {}
                self._record(t_hit, "target_reached", metric=0.99, step=int(FAKE_WORK))
        if self.state == "verifying" and now >= self.until:
            self.state, self.final_metric = "completed", 0.99
            self._record(self.until, "verified", metric=0.99, reached=True)

    def start(self, replicas, num_nodes=None, *, cpus=None, local_bsz=None, accum_steps=None, node_types=None,
              cgroups=None):
        self._update()
        self._go(dict(replicas), "start", FAKE_START_S)

    def rescale(self, replicas, num_nodes=None, *, cpus=None, local_bsz=None, accum_steps=None, node_types=None,
                cgroups=None):
        self._update()
        if self.state in ("pending", "stopped"):
            self._go(dict(replicas), "start", FAKE_START_S)
        elif self.state in ("running", "rescaling") and dict(replicas) == self.placement:
            pass  # only the batch changes: applied without a restart, as ElasticJob does
        else:
            self._go(dict(replicas), "rescale", FAKE_RESCALE_S)

    def _go(self, placement, kind, seconds):
        if self.state in ("completed", "failed"):
            raise InvalidProblem(f"job {self.job_id!r} is {self.state}")
        self.t0 = self.clock.time()
        self.placement, self.kind, self.state, self.until = placement, kind, "rescaling", self.t0 + seconds
        self._persist()

    def stop(self):
        self._update()
        if self.state in ("running", "rescaling"):
            self.state, self.placement = "stopped", {}
            self._record(self.clock.time(), "stopped", reason="request")

    def poll(self) -> JobState:
        self._update()
        return JobState(self.state)

    def wait(self, timeout=None):
        return self.report()

    def close(self):
        self.closed = True

    def report(self) -> JobReport:
        self._update()
        spec = self.spec or _SPEC
        running = self.state in ("running", "rescaling")
        k = sum(self.placement.values()) if running else 0
        return JobReport(
            job_id=self.job_id, kind="fake", state=JobState(self.state), step=int(self.progress),
            progress=self.progress, samples=int(self.progress * 32), epoch=math.nan, metric_name="accuracy",
            target=0.9, higher_is_better=True, metric=None, final_metric=self.final_metric,
            placement=dict(self.placement) if running else {}, num_replicas=k, num_nodes=len(self.placement),
            local_bsz=32, accum_steps=0, batch_size=32 * k, fixed_batch_size=None,
            measurements=Measurements.from_profile({}),
            throughput_params=ThroughputParams(0.01, 0.001, 0.001, 0.0, 0.01, 0.0, 1.0) if self.start_times else None,
            grad_stats=GradientStats(1.0, 10.0, 32) if self.start_times else None, limits=spec.limits(),
            restart_delay=None, rescale_times=tuple(self.rescale_times), start_times=tuple(self.start_times),
            num_restarts=0, age=0.0, worker_pids=(), error=getattr(self, "error", None), events=tuple(self.events),
        )


_SPEC = WorkloadJob("x", "digits-cnn", 0.0, 1, 32).job_spec()


def fake_kwargs(clock: FakeClock) -> dict:
    return {
        "job_factory": lambda spec, workdir, job_id, options, pool: FakeJob(spec, workdir, job_id, options, pool,
                                                                            clock),
        "job_opener": FakeJob.opener(clock), "clock": clock.time, "sleep": clock.sleep,
    }


WORKLOAD = Workload("fake", (
    WorkloadJob("a", "digits-cnn", 0.0, 1, 32),
    WorkloadJob("b", "digits-cnn", 5.0, 2, 32),
    WorkloadJob("bad-c", "digits-cnn", 8.0, 1, 32),
))


def _run(tmp_path, policy, clock, workload=WORKLOAD, **kw):
    import pollux_opt.backends.local.backend as rb

    old = rb.time.time
    rb.time.time = clock.time  # run_workload's own timestamps
    try:
        return run_workload(tmp_path, workload, policy, cluster=Cluster.uniform(1, 2), interval=10.0,
                        progress=False, pin_cpus=False, backend_kwargs=fake_kwargs(clock), **kw)
    finally:
        rb.time.time = old


@pytest.mark.parametrize("policy", ["fixed", "dynamic", "pollux", "tiresias"])
def test_real_backend_runs_a_workload_and_a_failing_job_does_not_stop_the_others(tmp_path, policy):
    summary = _run(tmp_path / policy, policy, FakeClock())
    assert summary["policy"] == policy
    jobs = {j["id"]: j for j in summary["jobs"]}
    assert jobs["a"]["completed"] and jobs["b"]["completed"] and jobs["a"]["verified"]
    assert jobs["bad-c"]["failed"] and not jobs["bad-c"]["completed"]
    events = read_events(tmp_path / policy / "events.jsonl")
    per_job = Counter((e["job_id"], e["type"]) for e in events)
    for j in ("a", "b", "bad-c"):
        assert per_job[(j, "submit")] == 1 and per_job[(j, "start")] == 1
    assert per_job[("a", "complete")] == per_job[("b", "complete")] == 1 and per_job[("bad-c", "failed")] == 1
    assert per_job[("a", "report")] >= 1 and per_job[("a", "validation")] == 1
    times = [e["t"] for e in events]
    assert times == sorted(times)  # one consistent history
    assert json.loads((tmp_path / policy / "summary.json").read_text())["policy"] == policy
    submit_b = next(e for e in events if e["type"] == "submit" and e["job_id"] == "b")
    assert submit_b["t"] == pytest.approx(5.0, abs=0.6)  # arrivals wake the loop (0.5 s polls)
    if policy == "fixed":
        assert per_job[("a", "rescale_begin")] == 0 and per_job[("b", "rescale_begin")] == 0
    allocs = [e for e in events if e["type"] == "allocation"]
    assert allocs and all(e["policy"] == policy and e["solver_s"] >= 0 for e in allocs)


def test_run_real_accepts_the_policies_that_need_nothing_simulator_only(tmp_path):
    from pollux_opt.scheduling.policies import policy_names

    assert "tiresias" in policy_names() and "optimus" not in policy_names()
    with pytest.raises(InvalidProblem, match=r"policy 'optimus' needs the simulator's step oracle .*"
                                             r"run it with `pollux-opt simulate`"):
        run_workload(tmp_path / "o", WORKLOAD, "optimus", progress=False)
    assert not (tmp_path / "o" / "config.json").exists()  # refused before the run starts


def test_resume_after_a_kill(tmp_path, monkeypatch):
    """Kill the scheduler mid-run (no cleanup), restart it on the same run directory:
    completed jobs stay completed, running ones resume from their checkpoints, and
    the event log stays one consistent history."""
    clock = FakeClock()

    class Killed(BaseException):
        pass

    workload = Workload("fake2", (WorkloadJob("a", "digits-cnn", 0.0, 2, 32),
                                  WorkloadJob("b", "digits-cnn", 1.0, 1, 32),
                                  WorkloadJob("late", "digits-cnn", 60.0, 1, 32)))
    calls = {"n": 0}

    def sleep(dt):
        clock.sleep(dt)
        calls["n"] += 1
        if clock.t - 1_000_000.0 >= 45.0:  # a has finished by now, b is half done
            raise Killed

    monkeypatch.setattr(RealBackend, "close", lambda self, **kw: None)  # a kill runs no cleanup
    kwargs = fake_kwargs(clock) | {"sleep": sleep}
    import pollux_opt.backends.local.backend as rb

    monkeypatch.setattr(rb.time, "time", clock.time)
    with pytest.raises(Killed):
        run_workload(tmp_path, workload, "fixed", cluster=Cluster.uniform(1, 2), interval=10.0, progress=False,
                 pin_cpus=False, backend_kwargs=kwargs)
    before = read_events(tmp_path / "events.jsonl")
    assert any(e["type"] == "complete" and e["job_id"] == "a" for e in before)
    progress_b = max(e["progress"] for e in before if e["type"] == "report" and e["job_id"] == "b")
    assert 0 < progress_b < FAKE_WORK
    checkpoint_b = json.loads((tmp_path / "jobs" / "b" / "fake.json").read_text())["progress"]
    assert 0 < checkpoint_b < FAKE_WORK
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write('{"t": 45.1, "job_id": "b", "type": "rep')  # torn by the kill
    clock.sleep(5.0)  # the outage
    monkeypatch.undo()
    monkeypatch.setattr(rb.time, "time", clock.time)
    summary = run_workload(tmp_path, progress=False, backend_kwargs=fake_kwargs(clock))
    events = read_events(tmp_path / "events.jsonl")
    assert events[: len(before)] == before
    per_job = Counter((e["job_id"], e["type"]) for e in events)
    for j in ("a", "b", "late"):
        assert per_job[(j, "submit")] == 1 and per_job[(j, "complete")] == 1
    assert per_job[("a", "start")] == 1 and per_job[("a", "rescale_begin")] == 0  # completed stays completed
    runs = [e for e in events if e["type"] == "run_start"]
    assert [e["resumed"] for e in runs] == [False, True]
    fault = [e for e in events if e["type"] == "restart_after_fault"]
    assert [(e["job_id"], e["placement"]) for e in fault] == [("b", {})]
    resumed = [e for e in events if e["type"] == "rescale_begin" and e["job_id"] == "b"]
    assert len(resumed) == 1 and resumed[0]["t"] >= 50.0
    # b resumed from its last checkpoint, not from zero: start, the remaining work on 1 CPU, verify
    done_b = next(e for e in events if e["type"] == "complete" and e["job_id"] == "b")
    remaining = FAKE_WORK - checkpoint_b
    assert done_b["t"] - resumed[0]["t"] == pytest.approx(FAKE_START_S + remaining + FAKE_VERIFY_S, abs=1.0)
    assert all(j["completed"] for j in summary["jobs"])
    jobs = {j["id"]: j for j in summary["jobs"]}
    assert jobs["b"]["restarts"] == 1
    assert jobs["b"]["jct_s"] > 50.0 - 1.0  # the outage counts in the JCT


def test_run_real_rejects_mismatched_resume_and_new_runs_without_a_workload(tmp_path):
    clock = FakeClock()
    _run(tmp_path, "fixed", clock, workload=Workload("one", (WorkloadJob("a", "digits-cnn", 0.0, 1, 32),)))
    with pytest.raises(InvalidProblem, match=r"holds a 'fixed' run, not 'pollux'"):
        run_workload(tmp_path, None, "pollux", progress=False)
    with pytest.raises(InvalidProblem, match=r"holds a different workload \('one'\)"):
        run_workload(tmp_path, WORKLOAD, None, progress=False)
    with pytest.raises(InvalidProblem, match=r"is new: give a workload and a policy"):
        run_workload(tmp_path / "new", None, "fixed", progress=False)
    with pytest.raises(InvalidProblem, match=r"unknown policy 'x'"):
        run_workload(tmp_path / "new", WORKLOAD, "x", progress=False)


# ------------------------------------------------------------- workloads and CLI
def test_workload_sets_and_files(tmp_path):
    from pollux_opt.workloads import QUICK_TIME_SCALE, WORKLOAD_SETS, load_workload

    assert len(WORKLOAD_SETS) >= 3
    for name, wl in WORKLOAD_SETS.items():
        quick = load_workload(name, quick=True)
        assert [j.arrival_s for j in quick.jobs] == [j.arrival_s * QUICK_TIME_SCALE for j in wl.jobs]
        assert len({j.kind for j in wl.jobs}) >= 3  # mixes built-in jobs
        assert len({j.arrival_s for j in wl.jobs}) > 1  # staggered arrivals
    path = tmp_path / "wl.json"
    path.write_text(json.dumps(WORKLOAD_SETS["mixed"].to_json()))
    assert load_workload(path) == WORKLOAD_SETS["mixed"]
    with pytest.raises(InvalidProblem, match=r"workload 'nope' is neither a named set"):
        load_workload("nope")
    path.write_text('{"jobs": [{"id": "a", "kind": "no-such-job", "arrival_s": 0, "replicas": 1, "batch_size": 8}]}')
    with pytest.raises(InvalidProblem, match=r"unknown job( kind)? 'no-such-job'"):
        load_workload(path)
    path.write_text('{"jobs": [{"id": "a", "kind": "digits-cnn", "arrival_s": -1, "replicas": 1, "batch_size": 8}]}')
    with pytest.raises(InvalidProblem, match=r"job 'a': arrival_s must be a finite number >= 0, got -1"):
        load_workload(path)
    path.write_text('{"jobs": [{"id": "a", "kind": "digits-cnn", "arrival_s": 0, "replicas": 1}]}')
    with pytest.raises(InvalidProblem, match=r"missing field\(s\) \['batch_size'\]"):
        load_workload(path)


def test_cli_compare_prints_the_summaries(tmp_path, capsys):
    from pollux_opt.cli.main import main

    _run(tmp_path / "f", "fixed", FakeClock())
    _run(tmp_path / "p", "pollux", FakeClock())
    assert main(["compare", str(tmp_path / "f"), str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "avg JCT (s)" in out and "fixed" in out and "pollux" in out
    assert main(["compare", str(tmp_path / "none")]) == 2
    assert "holds neither summary.json nor events.jsonl" in capsys.readouterr().err
