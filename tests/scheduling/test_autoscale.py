"""Autoscaling: the value of a cluster, the cost and threshold rules, the hold, types and prices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux_opt import Cluster, InvalidProblem
from pollux_opt.lifecycle import JobState
from pollux_opt.model import BatchLimits, GoodputModel, GradientStats, Node, ThroughputParams
from pollux_opt.scheduling.autoscale import (
    Autoscaler,
    ScaleOptions,
    cluster_value,
    node_prices,
    speedup_curves,
)
from pollux_opt.scheduling.policies.flow_weights import hull_increments
from pollux_opt.scheduling.loop import JobView, run


def _view(job_id: str, model: GoodputModel | None = None, **kw) -> JobView:
    base = dict(job_id=job_id, submit_time=0.0, state=JobState.QUEUED, placement={}, restarts=0, age=0.0,
                min_replicas=0, max_replicas=64, submitted_replicas=1, submitted_batch_size=32,
                goodput_model=model, restart_delay=30.0, progress=0.0, attained_service=0.0,
                max_profiled_replicas=None if model is not None else 0)
    return JobView(**{**base, **kw})


def _model(noise: float, *, speed: float = 1.0) -> GoodputModel:
    """A job whose gradient noise scale is ``noise`` (samples): the batch it uses well grows with it."""
    return GoodputModel(
        ThroughputParams(0.005 / speed, 0.001 / speed, 0.002, 0.0005, 0.02, 0.002, 1.5),
        GradientStats(grad_sqr=1.0, grad_var=noise / 32, init_batch_size=32),
        BatchLimits(init_batch_size=32, max_batch_size=8192, max_local_bsz=256),
    )


def test_hull_increments_are_the_concave_hull_and_drop_what_adds_nothing():
    values = np.array([0.0, 1.0, 1.8, 2.0, 2.9, 3.5, 3.6, 3.4])
    inc = hull_increments(values)
    # (2, 1.8) -> (5, 3.5) is one chord: the dip at 3 is bridged; the last point loses value
    assert inc == pytest.approx([1.0, 0.8, 1.7 / 3, 1.7 / 3, 1.7 / 3, 0.1])
    assert np.all(np.diff(inc) <= 1e-12)


def test_one_type_value_is_the_largest_increments():
    curves = {"a": {"t": np.array([1.0, 0.9, 0.2])}, "b": {"t": np.array([1.0, 0.5])}}
    assert cluster_value(curves, {"t": 0}) == 0.0
    assert cluster_value(curves, {"t": 3}) == pytest.approx(2.9)
    assert cluster_value(curves, {"t": 10}) == pytest.approx(3.6)


def test_a_job_takes_slots_of_one_type_only():
    curves = {"a": {"x": np.array([1.0, 1.0]), "y": np.array([0.9, 0.9])}}
    # two slots of each type: the job cannot take one of x and one of y on top of both of x
    assert cluster_value(curves, {"x": 2, "y": 2}) == pytest.approx(2.0)
    assert cluster_value(curves, {"x": 0, "y": 2}) == pytest.approx(1.8)


def test_a_job_moves_to_a_slower_type_when_that_frees_the_fast_one_for_another():
    # both jobs are fastest on x; x has room for one job's curve: a does better on all of y
    curves = {"a": {"x": np.array([1.0, 1.0]), "y": np.array([0.9, 0.9])},
              "b": {"x": np.array([0.95, 0.1]), "y": np.array([0.2, 0.1])}}
    assert cluster_value(curves, {"x": 2, "y": 2}) == pytest.approx(1.05 + 1.8)
    assert cluster_value(curves, {"x": 2, "y": 0}) == pytest.approx(2.0)


def _best_assignment(curves, slots) -> float:
    """Brute force: every assignment of the jobs to types, each type's largest increments."""
    import itertools

    types = [t for t in slots if slots[t] > 0]
    best = 0.0
    for choice in itertools.product(types, repeat=len(curves)):
        total = 0.0
        for t in types:
            inc = np.concatenate([c[t] for c, u in zip(curves.values(), choice) if u == t] or [np.zeros(0)])
            total += float(np.sort(inc)[::-1][:slots[t]].sum())
        best = max(best, total)
    return best


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(st.tuples(st.lists(st.floats(0.01, 2.0), min_size=1, max_size=4),
                               st.lists(st.floats(0.01, 2.0), min_size=1, max_size=4)), min_size=1, max_size=4),
       slots=st.tuples(st.integers(0, 5), st.integers(0, 5)))
def test_several_types_value_is_an_assignment_and_one_job_gets_its_best_type(jobs, slots):
    curves = {f"j{i}": {"x": np.sort(x)[::-1], "y": np.sort(y)[::-1]} for i, (x, y) in enumerate(jobs)}
    caps = {"x": slots[0], "y": slots[1]}
    value, best = cluster_value(curves, caps), _best_assignment(curves, caps)
    assert value <= best + 1e-9  # never more than some assignment of jobs to types gives
    if len(curves) == 1:
        assert value == pytest.approx(best)


def test_queued_jobs_grow_the_cluster_up_to_max_nodes():
    cluster = Cluster.uniform(8, 4)
    scaler = Autoscaler(cluster, ScaleOptions(min_nodes=1, max_nodes=6, time_value=None))
    views = [_view(f"j{i}") for i in range(10)]  # new jobs: one replica each is worth 1
    assert scaler.decide(0.0, views, {"default": 1}) == {"default": 3}  # 10 slots wanted: 3 nodes
    views = [_view(f"j{i}") for i in range(40)]
    assert scaler.decide(0.0, views, {"default": 1}) == {"default": 6}


def test_a_smaller_size_waits_the_hold_then_stops_at_min_nodes():
    cluster = Cluster.uniform(8, 4)
    scaler = Autoscaler(cluster, ScaleOptions(min_nodes=2, startup_s=100.0))
    assert scaler.decide(0.0, [], {"default": 5}) == {"default": 5}
    assert scaler.decide(60.0, [], {"default": 5}) == {"default": 5}
    assert scaler.decide(100.0, [], {"default": 5}) == {"default": 2}
    # the hold restarts whenever the size is wanted again
    scaler.decide(200.0, [], {"default": 5})
    scaler.decide(250.0, [_view(f"j{i}") for i in range(20)], {"default": 5})
    assert scaler.decide(299.0, [], {"default": 5}) == {"default": 5}


def test_a_size_inside_the_band_is_kept():
    cluster = Cluster.uniform(8, 4)
    views = [_view(f"j{i}") for i in range(9)]  # 9 slots worth 1 each
    scaler = Autoscaler(cluster, ScaleOptions(time_value=None, grow_above=0.5, shrink_below=0.2, release_after=0.0))
    # a third node's 4 slots add 1 (one job): 0.25 a slot, inside [0.2, 0.5): kept, not grown
    assert scaler.decide(0.0, views, {"default": 2}) == {"default": 2}
    assert scaler.decide(0.0, views, {"default": 3}) == {"default": 3}
    # a fourth node would add nothing: released at once (no hold)
    assert scaler.decide(0.0, views, {"default": 4}) == {"default": 3}


def _ratio(scaler, curves, weight, n):
    """The cost rule's cost per unit of value at ``n`` nodes of one type, priced 1 a slot."""
    return (n * 4 + scaler.options.time_value * weight) / scaler._value(curves, {"default": n})


@pytest.mark.parametrize("noise", [64.0, 2000.0, 50000.0])
@pytest.mark.parametrize("time_value", [2.0, 16.0, 128.0])
def test_the_cost_rule_settles_where_cost_per_unit_of_progress_is_least(noise, time_value):
    cluster = Cluster.uniform(16, 4)
    view = _view("a", _model(noise), max_profiled_replicas=64, state=JobState.RUNNING, placement={"n0": 4},
                 weight=2.0)
    scaler = Autoscaler(cluster, ScaleOptions(min_nodes=1, time_value=time_value, band=0.0, release_after=0.0))
    curves = speedup_curves([view], cluster)
    best = min(range(1, 17), key=lambda n: _ratio(scaler, curves, 2.0, n))
    # from below (growing) and from above (releasing) alike
    assert scaler.decide(0.0, [view], {"default": 1}) == {"default": best}
    assert scaler.decide(0.0, [view], {"default": 16}) == {"default": best}


def test_a_dearer_second_of_waiting_buys_more_nodes_and_a_free_one_none():
    cluster = Cluster.uniform(16, 4)
    views = [_view(f"j{i}", _model(2000.0), max_profiled_replicas=64) for i in range(3)]
    wanted = [Autoscaler(cluster, ScaleOptions(min_nodes=1, time_value=lam)).decide(0.0, views, {"default": 1})
              ["default"] for lam in (0.0, 1.0, 8.0, 64.0, 512.0)]
    assert wanted[0] == 1  # nodes cost and time does not: a concave curve's first node is its best buy
    assert wanted == sorted(wanted) and wanted[-1] > wanted[1]
    # a job's weight scales what its waiting costs
    heavy = [_view(v.job_id, _model(2000.0), max_profiled_replicas=64, weight=8.0) for v in views]
    light = Autoscaler(cluster, ScaleOptions(min_nodes=1, time_value=8.0)).decide(0.0, views, {"default": 1})
    assert Autoscaler(cluster, ScaleOptions(min_nodes=1, time_value=8.0)).decide(
        0.0, heavy, {"default": 1})["default"] > light["default"]


def test_the_cost_rule_band_widens_the_sizes_it_keeps_and_each_decision_is_kept():
    cluster = Cluster.uniform(16, 4)
    view = _view("a", _model(2000.0), max_profiled_replicas=64)

    def kept(band):
        scaler = Autoscaler(cluster, ScaleOptions(min_nodes=1, time_value=16.0, band=band, release_after=0.0))
        for n in range(1, 17):  # wherever it starts, the size it moves to is one it keeps
            want = scaler.decide(0.0, [view], {"default": n})
            assert scaler.decide(0.0, [view], want) == want
        return {n for n in range(1, 17) if scaler.decide(0.0, [view], {"default": n}) == {"default": n}}

    exact, banded = kept(0.0), kept(0.3)
    assert len(exact) == 1 and exact < banded


def test_goodput_wants_fewer_nodes_than_throughput_when_large_batches_waste_samples():
    cluster = Cluster.uniform(16, 4)
    view = _view("a", _model(noise=8.0), max_profiled_replicas=64, submitted_replicas=1, submitted_batch_size=128,
                 state=JobState.RUNNING, placement={"n0": 4})
    good = Autoscaler(cluster, ScaleOptions(rule="goodput")).decide(0.0, [view], {"default": 1})
    thr = Autoscaler(cluster, ScaleOptions(rule="throughput")).decide(0.0, [view], {"default": 1})
    assert good["default"] < thr["default"]
    # a job whose noise scale is large uses big batches well: goodput agrees with throughput more
    wide = Autoscaler(cluster, ScaleOptions(rule="goodput")).decide(0.0, [
        _view("a", _model(noise=5000.0), max_profiled_replicas=64, submitted_batch_size=128)], {"default": 1})
    assert wide["default"] > good["default"]


def test_the_type_with_the_most_value_per_price_is_added():
    nodes = [Node(f"slow-{i}", 4, "slow") for i in range(4)] + [Node(f"fast-{i}", 4, "fast") for i in range(4)]
    cluster = Cluster(tuple(nodes))
    views = [_view(f"j{i}", _model(noise=500.0), max_profiled_replicas=1, max_replicas=1,
                   goodput_models={"slow": _model(500.0), "fast": _model(500.0, speed=3.0)}) for i in range(8)]
    # one slow node serves four jobs; a second node serves the other four, three times as fast on fast
    # nodes: at twice the price a fast node is the better buy, at four times it is not
    options = ScaleOptions(min_nodes=1, max_nodes=2, time_value=None, grow_above=0.1, shrink_below=0.0)
    two = Autoscaler(cluster, options, prices={"slow": 1.0, "fast": 2.0})
    four = Autoscaler(cluster, options, prices={"slow": 1.0, "fast": 4.0})
    assert two.decide(0.0, views, {"slow": 1, "fast": 0}) == {"slow": 1, "fast": 1}
    assert four.decide(0.0, views, {"slow": 1, "fast": 0}) == {"slow": 2, "fast": 0}
    # min_nodes start on the cheapest type per slot; with nothing to run, the dearer nodes go first
    assert four.initial() == {"slow": 1, "fast": 0}
    idle = Autoscaler(cluster, ScaleOptions(min_nodes=1, release_after=0.0), prices={"slow": 1.0, "fast": 4.0})
    assert idle.decide(0.0, [], {"slow": 2, "fast": 2}) == {"slow": 1, "fast": 0}


def test_curves_are_weighted_and_capped_by_exploration():
    cluster = Cluster.uniform(4, 4)
    light, heavy = _view("a", _model(500.0), max_profiled_replicas=2), _view("b", _model(500.0),
                                                                              max_profiled_replicas=2, weight=3.0)
    curves = speedup_curves([light, heavy], cluster)
    assert len(curves["a"]["default"]) <= 4  # at most twice the replicas measured
    assert curves["b"]["default"] == pytest.approx(3.0 * curves["a"]["default"])


@pytest.mark.parametrize("kwargs, match", [
    ({"min_nodes": 0}, r"autoscale min_nodes must be an integer >= 1, got 0"),
    ({"min_nodes": 4, "max_nodes": 2}, r"max_nodes must be at least min_nodes \(4\), got 2"),
    ({"time_value": None, "grow_above": 0.2, "shrink_below": 0.3},
     r"shrink_below must be at most grow_above \(0.2\), got 0.3"),
    ({"grow_above": 0.2}, r"grow_above and shrink_below are the threshold rule's: give time_value=None with them, "
                          r"got time_value=32"),
    ({"time_value": -1.0}, r"autoscale time_value must be a finite number >= 0 or None, got -1.0"),
    ({"band": 1.0}, r"autoscale band must be a finite number in \[0, 1\), got 1.0"),
    ({"rule": "cost"}, r"autoscale rule must be one of \['goodput', 'throughput'\], got 'cost'"),
    ({"startup_s": -1.0}, r"autoscale startup_s must be a finite number of seconds >= 0, got -1.0"),
])
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(InvalidProblem, match=match):
        ScaleOptions(**kwargs)


def test_bad_prices_and_sizes_are_named():
    cluster = Cluster.uniform(2, 4)
    with pytest.raises(InvalidProblem, match=r"prices name node type 'gpu', which the cluster lacks"):
        node_prices({"gpu": 1.0}, cluster)
    with pytest.raises(InvalidProblem, match=r"prices\['default'\] must be a finite number > 0, got -1"):
        node_prices({"default": -1}, cluster)
    with pytest.raises(InvalidProblem, match=r"min_nodes must be at most the cluster's 2 nodes, got 3"):
        Autoscaler(cluster, ScaleOptions(min_nodes=3))


def test_the_loop_refuses_an_autoscaler_for_a_fixed_backend():
    class Fixed:
        def finished(self):
            return True

    with pytest.raises(InvalidProblem, match="autoscaler needs a backend that provisions nodes, got Fixed"):
        run(Fixed(), object(), Cluster.uniform(1, 1), None, interval=1.0,
            autoscaler=Autoscaler(Cluster.uniform(1, 1)))


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.integers(1, 4), min_size=2, max_size=2),
    one_type=st.booleans(),
    bounds=st.tuples(st.integers(1, 4), st.integers(0, 4)),
    noises=st.lists(st.sampled_from([None, 8.0, 512.0, 65536.0]), max_size=6),
    sizes=st.lists(st.integers(0, 4), min_size=2, max_size=2),
    prices=st.lists(st.floats(0.5, 20.0), min_size=2, max_size=2),
    band=st.tuples(st.floats(0.05, 2.0), st.floats(0.0, 1.0)),
    time_value=st.sampled_from([None, 0.0, 4.0, 64.0]),
)
def test_every_decision_stays_within_the_bounds_and_the_types_nodes(counts, one_type, bounds, noises, sizes, prices,
                                                                    band, time_value):
    from pollux_opt.model.cluster_types import ClusterTypes, NodeType

    kinds = ("small",) if one_type else ("small", "big")
    cluster = Cluster.from_types(ClusterTypes(tuple(NodeType(k, c, 2 * (i + 1))
                                                    for i, (k, c) in enumerate(zip(kinds, counts)))))
    lo = min(bounds[0], len(cluster.nodes))
    hi = min(lo + bounds[1], len(cluster.nodes))
    bars = ({"grow_above": band[0], "shrink_below": band[0] * band[1]} if time_value is None
            else {"band": min(band[1], 0.5)})
    scaler = Autoscaler(cluster, ScaleOptions(min_nodes=lo, max_nodes=hi, time_value=time_value, release_after=0.0,
                                              **bars),
                        prices=dict(zip(kinds, prices)))
    views = [_view(f"j{i}", None if n is None else _model(n), max_profiled_replicas=None if n is None else 16)
             for i, n in enumerate(noises)]
    have = {k: min(n, c) for k, n, c in zip(kinds, sizes, counts)}
    want = scaler.decide(0.0, views, have)
    assert set(want) == set(kinds) and all(0 <= want[k] <= c for k, c in zip(kinds, counts))
    total, before = sum(want.values()), sum(have.values())
    # shrinking stops at min_nodes, growing at max_nodes
    assert min(lo, before) <= total <= max(hi, before)
    if not views:
        assert total <= max(lo, before)  # nothing to run: no node is added
    if one_type:  # the band holds at the size chosen: a decision from there keeps it
        assert scaler.decide(0.0, views, want) == want
