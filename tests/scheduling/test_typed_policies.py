"""The heterogeneity-aware policies (pollux, sia) and the unaware baseline on hand-made views."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pollux_opt import InvalidProblem
from pollux_opt.lifecycle import JobState
from pollux_opt.model import BatchLimits, Cluster, GoodputModel, GradientStats, Job, Options, ThroughputParams
from pollux_opt.model.cluster_types import ClusterTypes, NodeType
from pollux_opt.model.projection import project_params
from pollux_opt.model.typed import TypedGoodput
from pollux_opt.scheduling.loop import JobView
from pollux_opt.scheduling.policies import PolluxPolicy, PolluxUnawarePolicy, SiaPolicy, make_policy
from pollux_opt.scheduling.policies.sia_params import SIA_LAMBDA_NO_ALLOC, SIA_P, sia_restart_penalty
from pollux_opt.scheduling.policies.views import fair_share, job_for_allocator

_PARAMS = ThroughputParams(0.005, 0.001, 0.002, 0.0005, 0.02, 0.002, 1.5)


def model(speed: float = 1.0, *, noise: float = 4.0, max_local: int = 256, m0: int = 32) -> GoodputModel:
    return GoodputModel(project_params(_PARAMS, speed), GradientStats(1.0, noise / m0, m0),
                        BatchLimits(init_batch_size=m0, max_batch_size=4096, max_local_bsz=max_local))


def view(job_id, models=None, *, single=None, placement=None, age=1000.0, restarts=0, profiled=8, t=0.0):
    return JobView(
        job_id=job_id, submit_time=t, state=JobState.RUNNING if placement else JobState.QUEUED, placement=placement or {},
        restarts=restarts, age=age, min_replicas=0, max_replicas=16, submitted_replicas=1, submitted_batch_size=32,
        goodput_model=single if single is not None else (models or {}).get("slow"), restart_delay=30.0,
        progress=0.0, attained_service=0.0, max_profiled_replicas=profiled, goodput_models=models,
    )


def two_types(slow_nodes=2, fast_nodes=1):
    return Cluster.from_types(ClusterTypes((NodeType("slow", slow_nodes, 4), NodeType("fast", fast_nodes, 4))))


def types_of(cluster, placement):
    kinds = {n.id: n.type for n in cluster.nodes}
    return {kinds[nid] for nid in placement}


def test_job_for_allocator_gives_per_type_models_over_the_slot_weighted_fair_share_goodput():
    cluster = two_types(slow_nodes=2, fast_nodes=1)  # 8 slow slots, 4 fast ones
    v = view("a", {"slow": model(1.0), "fast": model(3.0)})
    share = fair_share(cluster, 2)
    job = job_for_allocator(v, cluster, Options(), share=share)
    assert isinstance(job.speedup, TypedGoodput) and job.speedup.types == ("slow", "fast")
    assert job.speedup.base("slow") == job.speedup.base("fast") == (1, share[1])
    slow, fast = (float(model(s).optimize(1, share[1]).goodput) for s in (1.0, 3.0))
    assert fast > 2.0 * slow
    # a fair share of the whole cluster: 2/3 of it slow slots, 1/3 fast ones
    assert job.speedup.base_goodput() == pytest.approx((8 * slow + 4 * fast) / 12)
    # one type: the untyped model, unchanged
    flat = job_for_allocator(v, cluster.untyped(), Options(), share=share)
    assert flat.speedup is v.goodput_model


def _greedy():
    return Options(solver="greedy")


def test_aware_pollux_keeps_every_job_on_one_type_and_prefers_the_fast_one():
    cluster = two_types(slow_nodes=2, fast_nodes=1)
    decision = PolluxPolicy(options=_greedy()).decide(0.0, cluster, [view("a", {"slow": model(1.0),
                                                                               "fast": model(4.0)})])
    placement = decision.placement["a"]
    assert types_of(cluster, placement) == {"fast"}


def test_aware_pollux_never_spans_two_types():
    cluster = two_types(slow_nodes=1, fast_nodes=1)
    views = [view(f"j{i}", {"slow": model(1.0, noise=50.0), "fast": model(2.0, noise=50.0)}) for i in range(3)]
    decision = PolluxPolicy(options=_greedy()).decide(0.0, cluster, views)
    for p in decision.placement.values():
        assert len(types_of(cluster, p)) <= 1


def test_unaware_pollux_sees_one_type_and_the_single_model():
    cluster = two_types(slow_nodes=1, fast_nodes=1)
    # per-type models say "fast only"; the single model (all an unaware scheduler has) scales to 8
    v = view("a", {"slow": model(1.0), "fast": model(4.0)}, single=model(1.0, noise=500.0))
    aware = PolluxPolicy(options=_greedy()).decide(0.0, cluster, [v])
    assert types_of(cluster, aware.placement["a"]) == {"fast"}
    decision = PolluxUnawarePolicy(options=_greedy()).decide(0.0, cluster, [v])
    assert sum(decision.placement["a"].values()) == 8  # both types as one pool
    assert types_of(cluster, decision.placement["a"]) == {"slow", "fast"}


def test_sia_picks_sia_configurations_on_one_type_each():
    cluster = Cluster.from_types(ClusterTypes((NodeType("slow", 2, 4), NodeType("fast", 1, 8))))
    views = [view(f"j{i}", {"slow": model(1.0), "fast": model(3.0)}) for i in range(3)]
    decision = SiaPolicy().decide(0.0, cluster, views)
    assert decision.status.value == "optimal" and math.isfinite(decision.objective)
    sizes = {1, 2, 4, 8}
    for jid, p in decision.placement.items():
        assert p, f"{jid} left without resources"
        assert len(types_of(cluster, p)) == 1
        k = sum(p.values())
        assert (len(p) == 1 and k in sizes) or all(v == 4 for v in p.values())
    used = {t: sum(k for p in decision.placement.values() for nid, k in p.items()
                   if nid.startswith(t)) for t in ("slow", "fast")}
    assert used["slow"] <= 8 and used["fast"] <= 8


def test_sia_trades_admission_against_the_no_allocation_penalty():
    cluster = Cluster.from_types(ClusterTypes((NodeType("slow", 1, 2), NodeType("fast", 1, 2))))
    views = [view(f"j{i}", {"slow": model(1.0), "fast": model(2.0)}, t=float(i)) for i in range(5)]
    # lambda_n = 1.1 barely exceeds a one-GPU job's 1: two fast singles and a slow pair
    # (sum of A - lambda_n: 2 (0.71 - 1.1) + (0.74 - 1.1)) beat four singles (2 (0.71 - 1.1) + 2 (1 - 1.1))
    sizes = sorted(sum(p.values()) for p in SiaPolicy().decide(0.0, cluster, views).placement.values() if p)
    assert sizes == [1, 1, 2]
    # a larger penalty for waiting admits one job per GPU
    sizes = sorted(sum(p.values()) for p in
                   SiaPolicy(lambda_no_alloc=10.0).decide(0.0, cluster, views).placement.values() if p)
    assert sizes == [1, 1, 1, 1]


def test_sia_restart_factor_keeps_a_running_job_in_place():
    cluster = Cluster.from_types(ClusterTypes((NodeType("slow", 1, 4), NodeType("fast", 1, 4))))
    models = {"slow": model(1.0), "fast": model(1.1)}
    # an old job restarted many times: moving it costs nearly all of its speedup
    running = view("cifar10-0", models, placement={"slow-0": 4}, age=1000.0, restarts=30)
    decision = SiaPolicy().decide(0.0, cluster, [running])
    assert decision.placement["cifar10-0"] == {"slow-0": 4}
    fresh = replace(running, restarts=0)
    assert types_of(cluster, SiaPolicy().decide(0.0, cluster, [fresh]).placement["cifar10-0"]) == {"fast"}


def test_sia_restart_estimates_follow_the_model_in_the_job_name():
    assert sia_restart_penalty("imagenet-3") == 250.0 and sia_restart_penalty("yolov3-1") == 45.0
    assert sia_restart_penalty("ncf-2") == 30.0


def test_sia_without_models_spreads_by_the_linear_prior():
    cluster = two_types()
    views = [replace(view(f"j{i}", None, profiled=0), goodput_model=None) for i in range(2)]
    decision = SiaPolicy().decide(0.0, cluster, views)
    assert all(sum(p.values()) == 1 for p in decision.placement.values())  # exploration cap: one replica


def test_sia_options_are_checked():
    with pytest.raises(InvalidProblem, match=r"p must be"):
        make_policy("sia", p=0.5)
    assert make_policy("sia", lambda_no_alloc=2.0).lambda_no_alloc == 2.0


def test_one_type_cluster_pollux_equals_untyped_pollux():
    typed = Cluster.from_types(ClusterTypes((NodeType("aws", 2, 4),)))
    flat = Cluster(tuple(replace(n, type="default") for n in typed.nodes))
    views = [view(f"j{i}", None, single=model(1.0, noise=float(i + 1))) for i in range(3)]
    a = PolluxPolicy(options=_greedy()).decide(0.0, typed, views)
    b = PolluxPolicy(options=_greedy()).decide(0.0, flat, views)
    assert a.placement == b.placement and a.objective == b.objective


def test_configuration_packing_leaves_out_what_a_fragmented_type_cannot_hold():
    from pollux_opt.scheduling.policies.packing import pack_configurations

    cluster = Cluster.from_types(ClusterTypes((NodeType("six", 2, 6),)))
    nodes = list(cluster.node_ids)
    wanted = {"a": (1, 4), "b": (1, 4), "c": (1, 4)}  # 12 GPUs of 12, but two 4s do not share a 6-GPU node
    assert pack_configurations(cluster, nodes, wanted, {}) is None
    placed = pack_configurations(cluster, nodes, wanted, {}, strict=False)
    assert sorted(sum(p.values()) for p in placed.values()) == [4, 4]
    # a kept placement stays where it is; the rest pack around it, best fit (the fullest node that holds it)
    assert pack_configurations(cluster, nodes, {"a": (1, 2), "b": (2, 12)}, {"a": {"six-1": 2}}) is None
    assert pack_configurations(cluster, nodes, {"a": (1, 2), "b": (1, 4)}, {"a": {"six-1": 2}}) == {
        "a": {"six-1": 2}, "b": {"six-1": 4}}


def test_a_running_jobs_other_types_carry_its_restart_factor_once_more():
    from pollux_opt.model.allocate import to_problem
    from pollux_opt.model.job import restart_factor
    from pollux_opt.scheduling.policies.views import type_move_factors

    cluster = two_types()
    models = {"slow": model(1.0), "fast": model(3.0)}
    running = view("a", models, placement={"slow-0": 2}, age=1000.0, restarts=2)
    r = restart_factor(1000.0, 2, 30.0)
    assert 0.0 < r < 1.0
    assert type_move_factors(running, cluster, ("slow", "fast")) == {"fast": pytest.approx(r)}
    assert type_move_factors(view("b", models), cluster, ("slow", "fast")) == {}  # holds nothing
    assert type_move_factors(replace(running, restarts=0, age=0.0), cluster, ("slow", "fast")) == {}  # r = 0

    def speedups(v):
        problem = to_problem(cluster, [job_for_allocator(v, cluster, Options())], Options())
        return {t: problem.cfg_speedup[problem.cfg_type == i] for i, t in enumerate(cluster.types)}

    moved, pending = speedups(running), speedups(replace(running, placement={}, state=JobState.QUEUED))
    np.testing.assert_allclose(moved["slow"], pending["slow"])
    np.testing.assert_allclose(moved["fast"], pending["fast"] * r)


def test_typed_goodput_factors_are_checked_and_leave_the_base_alone():
    models = {"slow": model(1.0), "fast": model(3.0)}
    bases = {"slow": (1, 2), "fast": (1, 2)}
    plain = TypedGoodput.of(models, bases)
    scaled = TypedGoodput.of(models, bases, {"fast": 0.5})
    assert scaled.factor("fast") == 0.5 and scaled.factor("slow") == plain.factor("fast") == 1.0
    assert scaled.base_goodput() == plain.base_goodput()
    with pytest.raises(InvalidProblem, match="factor of type 'fast'"):
        TypedGoodput.of(models, bases, {"fast": 0.0})


def test_the_speedup_base_weights_each_types_fair_share_goodput_by_its_slots():
    from pollux_opt.model.allocate import to_problem

    models = {"slow": model(1.0), "fast": model(3.0)}
    bases = {"slow": (1, 2), "fast": (1, 2)}
    slow, fast = (float(models[t].optimize(1, 2).goodput) for t in ("slow", "fast"))
    assert TypedGoodput.of(models, bases).base_goodput() == pytest.approx(slow)  # no weights: the lowest
    weighted = TypedGoodput.of(models, bases, weights={"slow": 8.0, "fast": 4.0})
    assert weighted.base_goodput() == pytest.approx((8 * slow + 4 * fast) / 12)
    assert weighted.base_goodput(types=("fast",)) == pytest.approx(fast)
    # the allocator's speedups divide by it: below 1 on the slow type at the base shape, above on the fast one
    problem = to_problem(two_types(), [Job("a", weighted, max_replicas=8)], Options(spread_penalty=0.0))
    assert problem.lookup_speedup(0, 1, 2, types=0) == pytest.approx(slow / weighted.base_goodput())
    assert problem.lookup_speedup(0, 1, 2, types=1) == pytest.approx(fast / weighted.base_goodput())


def test_typed_goodput_weights_are_checked():
    models = {"slow": model(1.0), "fast": model(3.0)}
    bases = {"slow": (1, 2), "fast": (1, 2)}
    with pytest.raises(InvalidProblem, match="weight of type 'fast' must be a finite number > 0"):
        TypedGoodput.of(models, bases, weights={"slow": 1.0, "fast": 0.0})
    with pytest.raises(InvalidProblem, match="type 'fast' has a model but no weight"):
        TypedGoodput.of(models, bases, weights={"slow": 1.0})


def test_the_speedup_base_on_one_type_is_its_fair_share_goodput():
    from pollux_opt.scheduling.policies.views import type_gpus

    cluster = Cluster.from_types(ClusterTypes((NodeType("aws", 2, 4),)))
    assert type_gpus(cluster, cluster.types) == {"aws": 8.0}
    one = TypedGoodput.of({"aws": model(1.0)}, {"aws": (1, 4)}, weights={"aws": 8.0})
    assert one.base_goodput() == pytest.approx(float(model(1.0).optimize(1, 4).goodput))


def test_objective_constants_keep_sias_sign_rules():
    # the artifact's rules: |lambda_n| > 1 (more than the least gain of an
    # allocation) and a penalty sign opposite to p
    assert SIA_P < 0 < SIA_LAMBDA_NO_ALLOC and abs(SIA_LAMBDA_NO_ALLOC) > 1
