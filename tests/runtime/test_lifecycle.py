"""A job's life cycle: the state table, the object that owns a job's state
(driven through random event sequences by a Hypothesis state machine), and the
supervisor's use of it (stop and cancel without workers).  No worker processes here."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pollux_opt import InvalidProblem
from pollux_opt.lifecycle import TRANSITIONS, IllegalTransition, JobState, Lifecycle, check_transition

PLACEMENTS = st.dictionaries(st.sampled_from(["n0", "n1", "n2"]), st.integers(1, 4), min_size=1, max_size=3)


def test_the_states_are_the_ones_a_service_shows_and_the_table_covers_them():
    assert [s.value for s in JobState] == ["queued", "running", "rescaling", "succeeded", "failed", "cancelled"]
    assert set(TRANSITIONS) == set(JobState)
    assert {s for s in JobState if s.terminal} == {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    assert {s for s in JobState if s.holds_workers} == {JobState.RUNNING, JobState.RESCALING}
    live = [s for s in JobState if not s.terminal]
    assert all({JobState.FAILED, JobState.CANCELLED} <= TRANSITIONS[s] for s in live)
    # Only a verified job succeeds, and only a job with workers trains.
    assert [s for s in JobState if JobState.SUCCEEDED in TRANSITIONS[s]] == [JobState.RUNNING]
    with pytest.raises(IllegalTransition, match="job 'j' cannot move from 'succeeded' to 'running' .allowed: none"):
        check_transition("j", JobState.SUCCEEDED, JobState.RUNNING)
    with pytest.raises(IllegalTransition, match="allowed: cancelled, failed, queued, rescaling, running"):
        check_transition("j", JobState.RESCALING, JobState.SUCCEEDED)


def test_a_refused_move_leaves_the_state_and_history_as_they_were():
    life = Lifecycle("j", clock=lambda: 5.0)
    with pytest.raises(IllegalTransition, match="can verify only as 'running', not 'rescaling'"):
        life.move(JobState.RESCALING, "start", verifying=True)
    with pytest.raises(IllegalTransition, match="from 'queued' to 'succeeded'"):
        life.move(JobState.SUCCEEDED, "verified")
    assert life.state is JobState.QUEUED and life.history == [] and not life.holds_cpus
    step = life.move(JobState.RUNNING, "re-opened with an unchecked final checkpoint", verifying=True)
    assert (step.time, step.old, step.new, step.verifying) == (5.0, JobState.QUEUED, JobState.RUNNING, True)
    assert life.state.holds_workers and not life.holds_cpus  # verifying: running, no CPUs


class LifecycleMachine(RuleBasedStateMachine):
    """Random event sequences, each applied as the supervisor applies it.

    The machine keeps its own account of the job (``placement``: the CPUs it
    holds; ``pausing``; ``next``: what the current pause leads to) and checks
    the :class:`Lifecycle` against it after every step.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ticks = itertools.count(1.0)
        self.now = 0.0
        self.life = Lifecycle("j", clock=self._clock)
        self.placement: dict[str, int] = {}
        self.last: dict[str, int] = {}  # the allocation a job driven on its own trains on after a failed check
        self.pausing = False
        self.next: str | dict | None = None  # "stop", "cancel", a placement, or None while no pause is asked for
        self.reasons: list[str] = []

    def _clock(self) -> float:
        self.now = next(self.ticks)
        return self.now

    def _move(self, state: JobState, reason: str, placement: dict | None = None, *, verifying: bool = False):
        self.life.move(state, reason, verifying=verifying)
        self.reasons.append(reason)
        self.placement = dict(placement or {})
        if self.placement:
            self.last = self.placement

    @property
    def live(self) -> bool:
        return not self.life.state.terminal

    @property
    def training(self) -> bool:
        return self.life.state is JobState.RUNNING and not self.life.verifying

    # ------------------------------------------------------------------ events
    @precondition(lambda self: self.life.state is JobState.QUEUED)
    @rule(placement=PLACEMENTS, final_checkpoint=st.booleans())
    def start(self, placement, final_checkpoint):
        if final_checkpoint:  # the newest checkpoint is an unchecked final one: verify it, holding no CPUs
            self.last = dict(placement)  # trained on if the check fails
            self._move(JobState.RUNNING, "target reached before the launch", verifying=True)
        else:
            self.pausing = False
            self._move(JobState.RESCALING, "launching: start", placement)

    @precondition(lambda self: self.life.state is JobState.RESCALING and not self.pausing)
    @rule()
    def workers_resumed(self):
        self._move(JobState.RUNNING, "workers resumed", self.placement)
        if self.next is not None:  # asked for meanwhile
            self._pause()

    def _pause(self):
        self.pausing = True
        self._move(JobState.RESCALING, "pausing", self.placement)

    @precondition(lambda self: self.live and not self.life.verifying)
    @rule(placement=PLACEMENTS, kind=st.sampled_from(["rescale", "stop", "cancel"]))
    def request(self, placement, kind):
        if self.next == "cancel":
            return  # a cancel is final
        self.next = placement if kind == "rescale" else kind
        if self.training:
            self._pause()
        elif self.life.state is JobState.QUEUED:
            self.next = None
            if kind == "rescale":
                self.start(placement, False)
            elif kind == "cancel":
                self._move(JobState.CANCELLED, "stopped: request")

    @precondition(lambda self: self.life.state is JobState.RESCALING and self.pausing)
    @rule()
    def workers_paused(self):
        follow, self.next = self.next, None
        if isinstance(follow, dict):
            self.pausing = False
            self._move(JobState.RESCALING, "launching: rescale", follow)
        else:
            self._move(JobState.CANCELLED if follow == "cancel" else JobState.QUEUED, "stopped: request")

    @precondition(lambda self: self.life.holds_cpus)
    @rule()
    def worker_lost(self):
        if self.pausing and self.life.state is JobState.RESCALING and self.next in ("stop", "cancel"):
            self.workers_paused()  # stopped after the fault
            return
        target = self.next if isinstance(self.next, dict) else self.placement
        if isinstance(self.next, dict):
            self.next = None
        self.pausing = False
        self._move(JobState.RESCALING, "launching: restart", target)

    @precondition(lambda self: self.training or (self.life.state is JobState.RESCALING and self.pausing))
    @rule()
    def target_reached(self):
        self._move(JobState.RUNNING, "target reached", verifying=True)

    @precondition(lambda self: self.life.verifying)
    @rule()
    def verified(self):
        self._move(JobState.SUCCEEDED, "verified")

    @precondition(lambda self: self.life.verifying)
    @rule(resume=st.booleans())
    def verification_failed(self, resume):
        follow, self.next = self.next, None
        if isinstance(follow, dict) or (follow is None and resume):
            self.pausing = False
            self._move(JobState.RESCALING, "launching: restart", follow if isinstance(follow, dict) else self.last)
        else:
            self._move(JobState.CANCELLED if follow == "cancel" else JobState.QUEUED, "stopped: verification_failed")

    @precondition(lambda self: self.live)
    @rule()
    def code_error(self):
        self._move(JobState.FAILED, "rank 0: ValueError")

    @precondition(lambda self: not self.live)
    @rule(state=st.sampled_from(list(JobState)), verifying=st.booleans())
    def an_ended_job_refuses_every_move(self, state, verifying):
        before = (self.life.state, list(self.life.history))
        with pytest.raises(IllegalTransition):
            self.life.move(state, "late command", verifying=verifying)
        assert (self.life.state, self.life.history) == before

    @precondition(lambda self: self.live)
    @rule(state=st.sampled_from(list(JobState)), verifying=st.booleans())
    def any_move_is_taken_exactly_when_the_table_allows_it(self, state, verifying):
        old, size = self.life.state, len(self.life.history)
        allowed = state in TRANSITIONS[old] and (not verifying or state is JobState.RUNNING)
        try:
            self.life.move(state, "probe", verifying=verifying)
        except IllegalTransition:
            assert not allowed and self.life.state is old and len(self.life.history) == size
            return
        assert allowed
        # Resynchronise the account with the state the probe moved to.
        self.reasons.append("probe")
        self.last = self.last or {"n0": 1}
        self.placement = dict(self.last) if self.life.holds_cpus else {}
        self.pausing, self.next = self.life.state is JobState.RESCALING, None

    # -------------------------------------------------------------- invariants
    @invariant()
    def every_change_is_in_the_table_and_follows_the_previous_one(self):
        history = self.life.history
        assert all(t.new in TRANSITIONS[t.old] for t in history)
        assert all(a.new is b.old for a, b in zip(history, history[1:]))
        assert not history or history[-1].new is self.life.state
        assert not history or history[0].old is JobState.QUEUED

    @invariant()
    def an_ended_job_never_changes(self):
        ended = [i for i, t in enumerate(self.life.history) if t.new.terminal]
        assert not ended or ended[0] == len(self.life.history) - 1

    @invariant()
    def holding_cpus_agrees_with_the_placement(self):
        assert self.life.holds_cpus == bool(self.placement)
        assert self.life.holds_cpus == (self.life.state.holds_workers and not self.life.verifying)

    @invariant()
    def every_change_is_recorded_with_its_time_and_reason(self):
        assert [t.reason for t in self.life.history] == self.reasons
        times = [t.time for t in self.life.history]
        assert times == sorted(set(times)) and (not times or times[-1] == self.now)


LifecycleMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_lifecycle_machine = LifecycleMachine.TestCase


# ------------------------------------------------------------------ supervisor
def test_supervisor_refuses_an_illegal_transition_and_stops_a_queued_job_in_place(tmp_path):
    from pollux_opt.runtime import ElasticJob

    job = ElasticJob("digits-cnn", tmp_path / "job")
    ctl = job._ctl
    with pytest.raises(IllegalTransition, match="from 'queued' to 'succeeded'"):
        ctl.status.enter(JobState.SUCCEEDED, "verified")  # only a verified running job succeeds
    ctl.request_stop(cancel=False)
    assert job.poll() is JobState.QUEUED and ctl.status.events[-1].details["never_started"]
    assert ctl.status.lifecycle.history == []  # a stop of a queued job is no change
    job.close()


def test_a_cancelled_job_ends_and_refuses_further_commands(tmp_path):
    from pollux_opt.runtime import ElasticJob

    job = ElasticJob("digits-cnn", tmp_path / "job")
    ctl = job._ctl
    ctl.request_stop(cancel=True)
    assert job.poll() is JobState.CANCELLED and ctl.status.events[-1].details["cancel"]
    assert [(t.old, t.new) for t in ctl.status.lifecycle.history] == [(JobState.QUEUED, JobState.CANCELLED)]
    with pytest.raises(InvalidProblem, match=r"job 'job' has ended \(cancelled\); it takes no more commands"):
        job.start(1)
    job.close()
    reopened = ElasticJob.from_workdir(tmp_path / "job")
    assert reopened.poll() is JobState.CANCELLED
    reopened.close()


def test_a_saved_state_outside_the_enumeration_is_refused_naming_it(tmp_path):
    import json

    from pollux_opt.runtime import ElasticJob

    ElasticJob("digits-cnn", tmp_path / "job").close()
    (tmp_path / "job" / "state.json").write_text(json.dumps({"state": "completed"}))
    with pytest.raises(InvalidProblem, match="state.json of job 'job': state must be one of queued, running, "
                                             "rescaling, succeeded, failed, cancelled, got 'completed'"):
        ElasticJob.from_workdir(tmp_path / "job")
