"""The scheduler loop with fake backends, and the real backend's bookkeeping and
recovery with in-process stand-ins for the elastic jobs (the ``fake_jobs`` fixture)."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest

from pollux_opt import Cluster, InvalidProblem
from pollux_opt.records.events import EventLog, read_events
from pollux_opt.scheduling.policies import FixedPolicy, PolluxPolicy, TiresiasPolicy
from pollux_opt.backends.local import RealBackend, run_workload
from pollux_opt.lifecycle import JobState
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
                state = JobState.RUNNING if k else JobState.QUEUED
                out.append(JobView(j, a, state, {"n0": k} if k else {}, 0, self.t - a,
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


def test_loop_stops_after_max_rounds_and_refuses_a_bad_interval_or_max_rounds(tmp_path):
    backend = ScriptedBackend({"a": 0.0}, work=1e9)
    with EventLog(tmp_path / "e.jsonl") as log:
        assert run(backend, FixedPolicy(), Cluster.uniform(1, 1), log, interval=1.0, max_rounds=3) == 3
        with pytest.raises(InvalidProblem, match=r"interval must be a finite number of seconds > 0, got 0"):
            run(backend, FixedPolicy(), Cluster.uniform(1, 1), log, interval=0)
        with pytest.raises(InvalidProblem, match=r"max_rounds must be an integer >= 0 or None, got -1"):
            run(backend, FixedPolicy(), Cluster.uniform(1, 1), log, interval=1.0, max_rounds=-1)


# ------------------------------------------------ the real backend over stand-in jobs
WORKLOAD = Workload("fake", (
    WorkloadJob("a", "digits-cnn", 0.0, 1, 32),
    WorkloadJob("b", "digits-cnn", 5.0, 2, 32),
    WorkloadJob("bad-c", "digits-cnn", 8.0, 1, 32),
))


def _run(tmp_path, policy, fake_jobs, clock=None, workload=WORKLOAD, **kw):
    import pollux_opt.backends.local.backend as rb

    clock = clock or fake_jobs.clock()
    old = rb.time.time
    rb.time.time = clock.time  # run_workload's own timestamps
    try:
        return run_workload(tmp_path, workload, policy, cluster=Cluster.uniform(1, 2), interval=10.0,
                        progress=False, pin_cpus=False, backend_kwargs=fake_jobs.backend_kwargs(clock), **kw)
    finally:
        rb.time.time = old


@pytest.mark.parametrize("policy", ["fixed", "dynamic", "pollux", "tiresias"])
def test_real_backend_runs_a_workload_and_a_failing_job_does_not_stop_the_others(tmp_path, policy, fake_jobs):
    summary = _run(tmp_path / policy, policy, fake_jobs)
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


def test_a_run_killed_mid_way_resumes_its_jobs_from_their_checkpoints_in_one_history(tmp_path, monkeypatch, fake_jobs):
    """Kill the scheduler mid-run (no cleanup), restart it on the same run directory:
    completed jobs stay completed, running ones resume from their checkpoints, and
    the event log stays one consistent history."""
    clock = fake_jobs.clock()

    class Killed(BaseException):
        pass

    workload = Workload("fake2", (WorkloadJob("a", "digits-cnn", 0.0, 2, 32),
                                  WorkloadJob("b", "digits-cnn", 1.0, 1, 32),
                                  WorkloadJob("late", "digits-cnn", 60.0, 1, 32)))
    calls = {"n": 0}

    def sleep(dt):
        clock.sleep(dt)
        calls["n"] += 1
        if clock.t - clock.start >= 45.0:  # a has finished by now, b is half done
            raise Killed

    monkeypatch.setattr(RealBackend, "close", lambda self, **kw: None)  # a kill runs no cleanup
    kwargs = fake_jobs.backend_kwargs(clock) | {"sleep": sleep}
    import pollux_opt.backends.local.backend as rb

    monkeypatch.setattr(rb.time, "time", clock.time)
    with pytest.raises(Killed):
        run_workload(tmp_path, workload, "fixed", cluster=Cluster.uniform(1, 2), interval=10.0, progress=False,
                 pin_cpus=False, backend_kwargs=kwargs)
    before = read_events(tmp_path / "events.jsonl")
    assert any(e["type"] == "complete" and e["job_id"] == "a" for e in before)
    progress_b = max(e["progress"] for e in before if e["type"] == "report" and e["job_id"] == "b")
    assert 0 < progress_b < fake_jobs.work
    checkpoint_b = json.loads((tmp_path / "jobs" / "b" / "fake.json").read_text())["progress"]
    assert 0 < checkpoint_b < fake_jobs.work
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write('{"t": 45.1, "job_id": "b", "type": "rep')  # torn by the kill
    clock.sleep(5.0)  # the outage
    monkeypatch.undo()
    monkeypatch.setattr(rb.time, "time", clock.time)
    summary = run_workload(tmp_path, progress=False, backend_kwargs=fake_jobs.backend_kwargs(clock))
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
    remaining = fake_jobs.work - checkpoint_b
    assert done_b["t"] - resumed[0]["t"] == pytest.approx(fake_jobs.start_s + remaining + fake_jobs.verify_s, abs=1.0)
    assert all(j["completed"] for j in summary["jobs"])
    jobs = {j["id"]: j for j in summary["jobs"]}
    assert jobs["b"]["restarts"] == 1
    assert jobs["b"]["jct_s"] > 50.0 - 1.0  # the outage counts in the JCT


def test_run_real_rejects_mismatched_resume_and_new_runs_without_a_workload(tmp_path, fake_jobs):
    _run(tmp_path, "fixed", fake_jobs, workload=Workload("one", (WorkloadJob("a", "digits-cnn", 0.0, 1, 32),)))
    with pytest.raises(InvalidProblem, match=r"holds a 'fixed' run, not 'pollux'"):
        run_workload(tmp_path, None, "pollux", progress=False)
    with pytest.raises(InvalidProblem, match=r"holds a different workload \('one'\)"):
        run_workload(tmp_path, WORKLOAD, None, progress=False)
    with pytest.raises(InvalidProblem, match=r"is new: give a workload and a policy"):
        run_workload(tmp_path / "new", None, "fixed", progress=False)
    with pytest.raises(InvalidProblem, match=r"unknown policy 'x'"):
        run_workload(tmp_path / "new", WORKLOAD, "x", progress=False)


# ------------------------------------------------------------- workloads and CLI
def test_workload_sets_scale_to_quick_and_bad_workload_files_are_named(tmp_path):
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


def test_cli_compare_prints_the_summaries(tmp_path, capsys, fake_jobs):
    from pollux_opt.cli.main import main

    _run(tmp_path / "f", "fixed", fake_jobs)
    _run(tmp_path / "p", "pollux", fake_jobs)
    assert main(["compare", str(tmp_path / "f"), str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "avg JCT (s)" in out and "fixed" in out and "pollux" in out
    assert main(["compare", str(tmp_path / "none")]) == 2
    assert "holds neither summary.json nor events.jsonl" in capsys.readouterr().err
