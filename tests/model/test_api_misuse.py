"""Misuse of the Python API: every wrong call raises InvalidProblem naming what is wrong.

Each case is one call a user might plausibly write (a dict for the options,
a string for a count, a job where a list of jobs belongs, ...).  The contract
is the project's: a ``ValueError`` subclass, :class:`InvalidProblem`, with a
message naming the argument, never a ``TypeError``, ``AttributeError`` or a
bare ``ValueError`` from deep inside.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pollux_opt import Cluster, GoodputModel, InvalidProblem, Job, Node, Options, allocate
from pollux_opt.model import BatchLimits, GradientStats, ThroughputParams, instance_to_json, parse_instance
from pollux_opt.model.instance import Instance

TABLE = {(1, 1): 1.0, (1, 2): 1.8, (2, 2): 1.6}


def _cluster() -> Cluster:
    return Cluster.uniform(2, 4)


def _job(**kw) -> Job:
    return Job(**{"id": "a", "speedup": TABLE, "max_replicas": 2, **kw})


def _model(**limits) -> GoodputModel:
    return GoodputModel(
        throughput_params=ThroughputParams(0.02, 0.001, 0.05, 0.01, 0.2, 0.05, 2.0),
        grad_stats=GradientStats(grad_sqr=1.0, grad_var=50.0, init_batch_size=32),
        limits=BatchLimits(**{"init_batch_size": 32, "max_batch_size": 1024, **limits}),
    )


# (name, call, a regular expression the message must match)
MISUSES = [
    # allocate's arguments
    ("options as a dict", lambda: allocate(_cluster(), [_job()], {"p": 0}), r"options must be an Options or None"),
    ("options as a string", lambda: allocate(_cluster(), [_job()], "milp"), r"options must be an Options"),
    ("options as a number", lambda: allocate(_cluster(), [_job()], 3), r"options must be an Options"),
    ("cluster as a list of nodes", lambda: allocate([Node("n0", 4)], [_job()]), r"cluster must be a Cluster"),
    ("cluster as None", lambda: allocate(None, [_job()]), r"cluster must be a Cluster, got None"),
    ("cluster as a dict", lambda: allocate({"nodes": []}, [_job()]), r"cluster must be a Cluster"),
    ("jobs as one job", lambda: allocate(_cluster(), _job()), r"jobs must be a sequence of Job objects"),
    ("jobs as None", lambda: allocate(_cluster(), None), r"jobs must be a sequence of Job objects, got None"),
    ("jobs as a string", lambda: allocate(_cluster(), "a"), r"jobs must be a sequence of Job objects"),
    ("jobs as a number", lambda: allocate(_cluster(), 3), r"jobs must be a sequence of Job objects"),
    ("jobs as a dict", lambda: allocate(_cluster(), {"a": _job()}), r"jobs must be a sequence of Job objects"),
    ("a dict among the jobs", lambda: allocate(_cluster(), [{"id": "a"}]), r"jobs\[0\] must be a Job"),
    ("None among the jobs", lambda: allocate(_cluster(), [_job(), None]), r"jobs\[1\] must be a Job, got None"),
    ("an unknown override", lambda: allocate(_cluster(), [_job()], speed=3), r"unknown option 'speed'"),
    ("a solver that is not a string", lambda: allocate(_cluster(), [_job()], solver=3), r"solver must be a name"),
    ("an unknown solver", lambda: allocate(_cluster(), [_job()], solver="cplex"), r"unknown solver 'cplex'"),
    ("a string time limit", lambda: allocate(_cluster(), [_job()], time_limit="10"), r"time_limit must be"),
    ("a negative time limit", lambda: allocate(_cluster(), [_job()], time_limit=-1), r"time_limit must be"),
    ("a nan time limit", lambda: allocate(_cluster(), [_job()], time_limit=math.nan), r"time_limit must be"),
    ("a float seed", lambda: allocate(_cluster(), [_job()], seed=1.5), r"seed must be an integer"),
    ("a negative seed", lambda: allocate(_cluster(), [_job()], seed=-1), r"seed must be an integer"),
    ("a huge seed", lambda: allocate(_cluster(), [_job()], seed=2**64), r"seed must be an integer"),
    ("a string p", lambda: allocate(_cluster(), [_job()], p="-1"), r"p must be a finite number"),
    ("p below its range", lambda: allocate(_cluster(), [_job()], p=-6), r"p must be a finite number in \[-5, 5\], got -6"),
    ("p above its range", lambda: allocate(_cluster(), [_job()], p=1e300), r"p must be a finite number in \[-5, 5\]"),
    ("a bool p", lambda: allocate(_cluster(), [_job()], p=True), r"p must be a finite number"),
    ("a gap of 1", lambda: allocate(_cluster(), [_job()], mip_gap=1), r"mip_gap must be a finite number in \[0, 1\)"),
    ("duplicate job ids", lambda: allocate(_cluster(), [_job(), _job()]), r"duplicate job id 'a'"),
    ("placement on an unknown node", lambda: allocate(_cluster(), [_job(placement={"x": 1})]),
     r"placement on unknown node 'x'"),
    ("placement over capacity", lambda: allocate(_cluster(), [_job(max_replicas=8, placement={"n0": 5})]),
     r"placement over capacity on node 'n0'"),
    # Options
    ("Options positional of a string", lambda: Options("-1"), r"p must be a finite number"),
    ("Options p as None", lambda: Options(p=None), r"p must be a finite number"),
    ("Options restart_delay as a string", lambda: Options(restart_delay="30"), r"restart_delay must be"),
    ("Options interference_avoidance as 1", lambda: Options(interference_avoidance=1),
     r"interference_avoidance must be true or false, got 1"),
    ("Options max_nodes_per_job as a float", lambda: Options(max_nodes_per_job=2.0), r"max_nodes_per_job must be an integer"),
    ("Options max_nodes_per_job beyond MAX_REPLICAS", lambda: Options(max_nodes_per_job=2**31),
     r"max_nodes_per_job must be an integer in \[1, 2147483647\]"),
    ("Options spread_penalty as a string", lambda: Options(spread_penalty="0.1"), r"spread_penalty must be"),
    ("Options.from_mapping of a list", lambda: Options.from_mapping([("p", 0)]), r"options must be a mapping"),
    ("Options.from_mapping with a non-string key", lambda: Options.from_mapping({1: 0}), r"unknown option 1"),
    ("Options.from_mapping with a bad base", lambda: Options.from_mapping({}, base={"p": 0}),
     r"base must be an Options or None"),
    # Node and Cluster
    ("Node cpus as a string", lambda: Node("n0", "4"), r"node 'n0': cpus must be an integer in \[1, 2147483647\], got '4'"),
    ("Node cpus as a float", lambda: Node("n0", 4.0), r"cpus must be an integer"),
    ("Node cpus as None", lambda: Node("n0", None), r"cpus must be an integer"),
    ("Node cpus beyond MAX_CPUS", lambda: Node("n0", 2**31), r"cpus must be an integer in \[1, 2147483647\]"),
    ("Node cpus of 2**63", lambda: Node("n0", 2**63), r"cpus must be an integer in \[1, 2147483647\]"),
    ("Node cpus of 10**400", lambda: Node("n0", 10**400), r"got an integer of about 401 digits"),
    ("Node id as a number", lambda: Node(0, 4), r"node id must be a non-empty string, got 0"),
    ("Node id empty", lambda: Node("", 4), r"node id must be a non-empty string"),
    ("Node cpus as a list", lambda: Node("n0", [4]), r"cpus must be an integer"),
    ("Cluster of a node", lambda: Cluster(Node("n0", 4)), r"cluster.nodes must be a sequence of Node objects"),
    ("Cluster of None", lambda: Cluster(None), r"cluster.nodes must be a sequence of Node objects, got None"),
    ("Cluster of strings", lambda: Cluster(("n0", "n1")), r"cluster.nodes\[0\] must be a Node, got 'n0'"),
    ("Cluster of a string", lambda: Cluster("n0"), r"cluster.nodes must be a sequence"),
    ("Cluster of dicts", lambda: Cluster([{"id": "n0", "cpus": 4}]), r"cluster.nodes\[0\] must be a Node"),
    ("Cluster.uniform with a string count", lambda: Cluster.uniform("2", 4), r"num_nodes must be an integer"),
    ("Cluster.uniform with string cpus", lambda: Cluster.uniform(2, "4"), r"cpus must be an integer"),
    ("Cluster.uniform with no nodes", lambda: Cluster.uniform(0, 4), r"num_nodes must be an integer in \[1, "),
    ("Cluster.uniform with a non-string prefix", lambda: Cluster.uniform(2, 4, prefix=None),
     r"prefix must be a string"),
    # Job
    ("Job speedup None", lambda: _job(speedup=None), r"job 'a': speedup must be a GoodputModel or a mapping"),
    ("Job speedup a list", lambda: _job(speedup=[(1, 1, 1.0)]), r"speedup must be a GoodputModel or a mapping"),
    ("Job speedup a number", lambda: _job(speedup=1.0), r"speedup must be a GoodputModel or a mapping"),
    ("Job speedup key a string", lambda: _job(speedup={"1,1": 1.0}), r"speedup key must be a pair"),
    ("Job speedup key a triple", lambda: _job(speedup={(1, 1, 1): 1.0}), r"speedup key must be a pair"),
    ("Job speedup key of floats", lambda: _job(speedup={(1.0, 1.0): 1.0}), r"speedup key must be a pair"),
    ("Job speedup value a string", lambda: _job(speedup={(1, 1): "1"}), r"speedup at \(num_nodes=1, num_replicas=1\)"),
    ("Job speedup value beyond MAX_SPEEDUP", lambda: _job(speedup={(1, 1): 1e10}),
     r"speedup at \(num_nodes=1, num_replicas=1\) must be a finite number in \[0, 2147483648\]"),
    ("Job max_replicas as a string", lambda: _job(max_replicas="2"), r"job 'a': max_replicas must be an integer"),
    ("Job max_replicas as a float", lambda: _job(max_replicas=2.0), r"max_replicas must be an integer"),
    ("Job max_replicas of 2**63", lambda: _job(max_replicas=2**63), r"max_replicas must be an integer in \[0, 2147483647\]"),
    ("Job max_replicas of 10**400", lambda: _job(max_replicas=10**400), r"got an integer of about 401 digits"),
    ("Job min_replicas negative", lambda: _job(min_replicas=-1), r"min_replicas must be an integer"),
    ("Job min above max", lambda: _job(min_replicas=3), r"min_replicas=3 > max_replicas=2"),
    ("Job restarts of 10**400", lambda: _job(restarts=10**400), r"restarts must be an integer in \[0, 9007199254740992\]"),
    ("Job restarts as a float", lambda: _job(restarts=1.0), r"restarts must be an integer"),
    ("Job age of 10**400", lambda: _job(age=10**400), r"age must be a finite number >= 0"),
    ("Job age as a string", lambda: _job(age="1"), r"age must be a finite number"),
    ("Job age nan", lambda: _job(age=math.nan), r"age must be a finite number"),
    ("Job weight of 10**400", lambda: _job(weight=10**400), r"weight must be a finite number in \[1e-06, 1000000\]"),
    ("Job weight below its range", lambda: _job(weight=1e-7), r"weight must be a finite number in \[1e-06, 1000000\], got 1e-07"),
    ("Job weight above its range", lambda: _job(weight=1e7), r"weight must be a finite number in \[1e-06, 1000000\]"),
    ("Job weight as None", lambda: _job(weight=None), r"weight must be a finite number"),
    ("Job placement as a list", lambda: _job(placement=[("n0", 1)]), r"placement must be a mapping"),
    ("Job placement as a string", lambda: _job(placement="n0"), r"placement must be a mapping"),
    ("Job placement as None", lambda: _job(placement=None), r"placement must be a mapping"),
    ("Job placement count a string", lambda: _job(placement={"n0": "1"}), r"placement on node 'n0' must be an integer"),
    ("Job placement count of 2**63", lambda: _job(placement={"n0": 2**63}), r"placement on node 'n0' must be an integer in"),
    ("Job base a string", lambda: _job(base="1,1"), r"base must be a pair"),
    ("Job base of one entry", lambda: _job(base=(1,)), r"base must be a pair"),
    ("Job base nodes above replicas", lambda: _job(base=(2, 1)), r"base pair \(num_nodes=2, num_replicas=1\) needs"),
    ("Job base None", lambda: _job(base=None), r"base must be a pair"),
    ("Job fixed_batch_size a float", lambda: _job(fixed_batch_size=64.0), r"fixed_batch_size must be an integer > 0"),
    ("Job fixed_batch_size zero", lambda: _job(fixed_batch_size=0), r"fixed_batch_size must be an integer > 0"),
    ("Job restart_delay a string", lambda: _job(restart_delay="30"), r"restart_delay must be a finite number of seconds"),
    ("Job id None", lambda: _job(id=None), r"job id must be a non-empty string, got None"),
    ("Job id a number", lambda: _job(id=3), r"job id must be a non-empty string, got 3"),
    ("Job of a goodput model with a bad fixed batch", lambda: _job(speedup=_model(), fixed_batch_size=-4),
     r"fixed_batch_size must be an integer > 0"),
    # goodput model parts
    ("GoodputModel of None parts", lambda: GoodputModel(None, None, None), r"throughput_params must be a ThroughputParams"),
    ("BatchLimits with a string", lambda: BatchLimits(init_batch_size="32", max_batch_size=64), r"init_batch_size"),
    ("BatchLimits max below init", lambda: BatchLimits(init_batch_size=64, max_batch_size=32), r"max_batch_size must be >="),
    ("GradientStats of strings", lambda: GradientStats(grad_sqr="x", grad_var=1.0, init_batch_size=32), r"grad_sqr must be a number"),
    ("ThroughputParams of None", lambda: ThroughputParams(None, 0, 0, 0, 0, 0, 1.0), r"must be a number"),
    # instances
    ("parse_instance of a list", lambda: parse_instance([]), r"instance must be a JSON object, got list"),
    ("parse_instance of a string", lambda: parse_instance("{}"), r"instance must be a JSON object, got str"),
    ("instance_to_json of a dict", lambda: instance_to_json({"cluster": None}), r"instance must be an Instance"),
    ("instance_to_json of a model job", lambda: instance_to_json(Instance(_cluster(), (_job(speedup=_model()),), Options())),
     r"only explicit speedup tables can be written"),
]


def test_the_sweep_is_broad():
    assert len(MISUSES) >= 71
    assert len({name for name, _, _ in MISUSES}) == len(MISUSES)


@pytest.mark.parametrize("name, call, match", MISUSES, ids=[m[0] for m in MISUSES])
def test_misuse_raises_invalid_problem_naming_the_argument(name, call, match):
    with pytest.raises(InvalidProblem, match=match):
        call()


def test_numpy_scalars_are_admitted_where_python_numbers_are():
    job = _job(max_replicas=np.int32(2), weight=np.float32(2.0), placement={"n0": np.int16(1)})
    alloc = allocate(_cluster(), [job], p=np.float64(-1.0), solver="greedy")
    assert sum(alloc.placement["a"].values()) >= 1
