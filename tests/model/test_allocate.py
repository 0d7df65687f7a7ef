"""Domain layer: allocate(), instance files, the CLI and their error messages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from pollux_opt import (
    Cluster,
    GoodputModel,
    InvalidProblem,
    Job,
    Node,
    Options,
    Status,
    allocate,
    load_instance,
)
from pollux_opt.model import (
    BatchLimits,
    GradientStats,
    ThroughputParams,
    instance_to_json,
    parse_instance,
    restart_factor,
    to_problem,
)
from pollux_opt.model.instance import FORMAT_VERSION
from pollux_opt.cli.main import main
from solvers import evaluate, violations

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

EXAMPLE_INSTANCE = {
    "version": 1,
    "cluster": {"nodes": [{"id": "n0", "cpus": 4}, {"id": "n1", "cpus": 4}]},
    "jobs": [
        {
            "id": "a",
            "speedup_table": [[1, 1, 1.0], [1, 2, 1.8], [2, 2, 1.6]],
            "min_replicas": 0,
            "max_replicas": 2,
            "placement": {"n0": 1},
            "restarts": 0,
            "age": 120.0,
            "weight": 1.0,
        }
    ],
    "options": {
        "p": -1,
        "restart_delay": 30,
        "interference_avoidance": True,
        "max_nodes_per_job": 16,
        "time_limit": 10,
        "mip_gap": 0.0001,
    },
}


def _instance(**job_overrides) -> dict:
    data = json.loads(json.dumps(EXAMPLE_INSTANCE))
    data["jobs"][0].update(job_overrides)
    return data


def _instance_v2(**job_overrides) -> dict:
    data = _instance(**job_overrides)
    data["version"] = 2
    return data


def _model() -> GoodputModel:
    return GoodputModel(
        throughput_params=ThroughputParams(0.02, 0.001, 0.05, 0.01, 0.2, 0.05, 2.0),
        grad_stats=GradientStats(grad_sqr=1.0, grad_var=50.0, init_batch_size=32),
        limits=BatchLimits(init_batch_size=32, max_batch_size=1024, min_local_bsz=8, max_local_bsz=128),
    )


def test_example_instance_parses_and_solves():
    inst = parse_instance(EXAMPLE_INSTANCE)
    alloc = allocate(inst.cluster, inst.jobs, inst.options)
    assert alloc.status is Status.OPTIMAL
    # Moving from 1 to 2 replicas pays f = 120 / 150; 1.8 * 0.8 = 1.44 > 1.0 (staying put).
    assert sum(alloc.placement["a"].values()) == 2
    assert len(alloc.placement["a"]) == 1
    assert alloc.objective == pytest.approx(1.8 * 120 / 150 + 1e-3)


def test_minimal_fields_use_defaults():
    inst = parse_instance(
        {"cluster": {"nodes": [{"id": "x", "cpus": 2}]}, "jobs": [{"id": "j", "speedup_table": [[1, 1, 1.0]], "max_replicas": 1}]}
    )
    job = inst.jobs[0]
    assert (job.min_replicas, job.restarts, job.age, job.weight, dict(job.placement)) == (0, 0, 0.0, 1.0, {})
    assert inst.options == Options()


def test_version_1_file_uses_the_options_restart_delay():
    inst = parse_instance(EXAMPLE_INSTANCE)
    assert inst.jobs[0].restart_delay is None
    problem = to_problem(inst.cluster, inst.jobs, inst.options)
    assert problem.restart_factor.tolist() == [restart_factor(120.0, 0, 30.0)]


@pytest.mark.parametrize(
    "delay, factor",
    [(None, 120 / 150), (0, 1.0), (0.0, 1.0), (60.0, 120 / 180), (12.5, 120 / 132.5)],
)
def test_version_2_per_job_restart_delay(delay, factor):
    """A job's own restart_delay replaces options.restart_delay in its restart factor (0: free)."""
    inst = parse_instance(_instance_v2(restart_delay=delay))
    assert inst.jobs[0].restart_delay == delay
    problem = to_problem(inst.cluster, inst.jobs, inst.options)
    assert problem.restart_factor[0] == pytest.approx(factor, rel=1e-15)
    alloc = allocate(inst.cluster, inst.jobs, inst.options)
    assert sum(alloc.placement["a"].values()) == 2  # 1.8 * factor > 1.0 (staying) for each delay
    assert alloc.objective == pytest.approx(1.8 * factor + 1e-3)


def test_per_job_restart_delays_are_independent():
    table = {(1, 1): 1.0, (1, 2): 1.8}
    jobs = [Job("own", table, max_replicas=2, age=100.0, restarts=1, restart_delay=10.0),
            Job("zero", table, max_replicas=2, age=100.0, restarts=1, restart_delay=0.0),
            Job("default", table, max_replicas=2, age=100.0, restarts=1)]
    problem = to_problem(Cluster.uniform(1, 6), jobs, Options(restart_delay=20.0))
    assert problem.restart_factor.tolist() == [90 / 110, 1.0, 80 / 120]


def test_instance_round_trip_writes_the_current_version():
    inst = parse_instance(_instance_v2(restart_delay=7.5))
    data = instance_to_json(inst)
    assert data["version"] == 3 == FORMAT_VERSION
    assert data["jobs"][0]["restart_delay"] == 7.5
    assert parse_instance(json.loads(json.dumps(data))) == inst
    plain = instance_to_json(parse_instance(EXAMPLE_INSTANCE))  # version 1 in, version 3 out
    assert plain["version"] == 3 and "restart_delay" not in plain["jobs"][0]
    assert "type" not in plain["cluster"]["nodes"][0]
    assert parse_instance(plain) == parse_instance(EXAMPLE_INSTANCE)


def test_restart_factor_formula():
    assert restart_factor(120.0, 0, 30.0) == pytest.approx(120 / 150)
    assert restart_factor(100.0, 2, 30.0) == pytest.approx(40 / 130)
    assert restart_factor(10.0, 5, 30.0) == 0.0
    assert restart_factor(0.0, 0, 0.0) == 1.0


def test_unchanged_placement_pays_no_restart_factor():
    job = Job("a", {(1, 1): 1.0, (1, 2): 1.05}, max_replicas=2, placement={"n0": 1}, age=60.0)
    alloc = allocate(Cluster.uniform(1, 4), [job])
    # Growing would give 1.05 * 60/90 = 0.7 < 1.0, so the job stays and keeps x = 1.
    assert alloc.placement["a"] == {"n0": 1}
    assert alloc.objective == pytest.approx(1.0 + 1e-3)


def test_goodput_model_job_gets_batch_config():
    cluster = Cluster.uniform(2, 4)
    jobs = [Job("g", _model(), max_replicas=8), Job("t", {(1, 1): 1.0, (1, 2): 1.9}, max_replicas=2)]
    alloc = allocate(cluster, jobs)
    assert alloc.status is Status.OPTIMAL
    k = sum(alloc.placement["g"].values())
    assert k >= 1
    b = alloc.batch["g"]
    assert b.batch_size == k * b.local_bsz * (b.accum_steps + 1)
    assert 32 <= b.batch_size <= 1024 and 8 <= b.local_bsz <= 128
    assert "t" not in alloc.batch


def test_spread_penalty_prefers_compact_placements_of_model_jobs():
    """A goodput model tells one node from several, not 2 nodes from 4: the
    spread penalty discounts each extra node, so the solver packs the job."""
    cluster = Cluster.uniform(4, 4)
    job = Job("g", _model(), min_replicas=8, max_replicas=8)
    flat = to_problem(cluster, [job], Options(spread_penalty=0.0))
    assert flat.cfg_nodes.tolist() == [2, 3, 4]
    assert len(set(flat.cfg_speedup.tolist())) == 1  # the model cannot tell the spreads apart
    opts = Options()
    assert opts.spread_penalty > 0
    compact = to_problem(cluster, [job], opts)
    expected = flat.cfg_speedup * (1 - opts.spread_penalty * (flat.cfg_nodes - 1))
    np.testing.assert_allclose(compact.cfg_speedup, expected, rtol=1e-12)
    alloc = allocate(cluster, [job])
    assert sorted(alloc.placement["g"].values()) == [4, 4]
    # Explicit tables are used as given.
    table = {(2, 8): 1.0, (3, 8): 1.0}
    explicit = to_problem(cluster, [Job("t", table, min_replicas=8, max_replicas=8)], opts)
    assert explicit.cfg_speedup.tolist() == [1.0, 1.0]


def test_encoded_objective_matches_allocation():
    inst = load_instance(EXAMPLES / "cluster-4x4-6jobs.json")
    alloc = allocate(inst.cluster, inst.jobs, inst.options)
    problem = to_problem(inst.cluster, inst.jobs, inst.options)
    ids = inst.cluster.node_ids
    x = np.array([[alloc.placement[j.id].get(n, 0) for n in ids] for j in inst.jobs])
    assert violations(problem, x) == []
    assert evaluate(problem, x) == pytest.approx(alloc.objective)
    assert alloc.bound >= alloc.objective - 1e-9


@pytest.mark.parametrize("solver", ["milp", "greedy", "evolutionary"])
def test_every_solver_reachable_through_allocate(solver):
    pytest.importorskip("jax") if solver == "evolutionary" else None
    inst = load_instance(EXAMPLES / "cluster-4x4-6jobs.json")
    alloc = allocate(inst.cluster, inst.jobs, inst.options, solver=solver, seed=1)
    assert alloc.solver == solver
    assert alloc.status.has_solution
    assert math.isfinite(alloc.objective)


# ------------------------------------------------------------ error messages
@pytest.mark.parametrize(
    "data, match",
    [
        ({**EXAMPLE_INSTANCE, "cluster": {"nodes": [{"id": "n0", "cpus": 0}]}}, r"cluster\.nodes\[0\]\.cpus must be an integer in \[1, 2147483647\], got 0"),
        ({**EXAMPLE_INSTANCE, "cluster": {"nodes": [{"id": "n0", "cpus": -2}]}}, r"cpus must be an integer in \[1, 2147483647\], got -2"),
        (_instance(min_replicas=3, max_replicas=2), r"job 'a': min_replicas=3 > max_replicas=2"),
        (_instance(speedup_table=[[1, 1, float("nan")]]), r"job 'a': speedup at \(num_nodes=1, num_replicas=1\) must be a finite number in \[0, 2147483648\], got nan"),
        (_instance(speedup_table=[[1, 1, float("inf")]]), r"job 'a': speedup at \(num_nodes=1, num_replicas=1\) must be a finite number in \[0, 2147483648\], got inf"),
        (_instance(speedup_table=[[1, 1, -0.5]]), r"job 'a': speedup at \(num_nodes=1, num_replicas=1\) must be a finite number in \[0, 2147483648\], got -0\.5"),
        (_instance(speedup_table=[[1, 1, 1.0], [1, 1, 2.0]]), r"jobs\[0\]\.speedup_table\[1\] repeats \(num_nodes, num_replicas\) = \(1, 1\)"),
        (_instance(speedup_table=[[1, "x", 1.0]]), r"jobs\[0\]\.speedup_table\[0\] must be \[num_nodes, num_replicas, speedup\]"),
        (_instance(speedup_table=[[2, 1, 1.0]]), r"needs 1 <= num_nodes <= num_replicas"),
        (_instance(placement={"nX": 1}), r"job 'a': placement on unknown node 'nX'"),
        (_instance(placement={"n0": 5}), r"placement over capacity on node 'n0': 5 replicas > 4 cpus"),
        (_instance(placement={"n0": -1}), r"placement on node 'n0' must be an integer in \[0, 2147483647\], got -1"),
        (_instance(weight=0), r"job 'a': weight must be a finite number in \[1e-06, 1000000\], got 0"),
        (_instance(age=-1), r"job 'a': age must be a finite number >= 0, got -1"),
        (_instance(bogus=1), r"jobs\[0\]: unknown field 'bogus'"),
        ({**EXAMPLE_INSTANCE, "jobs": EXAMPLE_INSTANCE["jobs"] * 2}, r"duplicate job id 'a'"),
        ({**EXAMPLE_INSTANCE, "cluster": {"nodes": [{"id": "n0", "cpus": 4}] * 2}}, r"duplicate node id 'n0'"),
        ({**EXAMPLE_INSTANCE, "options": {"p": float("nan")}}, r"p must be a finite number in \[-5, 5\], got nan"),
        ({**EXAMPLE_INSTANCE, "options": {"p": float("inf")}}, r"p must be a finite number in \[-5, 5\], got inf"),
        ({**EXAMPLE_INSTANCE, "options": {"colour": "red"}}, r"unknown option 'colour'"),
        ({**EXAMPLE_INSTANCE, "options": {"mip_gap": 2}}, r"mip_gap must be a finite number in \[0, 1\), got 2"),
        ({**EXAMPLE_INSTANCE, "options": {"time_limit": 0}}, r"time_limit must be a number of seconds > 0 or None, got 0"),
        ({**EXAMPLE_INSTANCE, "options": {"restart_delay": -1}}, r"restart_delay must be a finite number of seconds >= 0, got -1"),
        ({**EXAMPLE_INSTANCE, "options": {"max_nodes_per_job": 0}}, r"max_nodes_per_job must be an integer in \[1, 2147483647\], got 0"),
        ({**EXAMPLE_INSTANCE, "options": {"spread_penalty": -0.1}},
         r"spread_penalty must be a finite number >= 0 or None, got -0\.1"),
        ({**EXAMPLE_INSTANCE, "options": {"spread_penalty": 0.5, "max_nodes_per_job": 3}},
         r"spread_penalty must be >= 0 and below 1 / \(max_nodes_per_job - 1\) = 0\.5, got 0\.5"),
        ({**EXAMPLE_INSTANCE, "version": 4}, r"version must be one of \[1, 2, 3\], got 4"),
        ({**EXAMPLE_INSTANCE, "version": True}, r"version must be one of \[1, 2, 3\], got True"),
        ({**EXAMPLE_INSTANCE, "version": 2.0}, r"version must be one of \[1, 2, 3\], got 2\.0"),
        (_instance(id=None), r"jobs\[0\]\.id must be a non-empty string, got None"),
        (_instance(id=7), r"jobs\[0\]\.id must be a non-empty string, got 7"),
        (_instance(id=""), r"jobs\[0\]\.id must be a non-empty string, got ''"),
        ({**EXAMPLE_INSTANCE, "cluster": {"nodes": [{"id": None, "cpus": 4}]}},
         r"cluster\.nodes\[0\]\.id must be a non-empty string, got None"),
        ({**EXAMPLE_INSTANCE, "cluster": {"nodes": [{"id": "n0", "cpus": True}]}},
         r"cluster\.nodes\[0\]\.cpus must be an integer in \[1, 2147483647\], got True"),
        (_instance(restart_delay=10.0), r"jobs\[0\]: unknown field 'restart_delay' in a version 1 file "
                                        r"\(per-job restart delays need version 2\)"),
        (_instance_v2(restart_delay=-5), r"job 'a': restart_delay must be a finite number of seconds >= 0 or None, got -5"),
        (_instance_v2(restart_delay="30"),
         r"job 'a': restart_delay must be a finite number of seconds >= 0 or None, got '30'"),
        (_instance_v2(restart_delay=float("inf")),
         r"job 'a': restart_delay must be a finite number of seconds >= 0 or None, got inf"),
        (_instance_v2(restart_delay=True),
         r"job 'a': restart_delay must be a finite number of seconds >= 0 or None, got True"),
        ({"cluster": {"nodes": []}, "jobs": []}, r"cluster\.nodes must not be empty"),
        ({"jobs": []}, r"instance\.cluster is required"),
        (_instance(max_replicas=None), r"max_replicas must be an integer in \[0, 2147483647\], got None"),
    ],
)
def test_bad_input_is_named(data, match):
    with pytest.raises(InvalidProblem, match=match):
        inst = parse_instance(data)
        allocate(inst.cluster, inst.jobs, inst.options)


def test_unknown_solver_is_named():
    inst = parse_instance(EXAMPLE_INSTANCE)
    with pytest.raises(InvalidProblem, match=r"unknown solver 'nope'; choose one of"):
        allocate(inst.cluster, inst.jobs, inst.options, solver="nope")


def test_unknown_override_is_named():
    inst = parse_instance(EXAMPLE_INSTANCE)
    with pytest.raises(InvalidProblem, match=r"unknown option 'speed'"):
        allocate(inst.cluster, inst.jobs, speed=3)


def test_invalid_problem_is_value_error():
    assert issubclass(InvalidProblem, ValueError)
    with pytest.raises(ValueError, match=r"node 'n': cpus must be an integer in \[1, 2147483647\], got 0"):
        Node("n", 0)


def test_malformed_json_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "cluster": ')
    with pytest.raises(InvalidProblem, match=r"malformed JSON in '.*bad\.json': Expecting value at line 1"):
        load_instance(bad)
    with pytest.raises(InvalidProblem, match=r"cannot read instance file '.*missing\.json'"):
        load_instance(tmp_path / "missing.json")


# -------------------------------------------------------------------- CLI
def test_cli_allocate_prints_pinned_keys(tmp_path, capsys):
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(EXAMPLE_INSTANCE))
    assert main(["allocate", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("placement", "objective", "bound", "gap", "status", "build_seconds", "solve_seconds"):
        assert key in out
    assert out["status"] == "optimal"
    assert sum(out["placement"]["a"].values()) == 2


def test_cli_bad_input_exits_2_without_traceback(tmp_path, capsys):
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(_instance(min_replicas=5)))
    assert main(["allocate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "min_replicas=5 > max_replicas=2" in err
    assert "Traceback" not in err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["allocate", str(bad)]) == 2
    assert "malformed JSON" in capsys.readouterr().err
    assert main(["allocate", str(path.with_name("none.json")), "--solver", "milp"]) == 2
    assert main(["allocate", str(EXAMPLES / "small.json"), "--solver", "nope"]) == 2
    assert "unknown solver 'nope'" in capsys.readouterr().err


def test_default_spread_penalty_shrinks_for_very_wide_jobs_instead_of_failing():
    assert Options().spread_penalty == pytest.approx(1e-3)
    wide = Options(max_nodes_per_job=2000)
    assert wide.spread_penalty * (2000 - 1) == pytest.approx(0.5)
    assert Options.from_mapping({"max_nodes_per_job": 2000}).spread_penalty == wide.spread_penalty
    with pytest.raises(InvalidProblem, match=r"spread_penalty must be >= 0 and below 1 / \(max_nodes_per_job - 1\)"):
        Options(max_nodes_per_job=2000, spread_penalty=1e-3)
