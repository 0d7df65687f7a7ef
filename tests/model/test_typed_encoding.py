"""Typed nodes and per-type goodput models in the allocation problem."""

from __future__ import annotations

import numpy as np
import pytest

from pollux_opt import InvalidProblem
from pollux_opt.model import BatchLimits, Cluster, GoodputModel, GradientStats, Job, Node, Options, ThroughputParams
from pollux_opt.model.allocate import to_problem
from pollux_opt.model.cluster_types import ClusterTypes, NodeType
from pollux_opt.model.projection import project_params
from pollux_opt.model.typed import TypedGoodput

_STATS = GradientStats(1.0, 2.0, 128)


def _model(scale=1.0, max_local=256):
    params = ThroughputParams(0.02, 0.003, 0.01, 0.002, 0.08, 0.01, 2.5)
    return GoodputModel(project_params(params, scale), _STATS,
                        BatchLimits(128, 8192, min_local_bsz=8, max_local_bsz=max_local))


def _arrays(problem):
    names = ("capacity", "cfg_job", "cfg_nodes", "cfg_replicas", "cfg_speedup", "current", "restart_factor",
             "weight", "min_replicas", "max_replicas")
    return {n: getattr(problem, n) for n in names}


def _typed_cluster():
    return Cluster.from_types(ClusterTypes((NodeType("slow", 2, 4), NodeType("fast", 1, 8))))


def test_node_type_defaults_to_one_type_and_from_types_names_nodes_by_type():
    assert Node("a", 4).type == "default"
    assert not Cluster.uniform(2, 4).typed
    cluster = _typed_cluster()
    assert [(n.id, n.cpus, n.type) for n in cluster.nodes] == [("slow-0", 4, "slow"), ("slow-1", 4, "slow"),
                                                               ("fast-0", 8, "fast")]
    assert cluster.types == ("slow", "fast") and cluster.typed
    assert not cluster.untyped().typed and cluster.untyped().node_ids == cluster.node_ids


def test_node_type_is_checked():
    with pytest.raises(InvalidProblem, match=r"node 'a': type must be"):
        Node("a", 4, type="bad name")


def test_one_type_cluster_encodes_the_untyped_problem():
    jobs = [Job("a", _model(), max_replicas=16, base=(1, 4), placement={"n1": 2}, age=100.0, restarts=1),
            Job("b", {(1, 1): 1.0, (1, 2): 1.7, (2, 2): 1.5}, max_replicas=2)]
    typed_jobs = [Job("a", TypedGoodput.of({"aws": _model()}, {"aws": (1, 4)}), max_replicas=16,
                      placement={"aws-1": 2}, age=100.0, restarts=1), jobs[1]]
    plain = to_problem(Cluster.uniform(4, 4), jobs, Options())
    one_type = Cluster.from_types(ClusterTypes((NodeType("aws", 4, 4),)))
    for cluster_jobs in (jobs, typed_jobs):
        placed = [j if j.id != "a" else Job(**{**j.__dict__, "placement": {"aws-1": 2}}) for j in cluster_jobs]
        typed = to_problem(one_type, placed, Options())
        assert not typed.typed
        for name, arr in _arrays(plain).items():
            np.testing.assert_array_equal(getattr(typed, name), arr, err_msg=name)


def test_typed_configurations_use_each_types_nodes_limits_and_one_base():
    slow, fast = _model(1.0, max_local=32), _model(3.0, max_local=64)
    typed = TypedGoodput.of({"slow": slow, "fast": fast}, {"slow": (1, 2), "fast": (1, 2)})
    problem = to_problem(_typed_cluster(), [Job("a", typed, max_replicas=16)], Options(spread_penalty=0.0))
    np.testing.assert_array_equal(problem.node_type, [0, 0, 1])
    for t, model, most_nodes, per_node in ((0, slow, 2, 4), (1, fast, 1, 8)):
        sel = problem.cfg_type == t
        nodes, reps = problem.cfg_nodes[sel], problem.cfg_replicas[sel]
        assert nodes.max() == most_nodes and (reps <= nodes * per_node).all()
        expect = model.optimize(nodes, reps).goodput / float(slow.optimize(1, 2).goodput)
        np.testing.assert_allclose(problem.cfg_speedup[sel], expect, rtol=1e-12)
    # the slow type's base is the common base: speedup 1 at its base shape
    assert problem.lookup_speedup(0, 1, 2, types=0) == pytest.approx(1.0)
    assert problem.lookup_speedup(0, 1, 2, types=1) > 2.0


def test_a_type_without_a_model_offers_no_configuration():
    typed = TypedGoodput.of({"fast": _model(2.0)}, {"fast": (1, 1)})
    problem = to_problem(_typed_cluster(), [Job("a", typed, max_replicas=8)], Options())
    assert set(problem.cfg_type.tolist()) == {1}
    assert problem.lookup_speedup(0, 1, 1, types=1) == pytest.approx(1.0)


def test_single_model_applies_to_every_type():
    problem = to_problem(_typed_cluster(), [Job("a", _model(), max_replicas=8)], Options(spread_penalty=0.0))
    for t in (0, 1):
        assert problem.lookup_speedup(0, 1, 4, types=t) == pytest.approx(float(_model().speedup(1, 4)))


def test_typed_goodput_rejects_a_model_without_base():
    with pytest.raises(InvalidProblem, match=r"type 'b' has a model but no base allocation"):
        TypedGoodput.of({"a": _model(), "b": _model()}, {"a": (1, 1)})
    with pytest.raises(InvalidProblem, match=r"model of type 'a' must be a GoodputModel, got 3"):
        TypedGoodput.of({"a": 3}, {"a": (1, 1)})


def test_projected_params_scale_throughput_by_the_ratio():
    slow, fast = _model(1.0), _model(2.5)
    nodes, reps, m = np.array([1, 1, 2]), np.array([1, 4, 8]), np.array([16, 32, 64])
    np.testing.assert_allclose(fast.throughput(nodes, reps, m), 2.5 * slow.throughput(nodes, reps, m), rtol=1e-12)
    with pytest.raises(InvalidProblem, match=r"ratio must be a finite number > 0, got 0"):
        project_params(slow.throughput_params, 0)


def _shapes(problem, t):
    sel = problem.cfg_type == t
    return sorted(zip(problem.cfg_nodes[sel].tolist(), problem.cfg_replicas[sel].tolist()))


def test_a_typed_cluster_offers_goodput_jobs_sias_configurations_by_default():
    typed = TypedGoodput.of({"slow": _model(), "fast": _model(2.0)}, {"slow": (1, 1), "fast": (1, 1)})
    for speedup in (typed, _model()):
        problem = to_problem(_typed_cluster(), [Job("a", speedup, max_replicas=16)], Options())
        assert _shapes(problem, 0) == [(1, 1), (1, 2), (1, 4), (2, 8)]  # 2 nodes x 4
        assert _shapes(problem, 1) == [(1, 1), (1, 2), (1, 4), (1, 8)]  # 1 node x 8
        every = to_problem(_typed_cluster(), [Job("a", speedup, max_replicas=16)], Options(shapes="all"))
        assert _shapes(every, 0) == [(1, k) for k in range(1, 5)] + [(2, k) for k in range(2, 9)]


def test_sia_shapes_keep_a_running_jobs_current_shape_and_never_leave_a_job_without_one():
    typed = TypedGoodput.of({"slow": _model(), "fast": _model(2.0)}, {"slow": (1, 1), "fast": (1, 1)})
    running = Job("a", typed, max_replicas=16, placement={"slow-0": 3}, age=600.0)
    problem = to_problem(_typed_cluster(), [running], Options(shapes="sia"))
    assert (1, 3) in _shapes(problem, 0) and (1, 3) not in _shapes(problem, 1)
    exactly_three = Job("b", typed, min_replicas=3, max_replicas=3)
    problem = to_problem(_typed_cluster(), [exactly_three], Options())
    assert _shapes(problem, 0) == [(1, 3), (2, 3)] and _shapes(problem, 1) == [(1, 3)]


def test_sia_shapes_leave_explicit_tables_and_one_type_clusters_as_they_are():
    table = {(1, 1): 1.0, (1, 3): 2.5, (2, 3): 2.4}
    problem = to_problem(_typed_cluster(), [Job("a", table, max_replicas=3)], Options(shapes="sia"))
    assert _shapes(problem, 0) == [(1, 1), (1, 3), (2, 3)]
    one_type = to_problem(Cluster.uniform(2, 4), [Job("a", _model(), max_replicas=8)], Options())
    assert sorted(zip(one_type.cfg_nodes.tolist(), one_type.cfg_replicas.tolist())) == (
        [(1, k) for k in range(1, 5)] + [(2, k) for k in range(2, 9)])
    forced = to_problem(Cluster.uniform(2, 4), [Job("a", _model(), max_replicas=8)], Options(shapes="sia"))
    assert sorted(zip(forced.cfg_nodes.tolist(), forced.cfg_replicas.tolist())) == [(1, 1), (1, 2), (1, 4), (2, 8)]


def test_shapes_option_is_checked():
    with pytest.raises(InvalidProblem, match=r"shapes must be one of \['auto', 'all', 'sia'\], got 'pow2'"):
        Options(shapes="pow2")


# ------------------------------------------------------------------------------------ instance format
def _v3():
    return {"version": 3,
            "cluster": {"nodes": [{"id": "s0", "cpus": 4, "type": "slow"}, {"id": "f0", "cpus": 8, "type": "fast"}]},
            "jobs": [{"id": "a", "speedup_tables": {"slow": [[1, 1, 1.0], [1, 4, 3.0]], "fast": [[1, 1, 2.5]]},
                      "max_replicas": 4},
                     {"id": "b", "speedup_table": [[1, 1, 1.0], [1, 2, 1.5]], "max_replicas": 2}]}


def test_version_3_instance_reads_node_types_and_per_type_tables():
    from pollux_opt.model.instance import instance_to_json, parse_instance

    inst = parse_instance(_v3())
    assert inst.cluster.types == ("slow", "fast")
    problem = to_problem(inst.cluster, inst.jobs, inst.options)
    a = problem.cfg_job == 0
    assert sorted(zip(problem.cfg_type[a].tolist(), problem.cfg_replicas[a].tolist())) == [(0, 1), (0, 4), (1, 1)]
    assert problem.lookup_speedup(0, 1, 1, types=1) == pytest.approx(2.5)
    # a single table applies to every type
    assert problem.lookup_speedup(1, 1, 2, types=0) == problem.lookup_speedup(1, 1, 2, types=1) == 1.5
    again = parse_instance(instance_to_json(inst))
    assert again == inst


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(version=2), r"cluster\.nodes\[0\]: unknown field 'type' in a version 2 file "
                                    r"\(node types need version 3\)"),
    (lambda d: d["jobs"][0].update(speedup_table=[[1, 1, 1.0]]),
     r"jobs\[0\]\.speedup_table is required \(or, in version 3, speedup_tables; not both\)"),
    (lambda d: d["jobs"][0].update(speedup_tables={}), r"jobs\[0\]\.speedup_tables must be a non-empty object"),
    (lambda d: d["jobs"][0]["speedup_tables"].update(fast=[[1, 1, -1.0]]),
     r"job 'a': type 'fast': speedup at \(num_nodes=1, num_replicas=1\) must be"),
    (lambda d: d["cluster"]["nodes"][0].update(type="no spaces"), r"cluster\.nodes\[0\]\.type must be"),
])
def test_version_3_instance_errors_name_the_field(edit, match):
    from pollux_opt.model.instance import parse_instance

    data = _v3()
    edit(data)
    with pytest.raises(InvalidProblem, match=match):
        parse_instance(data)


@pytest.mark.parametrize("per_node, num_nodes", [(1, 1), (4, 6), (6, 3), (8, 2), (8, 1)])
def test_sia_shape_mask_admits_exactly_sias_configurations(per_node, num_nodes):
    from pollux_opt.model.configs import sia_configurations, sia_shape_mask

    pairs = [(n, k) for n in range(1, num_nodes + 2) for k in range(n, (num_nodes + 1) * per_node + 1)]
    nodes, reps = (np.array(a) for a in zip(*pairs))
    top = tuple(per_node * (i + 1) for i in range(num_nodes))
    admitted = {p for p, ok in zip(pairs, sia_shape_mask(nodes, reps, top)) if ok}
    assert admitted == set(sia_configurations(per_node, num_nodes))
    assert sia_shape_mask(nodes, reps, top, current=pairs[-1])[-1]  # off the set, yet the job's current shape
