"""Each policy's decisions on hand-made views, and the policy registry."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pollux_opt import Cluster, InvalidProblem, Options
from pollux_opt.lifecycle import JobState
from pollux_opt.model import restart_factor, to_problem
from pollux_opt.agent.batch import choose_batch
from pollux_opt.model import BatchLimits, GoodputModel, GradientStats, ThroughputParams
from pollux_opt.scheduling.policies import (
    POLICIES,
    DynamicPolicy,
    FixedPolicy,
    OptimusPolicy,
    PolluxPolicy,
    Requirement,
    TiresiasPolicy,
    make_policy,
    policy_names,
    registered_policies,
)
from pollux_opt.scheduling.policies.packing import pack, take
from pollux_opt.scheduling.policies.views import fair_share, job_for_allocator, replica_cap
from pollux_opt.scheduling.loop import Decision, DecisionStatus, JobView, Policy


def view(job_id, *, t=0.0, state=JobState.QUEUED, placement=None, model=None, replicas=1, batch=32,
         max_replicas=8, min_replicas=1, age=100.0, restarts=0, delay=5.0, fixed=False):
    """A job's view; with ``fixed``, one that trains at its submitted ``batch``."""
    return JobView(
        job_id=job_id, submit_time=t, state=state, placement=placement or {}, restarts=restarts, age=age,
        min_replicas=min_replicas, max_replicas=max_replicas, submitted_replicas=replicas,
        submitted_batch_size=batch, goodput_model=model, restart_delay=delay, progress=0.0,
        attained_service=0.0, fixed_batch_size=batch if fixed else None,
    )


def model(*, noise: float, alpha_n: float = 0.002, m0: int = 32, max_batch: int = 4096) -> GoodputModel:
    """A CPU-like job: 5 ms + 1 ms/sample compute, small intra-node sync, gradient noise ``noise``."""
    return GoodputModel(
        ThroughputParams(0.005, 0.001, alpha_n, 0.0005, 0.02, 0.002, 1.5),
        GradientStats(grad_sqr=1.0, grad_var=noise / m0, init_batch_size=m0),
        BatchLimits(init_batch_size=m0, max_batch_size=max_batch, max_local_bsz=1024),
    )


def used(decision: Decision) -> int:
    return sum(sum(p.values()) for p in decision.placement.values())


def test_registry_and_protocol():
    assert list(POLICIES) == ["fixed", "dynamic", "pollux", "pollux-unaware", "sia", "fair-jct", "tiresias", "optimus",
                              "fair-jct-oracle"]
    assert registered_policies() == dict(POLICIES)
    for name, info in POLICIES.items():
        assert info.name == name and info.description
        policy = make_policy(name, provides={Requirement.ORACLE: object()})
        assert policy.name == name and type(policy) is info.factory
        assert isinstance(policy, Policy)
    assert make_policy("fixed").fixed_batch and not make_policy("pollux").fixed_batch
    assert make_policy("dynamic").fixed_batch and make_policy("tiresias").fixed_batch and not make_policy("sia").fixed_batch
    with pytest.raises(InvalidProblem, match=r"unknown policy 'gavel'; choose one of "
                                             r"\['dynamic', 'fair-jct', 'fair-jct-oracle', 'fixed', 'optimus', 'pollux', "
                                             r"'pollux-unaware', 'sia', 'tiresias'\]"):
        make_policy("gavel")


def test_registry_records_what_each_policy_needs_from_its_backend():
    assert {name: info.needs for name, info in POLICIES.items()} == {
        "fixed": (), "dynamic": (), "pollux": (), "pollux-unaware": (), "sia": (), "fair-jct": (), "tiresias": (),
        "optimus": (Requirement.ORACLE,), "fair-jct-oracle": (Requirement.ORACLE,)}
    assert policy_names() == ("fixed", "dynamic", "pollux", "pollux-unaware", "sia", "fair-jct",
                              "tiresias")  # what real runs accept
    assert policy_names([Requirement.ORACLE]) == tuple(POLICIES)  # the simulator provides the oracle
    with pytest.raises(InvalidProblem, match=r"policy 'optimus' needs the simulator's step oracle \(each job's "
                                             r"true remaining steps and step times, which a run of real jobs "
                                             r"cannot know\): run it with `pollux-opt simulate`"):
        make_policy("optimus")
    oracle = object()
    assert make_policy("optimus", provides={Requirement.ORACLE: oracle}).oracle is oracle
    assert make_policy("optimus", oracle=oracle).oracle is oracle
    assert make_policy("tiresias", provides={Requirement.ORACLE: oracle}, thresholds=(10.0,)).thresholds == (10.0,)


def test_make_policy_names_an_unknown_option():
    with pytest.raises(InvalidProblem, match=r"policy 'fixed' has no option\(s\) \['foo'\]; its options are "
                                             r"\['fixed_batch', 'name'\]"):
        make_policy("fixed", foo=1)
    assert make_policy("pollux", exploration_factor=3).exploration_factor == 3
    with pytest.raises(InvalidProblem, match=r"exploration_factor must be an integer >= 1, got 0"):
        make_policy("pollux", exploration_factor=0)


# ------------------------------------------------------------------- fixed
def test_fixed_is_fifo_gang_with_submitted_cpus_and_never_moves_running_jobs():
    cluster = Cluster.uniform(1, 4)
    jobs = [
        view("run", t=0, state=JobState.RUNNING, placement={"n0": 1}, replicas=1),
        view("late", t=30, replicas=1),
        view("first", t=10, replicas=2, batch=64),
        view("second", t=20, replicas=2),
    ]
    d = FixedPolicy().decide(100.0, cluster, jobs)
    assert d.placement["run"] == {"n0": 1}          # untouched
    assert d.placement["first"] == {"n0": 2}        # head of the queue, its submitted 2 CPUs
    assert d.placement["second"] == {}              # 1 CPU left: does not fit, blocks ...
    assert d.placement["late"] == {}                # ... the job behind it (strict FIFO)
    assert d.status is DecisionStatus.FIFO and d.status == "fifo" and math.isnan(d.objective)


def test_fixed_packs_gangs_on_one_node_then_spreads():
    cluster = Cluster.uniform(2, 2)
    d = FixedPolicy().decide(0.0, cluster, [view("a", t=0, replicas=1), view("b", t=1, replicas=2)])
    assert d.placement["a"] == {"n0": 1}
    assert d.placement["b"] == {"n1": 2}
    d = FixedPolicy().decide(0.0, cluster, [view("big", replicas=3), view("small", t=1, replicas=1)])
    assert sum(d.placement["big"].values()) == 3 and len(d.placement["big"]) == 2
    assert d.placement["small"] == {"n0": 1} or d.placement["small"] == {"n1": 1}
    assert used(d) == 4


def test_fixed_clamps_a_request_larger_than_the_cluster():
    d = FixedPolicy().decide(0.0, Cluster.uniform(1, 2), [view("huge", replicas=16, max_replicas=16)])
    assert d.placement["huge"] == {"n0": 2}


def test_fixed_runs_the_submitted_cpus_whatever_the_job_has_been_measured_on():
    """The exploration cap is the allocator policies' rule: a never-measured job
    submitted with 3 CPUs starts on 3 under the fixed policy, on 1 under Pollux."""
    cluster = Cluster.uniform(1, 4)
    v = replace(view("a", replicas=3), max_profiled_replicas=0)
    assert FixedPolicy().decide(0.0, cluster, [v]).placement["a"] == {"n0": 3}
    assert PolluxPolicy().decide(0.0, cluster, [v]).placement["a"] == {"n0": 1}


# ----------------------------------------------------------------- dynamic
def test_dynamic_gives_idle_cpus_to_jobs():
    cluster = Cluster.uniform(1, 4)
    m = model(noise=1000.0)
    jobs = [view("a", model=m, batch=64, fixed=True), view("b", t=1, model=m, batch=64, fixed=True)]
    d = DynamicPolicy().decide(0.0, cluster, jobs)
    assert used(d) == 4 and all(sum(p.values()) == 2 for p in d.placement.values())
    assert d.status == "optimal" and d.objective > 0


def test_dynamic_ignores_statistical_efficiency():
    """Two jobs with the same throughput model but different gradient noise: the
    throughput-only policy treats them alike at the submitted batch; under Pollux
    the noisy job grows its batch on its allocation (large batches keep its
    efficiency) and the quiet one does not."""
    cluster = Cluster.uniform(1, 6)
    quiet, noisy = model(noise=1.0), model(noise=5000.0)
    jobs = [view("quiet", model=quiet, batch=32), view("noisy", t=1, model=noisy, batch=32)]
    dyn = DynamicPolicy().decide(0.0, cluster, [replace(v, fixed_batch_size=32) for v in jobs])
    pol = PolluxPolicy().decide(0.0, cluster, jobs)
    k = lambda d, j: sum(d.placement[j].values())  # noqa: E731
    assert k(dyn, "quiet") == k(dyn, "noisy") == 3  # identical throughput models

    def chosen(j: str, m: GoodputModel) -> int:
        p = pol.placement[j]
        return choose_batch(m.limits, len(p), k(pol, j), m).total_batch(k(pol, j))

    assert chosen("noisy", noisy) > 4 * 32 and chosen("quiet", quiet) < 2 * 32


# ------------------------------------------------------------------ pollux
def test_pollux_unmeasured_jobs_get_the_linear_prior_within_the_exploration_cap():
    cluster = Cluster.uniform(1, 8)
    d = PolluxPolicy().decide(0.0, cluster, [view("new")])
    assert d.placement["new"] == {"n0": 1}  # never measured: one replica
    m = model(noise=5000.0)
    for profiled, expected in [(1, 2), (2, 4), (3, 6), (None, 8)]:
        v = replace(view("a", model=m), max_profiled_replicas=profiled)
        assert sum(PolluxPolicy().decide(0.0, cluster, [v]).placement["a"].values()) == expected
    # the cap never goes below the job's own minimum
    v = replace(view("b", min_replicas=3), max_profiled_replicas=0)
    assert sum(DynamicPolicy().decide(0.0, cluster, [v]).placement["b"].values()) == 3
    # the factor is the policy's option
    v = replace(view("a", model=m), max_profiled_replicas=2)
    assert sum(PolluxPolicy(exploration_factor=3).decide(0.0, cluster, [v]).placement["a"].values()) == 6


def test_replica_cap_is_the_exploration_cap_within_the_jobs_and_the_clusters_limits():
    cluster = Cluster.uniform(2, 4)
    m = model(noise=1.0)
    cases = [  # (max_replicas, max_profiled_replicas, goodput model, cap)
        (64, 0, None, 1), (64, 3, m, 6), (5, 3, m, 5), (64, 5, m, 8), (64, None, m, 8), (64, None, None, 1)]
    for max_replicas, profiled, mdl, cap in cases:
        v = replace(view("a", model=mdl, max_replicas=max_replicas, min_replicas=0), max_profiled_replicas=profiled)
        assert replica_cap(v, cluster) == cap, (max_replicas, profiled)
        assert job_for_allocator(v, cluster, Options()).max_replicas == cap
    assert replica_cap(replace(view("a", model=m), max_profiled_replicas=1), cluster, exploration_factor=3) == 3


def test_pollux_restart_penalty_uses_each_jobs_measured_delay():
    """A running job is moved only if the gain beats its own restart penalty."""
    cluster = Cluster.uniform(1, 4)
    m = model(noise=2000.0)
    # A young job whose restarts are slow stays where it is; one whose restarts are fast grows.
    slow = view("a", state=JobState.RUNNING, placement={"n0": 1}, model=m, age=20.0, delay=60.0)
    fast = view("a", state=JobState.RUNNING, placement={"n0": 1}, model=m, age=20.0, delay=0.5)
    assert PolluxPolicy().decide(0.0, cluster, [slow]).placement["a"] == {"n0": 1}
    assert sum(PolluxPolicy().decide(0.0, cluster, [fast]).placement["a"].values()) == 4


def test_job_for_allocator_passes_the_jobs_own_delay():
    options = Options(restart_delay=30.0)
    cluster = Cluster.uniform(1, 2)
    for age, restarts, delay in [(100.0, 2, 5.0), (12.0, 1, 10.0), (1000.0, 0, 0.25), (50.0, 3, 0.0)]:
        job = job_for_allocator(view("a", age=age, restarts=restarts, delay=delay), cluster, options)
        assert (job.age, job.restarts, job.restart_delay) == (age, restarts, delay)
        problem = to_problem(cluster, [job], options)
        assert problem.restart_factor[0] == restart_factor(age, restarts, delay)
    assert restart_factor(50.0, 3, 0.0) == 1.0  # a free restart


def test_fair_share_is_an_exclusive_one_over_j_share_of_the_cluster():
    assert fair_share(Cluster.uniform(16, 4), 160) == (1, 1)
    assert fair_share(Cluster.uniform(16, 4), 10) == (2, 7)  # ceil(64 / 10) on the fewest nodes
    assert fair_share(Cluster.uniform(1, 8), 3) == (1, 3)
    with pytest.raises(InvalidProblem, match="num_jobs must be an integer >= 1, got 0"):
        fair_share(Cluster.uniform(1, 8), 0)


def test_speedups_are_measured_against_the_fair_share(monkeypatch):
    cluster, options = Cluster.uniform(2, 4), Options()
    m = model(noise=2000.0)
    job = job_for_allocator(view("a", model=m), cluster, options, share=(2, 6))
    assert job.base == (1, 6)  # the share's replicas on one node, as Pollux's simulator
    # reduced to what the job can run: a submitted batch of 4 has at most 4 one-sample micro-batches
    job = job_for_allocator(view("a", model=m, batch=4, fixed=True), cluster, options, share=(2, 6))
    assert job.base == (1, 4)
    prior = job_for_allocator(view("new"), cluster, options, share=(1, 4))
    assert prior.speedup[(1, 1)] == pytest.approx(0.25)  # linear prior over the same base
    # The policy uses the fair share of the jobs it allocates: 8 CPUs / 2 jobs.
    seen = {}
    original = PolluxPolicy.decide.__globals__["solve"]

    def spy(cluster, jobs, options, **kwargs):
        seen.update({j.id: j.base for j in jobs})
        return original(cluster, jobs, options, **kwargs)

    monkeypatch.setitem(PolluxPolicy.decide.__globals__, "solve", spy)
    PolluxPolicy().decide(0.0, cluster, [view("a", model=m), view("b", model=m, t=1.0)])
    PolluxPolicy(fair_share_base=False).decide(0.0, cluster, [view("c", model=m)])
    assert seen == {"a": (1, 4), "b": (1, 4), "c": (1, 1)}


def test_pollux_interference_avoidance_keeps_distributed_jobs_apart():
    cluster = Cluster.uniform(2, 2)
    m = model(noise=5000.0, alpha_n=0.0)
    jobs = [view(j, t=i, model=m, max_replicas=4) for i, j in enumerate("ab")]
    d = PolluxPolicy().decide(0.0, cluster, jobs)
    spread = [j for j, p in d.placement.items() if len(p) > 1]
    assert len(spread) <= 1
    # without the constraint both would be allowed to span the two nodes (checked by the allocator tests)


def test_completed_and_failed_views_are_ignored():
    cluster = Cluster.uniform(1, 2)
    for policy in (FixedPolicy(), DynamicPolicy(), PolluxPolicy()):
        d = policy.decide(0.0, cluster, [view("done", state=JobState.SUCCEEDED), view("x", state=JobState.FAILED)])
        assert used(d) == 0 and "done" not in d.placement


@pytest.mark.parametrize("policy", [DynamicPolicy(), PolluxPolicy()])
def test_oversubscribed_cluster_keeps_running_jobs_and_admits_first_come_first(policy):
    """With more jobs than CPUs the objective is the same whichever jobs wait:
    the tie-break weights keep the solver from swapping running and waiting jobs every round."""
    cluster = Cluster.uniform(1, 2)
    m = model(noise=100.0)
    jobs = [view("d", t=3, model=m), view("c", t=2, model=m),
            view("b", t=1, state=JobState.RUNNING, placement={"n0": 1}, model=m, age=30),
            view("a", t=0, state=JobState.RUNNING, placement={"n0": 1}, model=m, age=30)]
    for _ in range(3):
        d = policy.decide(40.0, cluster, jobs)
        assert d.placement["a"] == d.placement["b"] == {"n0": 1}
        assert d.placement["c"] == d.placement["d"] == {}
    jobs = [view("d", t=3, model=m), view("c", t=2, model=m),
            view("a", t=0, state=JobState.RUNNING, placement={"n0": 1}, model=m, age=30)]
    d = policy.decide(40.0, cluster, jobs)
    assert d.placement["a"] == {"n0": 1} and d.placement["c"] == {"n0": 1} and d.placement["d"] == {}


@pytest.mark.parametrize("policy", [FixedPolicy(), DynamicPolicy(), PolluxPolicy()])
def test_over_committed_views_are_made_to_fit(policy):
    """A backend may briefly report more replicas on a node than it has; the
    youngest job there is treated as holding nothing instead of crashing the allocator."""
    cluster = Cluster.uniform(1, 2)
    jobs = [view("old", t=0, state=JobState.RUNNING, placement={"n0": 2}, model=model(noise=10.0)),
            view("young", t=5, state=JobState.RUNNING, placement={"n0": 1}, model=model(noise=10.0))]
    d = policy.decide(10.0, cluster, jobs)
    assert used(d) <= 2
    if policy.name == "fixed":
        assert d.placement["old"] == {"n0": 2} and d.placement["young"] == {}


def test_unknown_node_in_a_view_is_an_error():
    with pytest.raises(InvalidProblem, match=r"job 'a': placement on unknown node 'n9'"):
        FixedPolicy().decide(0.0, Cluster.uniform(1, 2), [view("a", state=JobState.RUNNING, placement={"n9": 1})])


# ------------------------------------------------------------------ packing
def test_take_is_best_fit_on_one_node_else_most_free_first():
    rank = {"n0": 0, "n1": 1, "n2": 2}
    free = {"n0": 3, "n1": 2, "n2": 3}
    assert take(free, 2, rank) == {"n1": 2} and free == {"n0": 3, "n1": 0, "n2": 3}  # tightest fit
    assert take(free, 3, rank) == {"n0": 3} and free["n0"] == 0  # tie: the first node listed
    free = {"n0": 1, "n1": 2, "n2": 2}
    assert take(free, 4, rank) == {"n1": 2, "n2": 2}  # no node fits: most free first
    assert take(free, 2, rank) is None and free == {"n0": 1, "n1": 0, "n2": 0}  # does not fit: unchanged


def test_take_fills_the_fullest_nodes_then_fits_the_rest_most_tightly():
    rank = {f"n{i}": i for i in range(4)}
    free = {n: 4 for n in rank}
    assert take(free, 6, rank) == {"n0": 4, "n1": 2}
    assert take(free, 6, rank) == {"n2": 4, "n1": 2}  # the rest where 2 are free: n3 stays whole
    assert take(free, 4, rank) == {"n3": 4} and sum(free.values()) == 0


def test_pack_puts_each_job_on_as_few_nodes_as_it_fits():
    """Tiresias' consolidation: two 4-replica jobs on two free 4-CPU nodes get
    one node each, also when both were running split 2 + 2 over the two."""
    c = Cluster.uniform(2, 4)
    one_each = {"a": {"n0": 4}, "b": {"n1": 4}}
    assert pack(c, {"a": 4, "b": 4}, {}, ["a", "b"]) == one_each
    split = {"n0": 2, "n1": 2}
    assert pack(c, {"a": 4, "b": 4}, {"a": split, "b": split}, ["a", "b"]) == one_each
    # 6 + 6 + 4 replicas on 4 nodes: the 4-replica job still gets a whole node.
    c4 = Cluster.uniform(4, 4)
    out = pack(c4, {"x": 6, "y": 6, "z": 4}, {}, ["x", "y", "z"])
    assert out == {"x": {"n0": 4, "n1": 2}, "y": {"n2": 4, "n1": 2}, "z": {"n3": 4}}


def test_pack_moves_a_spread_job_only_onto_fewer_nodes():
    c = Cluster.uniform(2, 4)
    # a and b fill each node's other half: a, spread, has no fewer-node placement and keeps its own.
    current = {"a": {"n0": 2, "n1": 2}, "b": {"n0": 2}, "c": {"n1": 2}}
    assert pack(c, {"a": 4, "b": 2, "c": 2}, current, ["b", "c", "a"]) == current
    # x spans no more nodes than 6 replicas need and stays; y (2 replicas on two nodes) moves to one.
    c4 = Cluster.uniform(4, 4)
    out = pack(c4, {"x": 6, "y": 2}, {"x": {"n1": 4, "n2": 2}, "y": {"n0": 1, "n3": 1}}, ["x", "y"])
    assert out == {"x": {"n1": 4, "n2": 2}, "y": {"n2": 2}}


def test_tiresias_consolidates_two_jobs_split_over_the_same_two_nodes():
    split = {"n0": 2, "n1": 2}
    jobs = [view(j, state=JobState.RUNNING, placement=split, replicas=4, t=i) for i, j in enumerate(("a", "b"))]
    d = TiresiasPolicy().decide(0.0, Cluster.uniform(2, 4), jobs)
    assert d.placement == {"a": {"n0": 4}, "b": {"n1": 4}}


def test_pack_keeps_placements_whose_count_is_unchanged_and_refuses_what_does_not_fit():
    c = Cluster.uniform(2, 4)
    assert pack(c, {"a": 1, "b": 3}, {"b": {"n1": 3}}, ["a", "b"]) == {"a": {"n1": 1}, "b": {"n1": 3}}
    with pytest.raises(InvalidProblem, match=r"pack: job 'b' wants 6 replicas, only 4 free"):
        pack(c, {"a": 4, "b": 6}, {}, ["a", "b"])


# ------------------------------------------------------------- baselines
def test_tiresias_runs_the_submitted_configuration_within_the_jobs_range():
    cluster = Cluster.uniform(2, 4)
    jobs = [view("a", replicas=3, batch=64), view("b", t=1, replicas=6, max_replicas=4)]
    d = TiresiasPolicy().decide(0.0, cluster, jobs)
    assert d.placement == {"a": {"n1": 3}, "b": {"n0": 4}} or d.placement == {"a": {"n0": 3}, "b": {"n1": 4}}
    assert d.status is DecisionStatus.LAS_2D and math.isnan(d.solver_seconds)  # the loop times decisions
    assert d.allocator_seconds == 0.0  # no solver


def test_optimus_without_an_oracle_uses_the_fitted_models():
    cluster = Cluster.uniform(1, 4)
    m = model(noise=1.0)
    d = OptimusPolicy().decide(0.0, cluster, [view("a", model=m, batch=64), view("b", t=1, batch=64)])
    assert used(d) == 4 and all(d.placement[j] for j in "ab")
    assert d.status is DecisionStatus.GREEDY
