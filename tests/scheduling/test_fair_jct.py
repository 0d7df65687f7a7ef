"""fair-jct: its online work estimator, its rank weights and fairness outlook, its
registry entry, and priority weights in fair-jct and pollux (a heavier job never finishes later)."""

from __future__ import annotations

import numpy as np
import pytest

from solvers import InvalidProblem

from pollux_opt import Cluster
from pollux_opt.lifecycle import JobState
from pollux_opt.backends.sim import ParametricProfile, SimBackend
from pollux_opt.model import BatchLimits, GoodputModel, GradientStats, ThroughputParams
from pollux_opt.scheduling.loop import JobView
from pollux_opt.scheduling.loop import run as run_loop
from pollux_opt.scheduling.policies import (
    POLICIES,
    FairJctOraclePolicy,
    FairJctPolicy,
    PolluxPolicy,
    make_policy,
    policy_names,
)
from pollux_opt.model import Options
from pollux_opt.model.goodput import isolated_rate
from pollux_opt.scheduling.policies.fair_jct import (
    DEFAULT_LOOKAHEAD_S,
    FAIR_JCT_EXPLORATION,
    FAIRNESS_BOUND,
    RANK_POWER,
    _rates,
)
from pollux_opt.scheduling.policies.flow_weights import flow_weights, hull_increments
from pollux_opt.scheduling.policies.views import EXPLORATION_FACTOR
from pollux_opt.workloads.job import WorkloadJob
from pollux_opt.model.goodput import SearchCache
from pollux_opt.records.events import NullLog
from pollux_opt.scheduling.policies.remaining import (
    MIN_SAMPLES,
    MIN_WORK_S,
    WorkHistory,
    one_node_rates,
    reference_rate,
)


def _view(job_id: str, **kw) -> JobView:
    base = dict(job_id=job_id, submit_time=0.0, state=JobState.QUEUED, placement={}, restarts=0, age=0.0,
                min_replicas=0, max_replicas=4, submitted_replicas=1, submitted_batch_size=128,
                goodput_model=None, restart_delay=30.0, progress=0.0, attained_service=0.0)
    return JobView(**{**base, **kw})


def _history(totals, model: GoodputModel | None = None) -> WorkHistory:
    """A history that saw jobs of ``model``'s family (None: no model, the pooled
    distribution) finish with these total works."""
    h = WorkHistory()
    views = [_view(f"j{i}", goodput_model=model) for i in range(len(totals))]
    h.observe(views, {v.job_id: w for v, w in zip(views, totals)})
    h.observe([], {})
    return h


def test_remaining_work_is_the_mean_residual_of_the_completed_jobs():
    h = _history([100.0, 100.0, 1000.0])
    v = _view("x")
    assert h.remaining(v, 0.0) == pytest.approx(400.0)
    # past the short jobs only the long one remains
    assert h.remaining(v, 150.0) == pytest.approx(850.0)


def test_remaining_work_falls_back_to_least_attained_service_without_enough_history():
    h = _history([100.0] * (MIN_SAMPLES - 1))
    v = _view("x")
    assert h.remaining(v, 0.0) == pytest.approx(MIN_WORK_S)
    assert h.remaining(v, 600.0) == pytest.approx(600.0)
    # Beyond every sample: the Lindy estimate (remaining = attained).
    assert _history([100.0] * MIN_SAMPLES).remaining(v, 500.0) == pytest.approx(500.0)


def test_a_family_not_seen_to_finish_falls_back_to_lindy_not_to_the_other_families():
    m = _model()
    h = _history([100.0] * MIN_SAMPLES)  # short jobs without a model finished
    v = _view("x", goodput_model=m)
    assert h.remaining(v, 500.0) == pytest.approx(500.0)  # Lindy: as long again
    assert h.remaining(_view("y"), 0.0) == pytest.approx(100.0)  # a job without a model: the pooled jobs
    pooled = WorkHistory(by_family=False)
    pooled._pooled = list(h._pooled)
    assert pooled.remaining(v, 50.0) == pytest.approx(50.0)  # by_family=False: the pooled residual
    assert _history([1000.0], m).remaining(v, 500.0) == pytest.approx(500.0)  # its own family: W - a


def test_history_counts_a_job_once_it_leaves_the_views():
    h = WorkHistory()
    a, b = _view("a"), _view("b")
    h.observe([a, b], {"a": 10.0, "b": 20.0})
    h.observe([a, b], {"a": 30.0, "b": 40.0})
    assert h.completed == 0
    h.observe([b], {"b": 50.0})
    assert h.completed == 1 and h._pooled == [30.0]


def _model() -> GoodputModel:
    """A CPU-like job: 5 ms + 1 ms/sample compute, small sync, moderate gradient noise."""
    return GoodputModel(
        ThroughputParams(0.005, 0.001, 0.002, 0.0005, 0.02, 0.002, 1.5),
        GradientStats(grad_sqr=1.0, grad_var=0.1, init_batch_size=32),
        BatchLimits(init_batch_size=32, max_batch_size=4096, max_local_bsz=1024),
    )


@pytest.mark.parametrize("replicas", [1, 2, 4, 64])
@pytest.mark.parametrize("cache", [None, SearchCache()])
def test_one_search_gives_each_rate_as_its_own_search_would(replicas, cache):
    m = _model()
    init = m.limits.init_batch_size
    alone = [m.optimize(1, k) for k in (1, replicas)]
    expected = [float(c.goodput) / init if bool(c.feasible) else None for c in alone]
    got = [None if r != r else r for r in one_node_rates.__wrapped__(m, replicas, cache=cache)]
    assert got == expected  # the same floats, not merely close
    if expected[0] is not None:
        assert reference_rate(m) == expected[0]


def _three_sizes(pol: FairJctPolicy, m: GoodputModel):
    """Views of one model family at three attained works against a history of short and long jobs."""
    pol._history = _history([100.0, 100.0, 100.0, 10000.0, 10000.0, 10000.0], m)
    # residual works: new 3550 (mean of all), 150 done -> 9850 (past the short ones), 9000 done -> 1000
    return [_view("new", goodput_model=m, progress=0.0),
            _view("long", goodput_model=m, progress=150.0 * reference_rate(m), age=200.0),
            _view("near", goodput_model=m, progress=9000.0 * reference_rate(m), age=20000.0)]


def test_fair_jct_weights_are_the_flow_time_weights_of_the_jobs_in_remaining_time_order():
    m = _model()
    cluster = Cluster.uniform(1, 4)
    pol = FairJctPolicy(bound=None)
    views = _three_sizes(pol, m)
    tie = PolluxPolicy().weights(cluster, views)  # Pollux's weights: priority times tie-break
    w = pol.weights(cluster, views)
    # completion order from the last: long, new, near; one model, so one speedup curve and base
    goodput = np.asarray(m.optimize(np.ones(4, dtype=int), np.arange(1, 5)).goodput)
    curve = hull_increments(np.concatenate([[0.0], goodput / goodput[0]]))
    mu = flow_weights([curve] * 3, np.ones(3), cluster.total_cpus)
    got = np.array([w[j] / tie[j] for j in ("long", "new", "near")])
    np.testing.assert_allclose(got / got[-1], mu / mu[-1])
    assert got[0] < got[1] < got[2]


def test_fair_jct_orders_jobs_by_remaining_time_on_their_whole_speedup_curve():
    m = _model()
    cluster = Cluster.uniform(1, 4)
    ref, total = reference_rate(m), 10000.0
    _, phi_one = _rates(m, 1)
    _, phi_two = _rates(m, 2)  # the fair share of two jobs on 4 CPUs
    goodput = np.asarray(m.optimize(np.ones(4, dtype=int), np.arange(1, 5)).goodput)
    whole = goodput[3] / goodput[1]  # the scaling job's speedup at its cap over its fair share

    def weights(scaling_done: float) -> dict[str, float]:
        pol = FairJctPolicy(bound=None)
        pol._history = _history([total], m)
        views = [_view("single", goodput_model=m, max_replicas=1, progress=7000.0 * ref),
                 _view("scaling", goodput_model=m, max_replicas=4, progress=scaling_done * ref)]
        w, tie = pol.weights(cluster, views), PolluxPolicy().weights(cluster, views)
        return {j: w[j] / tie[j] for j in w}

    single_left = (total - 7000.0) / phi_one
    # 4000 done: longer than the single-replica job on a fair share, shorter on its whole curve
    assert (total - 4000.0) / phi_two > single_left > (total - 4000.0) / phi_two / whole
    assert weights(4000.0) == pytest.approx(weights(7000.0))  # ordered first, as when shorter on both
    assert weights(4000.0) != pytest.approx(weights(1000.0))  # 1000 done: longer on both, ordered last
    assert (total - 1000.0) / phi_two / whole > single_left


def test_fair_jct_rank_weighting_weights_jobs_by_their_rank_in_remaining_time():
    m = _model()
    cluster = Cluster.uniform(1, 4)
    pol = FairJctPolicy(bound=None, weighting="rank")
    views = _three_sizes(pol, m)
    tie = PolluxPolicy().weights(cluster, views)
    w = pol.weights(cluster, views)
    # ranks from the longest: long 1, new 2, near 3 (one model: the fair-share rates cancel)
    assert w["near"] == pytest.approx(tie["near"])
    assert w["new"] == pytest.approx(tie["new"] * (2 / 3) ** RANK_POWER)
    assert w["long"] == pytest.approx(tie["long"] * (1 / 3) ** RANK_POWER)
    # rank_power 0: every job as in Pollux; "rate": the expected completion rates 1 / R
    pol0 = FairJctPolicy(bound=None, weighting="rank", rank_power=0.0)
    assert pol0.weights(cluster, _three_sizes(pol0, m)) == pytest.approx(tie)
    rate = FairJctPolicy(bound=None, weighting="rate")
    w = rate.weights(cluster, _three_sizes(rate, m))
    assert w["long"] / w["near"] == pytest.approx(tie["long"] / tie["near"] * 1000.0 / 9850.0)


def test_fair_jct_predicts_rho_against_the_submitted_configuration_on_a_fair_share():
    m = _model()
    cluster = Cluster.uniform(1, 4)
    pol = FairJctPolicy()
    views = _three_sizes(pol, m)
    pol.weights(cluster, views)
    out = pol._outlook
    ref, phi = _rates(m, 2)  # the fair share of 3 jobs on 4 CPUs: 2 replicas
    sub = isolated_rate(m, 4 / 3, 128, 4, 4)
    # a job that has not started is taken as short as a job may be
    iso_new = MIN_WORK_S * ref / sub
    assert out.isolated_s[0] == pytest.approx(iso_new)
    assert out.rho[0] == pytest.approx((0.0 + MIN_WORK_S / phi) / iso_new)
    iso_near = (9000.0 + 1000.0) * ref / sub
    assert out.rho[2] == pytest.approx((20000.0 + 1000.0 / phi) / iso_near)
    assert out.lookahead_s == DEFAULT_LOOKAHEAD_S


def test_fair_jct_keeps_a_job_at_the_bound_running_beside_a_shorter_one():
    m = _model()
    cluster = Cluster.uniform(1, 4)
    pol = FairJctPolicy()
    pol._history = _history([100.0, 100.0, 100.0, 10000.0, 10000.0, 10000.0], m)
    running = dict(placement={"n0": 4}, state=JobState.RUNNING)
    short = _view("short", goodput_model=m, progress=9000.0 * reference_rate(m), age=100.0, **running)
    waited = _view("waited", goodput_model=m, progress=150.0 * reference_rate(m), age=40000.0)
    unbounded = FairJctPolicy(bound=None)
    unbounded._history = pol._history

    def held(policy):
        return sum(policy.decide(0.0, cluster, [short, waited]).placement.get("waited", {}).values())

    assert held(unbounded) == 0  # the shorter job's weight takes every CPU
    assert held(pol) >= 1


def test_fair_jct_refuses_a_nonlinear_objective():
    with pytest.raises(InvalidProblem, match=r"options.p must be 1, got -1"):
        FairJctPolicy(options=Options(p=-1.0))


def test_fair_jct_explores_further_than_pollux():
    m = _model()
    cluster = Cluster.uniform(4, 4)
    v = _view("a", goodput_model=m, max_replicas=16, max_profiled_replicas=2)
    assert PolluxPolicy().allocator_jobs(cluster, [v])[0].max_replicas == 2 * EXPLORATION_FACTOR
    assert FairJctPolicy().allocator_jobs(cluster, [v])[0].max_replicas == 2 * FAIR_JCT_EXPLORATION


def test_fair_jct_priority_weight_multiplies_the_weight():
    pol = FairJctPolicy()
    views = [_view("a"), _view("b", weight=3.0)]
    tie = PolluxPolicy().weights(Cluster.uniform(1, 4), [_view("a"), _view("b")])
    w = pol.weights(Cluster.uniform(1, 4), views)
    assert w["b"] / w["a"] == pytest.approx(3.0 * tie["b"] / tie["a"])


def test_fair_jct_is_registered_for_real_jobs():
    assert "fair-jct" in POLICIES and "fair-jct" in policy_names()
    policy = make_policy("fair-jct", bound=None, rank_power=1.0)
    assert type(policy) is FairJctPolicy and (policy.bound, policy.rank_power) == (None, 1.0)
    assert make_policy("fair-jct").bound == FAIRNESS_BOUND


class _Oracle:
    """Each job's true remaining steps at the initial batch (steps = progress there)."""

    def __init__(self, remaining):
        self.remaining = remaining

    def remaining_steps(self, job_id, batch_size):
        return self.remaining[job_id]


def test_the_oracle_bound_uses_the_true_remaining_work_and_run_refuses_it():
    assert "fair-jct-oracle" not in policy_names()  # real runs cannot provide the oracle
    with pytest.raises(InvalidProblem, match=r"policy 'fair-jct-oracle' needs the simulator's step oracle"):
        make_policy("fair-jct-oracle")
    with pytest.raises(InvalidProblem, match=r"fair-jct-oracle needs the simulator's step oracle \(oracle=None\)"):
        FairJctOraclePolicy()
    m = _model()
    rate = reference_rate(m)
    pol = FairJctOraclePolicy(oracle=_Oracle({"a": 1000.0 * rate, "b": 4000.0 * rate}))
    views = [_view("a", goodput_model=m), _view("b", goodput_model=m)]
    est = pol.estimates(Cluster.uniform(1, 4), views)
    assert est["a"].remaining == pytest.approx(1000.0) and est["b"].remaining == pytest.approx(4000.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"bound": 1.0}, r"bound"),
        ({"rank_power": -1.0}, r"rank_power"),
        ({"weighting": "size"}, r"weighting"),
        ({"past_bound": "never"}, r"past_bound"),
        ({"exploration_factor": 0}, r"exploration_factor"),
    ],
)
def test_fair_jct_rejects_bad_options(kwargs, match):
    with pytest.raises(InvalidProblem, match=match):
        FairJctPolicy(**kwargs)


# ---------------------------------------------------------------- priorities
#: A synthetic application (the step-time model itself as the truth): runs in well under a second.
SYNTH = ParametricProfile("synth", max_epochs=20, epoch_progress=400.0)


def _weighted_backend(weights):
    """A simulator of two identical jobs on 1 x 4, differing only in their workload ``weight``."""
    jobs = [WorkloadJob(id=j, kind="synth", arrival_s=0.0, replicas=2, batch_size=256, weight=weights[j])
            for j in ("a", "b")]
    return SimBackend(jobs, {"synth": SYNTH}, Cluster.uniform(1, 4))


@pytest.mark.parametrize("policy", ["pollux", "fair-jct"])
def test_a_heavier_job_never_finishes_later(policy):
    # "b" is the heavier one: Pollux's tie-break (by job id) alone would favour "a".
    backend = _weighted_backend({"a": 1.0, "b": 4.0})
    run_loop(backend, make_policy(policy), backend.cluster, NullLog(), interval=120.0, max_rounds=1000)
    jct = backend.jcts()
    assert set(jct) == {"a", "b"}
    assert jct["b"] < jct["a"]


def test_equal_weights_finish_together_under_pollux():
    """The reference of the test above: with equal weights neither job is favoured."""
    backend = _weighted_backend({"a": 1.0, "b": 1.0})
    run_loop(backend, make_policy("pollux"), backend.cluster, NullLog(), interval=120.0, max_rounds=1000)
    jct = backend.jcts()
    assert jct["a"] == pytest.approx(jct["b"])


def test_equal_weights_under_fair_jct_favour_the_tie_break():
    """The reference of the test above for fair-jct: of two equal jobs the one the
    tie-break favours ("a") gets ahead, and the remaining-work weights then run it
    first (it is the shorter one left), so the heavier "b" above overcame both."""
    backend = _weighted_backend({"a": 1.0, "b": 1.0})
    run_loop(backend, make_policy("fair-jct"), backend.cluster, NullLog(), interval=120.0, max_rounds=1000)
    jct = backend.jcts()
    assert jct["a"] < jct["b"]
