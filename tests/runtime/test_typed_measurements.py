"""A job on a cluster of several node types: its allocation names the types, its
step times go to the agent of the type they ran on, checkpoints restore them,
and its report projects unmeasured types from measured ones."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pollux_opt import InvalidProblem
from pollux_opt.model import BatchLimits, ThroughputParams, step_time, sync_time
from pollux_opt.model.projection import projection_plan
from pollux_opt.runtime.allocation import parse_allocation
from pollux_opt.agent.measurements import ConfigKey, profile_to_json, record_step
from pollux_opt.runtime.entry import get_job
from pollux_opt.runtime.report import RuntimeOptions
from pollux_opt.runtime.state import TrainingState
from pollux_opt.runtime.status import EVENTS_FILE, STEP_COLUMNS, STEPS_FILE, JobStatus, step_log

LIMITS = BatchLimits(init_batch_size=32, max_batch_size=1024, min_local_bsz=4, max_local_bsz=128)
FAST = ThroughputParams(alpha_c=0.002, beta_c=3e-5, alpha_n=0.004, beta_n=0.0, alpha_r=0.004, beta_r=0.0, gamma=1.0)
#: The same job on a node of half the speed: every time doubled.
SLOW = ThroughputParams(alpha_c=0.004, beta_c=6e-5, alpha_n=0.008, beta_n=0.0, alpha_r=0.008, beta_r=0.0, gamma=1.0)


def _profile(truth: ThroughputParams, keys) -> dict:
    profile: dict = {}
    for key in keys:
        n, k, m, s = key
        for _ in range(3):
            record_step(profile, key, float(step_time(truth, n, k, m, s)), float(sync_time(truth, n, k)), 0.0)
    return profile


ONE_NODE = [ConfigKey(1, 1, m, 0) for m in (8, 32, 128)]


def _status(workdir) -> JobStatus:
    return JobStatus("job", get_job("synth-regress"), RuntimeOptions(), workdir)


def _metrics(pooled: dict, typed: dict, stats=(1.0, 2.0)) -> dict:
    return {"stats": list(stats), "stats_steps": 20, "profile": pooled, "type_profiles": typed}


# ----------------------------------------------------------------- allocation
def test_allocation_names_each_nodes_type_and_cgroup():
    a = parse_allocation(LIMITS, None, {"fast-0": 1, "slow-0": 2}, None, None, None, None,
                         node_types={"fast-0": "fast", "slow-0": "slow"},
                         cgroups={"fast-0": "/sys/fs/cgroup/cpu", "slow-0": "/sys/fs/cgroup/cpu/g"})
    assert a.rank_nodes() == ["fast-0", "slow-0", "slow-0"]
    assert a.node_type is None  # over two types: no type keeps its measurements
    one = parse_allocation(LIMITS, None, {"slow-0": 1}, None, None, None, None, node_types={"slow-0": "slow"})
    assert one.node_type == "slow" and one.cgroups is None
    assert not one.same_workers(parse_allocation(LIMITS, None, {"slow-0": 1}, None, None, None, None))
    untyped = parse_allocation(LIMITS, None, {"n0": 1}, None, None, None, None)
    assert untyped.node_type is None and untyped.node_types is None


@pytest.mark.parametrize("kwargs, match", [
    ({"node_types": {"other": "fast"}}, r"node_types must name exactly the placement's nodes \['a'\]"),
    ({"node_types": {"a": "bad type!"}}, r"node_types\['a'\]"),
    ({"cgroups": {"a": "relative/dir"}}, r"cgroups\['a'\] must be an absolute cgroup directory"),
    ({"cgroups": ["/x"]}, "cgroups must map each node of the placement"),
])
def test_bad_node_types_and_cgroups_are_named(kwargs, match):
    with pytest.raises(InvalidProblem, match=match):
        parse_allocation(LIMITS, None, {"a": 1}, None, None, None, None, **kwargs)


# ------------------------------------------------------------------- routing
def test_steps_go_to_the_type_they_ran_on_and_statistics_are_shared(tmp_path):
    st = _status(tmp_path)
    fast, slow = _profile(FAST, ONE_NODE), _profile(SLOW, ONE_NODE[:2])
    st.take_measurements(_metrics({**fast}, {"fast": fast, "slow": slow}))
    assert set(st.type_agents) == {"fast", "slow"}
    assert st.type_agents["fast"].measurements.keys() == ONE_NODE
    assert st.type_agents["slow"].measurements.keys() == ONE_NODE[:2]
    assert all(a.reported_stats == (1.0, 2.0) for a in (st.agent, *st.type_agents.values()))
    st.refit()
    with st.lock:
        report = st.report()
    assert set(report.type_measurements) == {"fast", "slow"}
    assert all(report.type_params[t] is not None for t in ("fast", "slow"))
    assert report.throughput_params is not None  # the pooled fit stands beside them


def test_an_untyped_job_has_no_type_agents_and_no_typed_models(tmp_path):
    st = _status(tmp_path)
    st.take_measurements({"stats": [1.0, 2.0], "stats_steps": 5, "profile": _profile(FAST, ONE_NODE)})
    st.refit()
    with st.lock:
        report = st.report()
    assert st.type_agents == {} and report.type_measurements == {}
    assert report.goodput_models(("fast", "slow")) is None
    assert report.goodput_model() is not None


def test_type_profiles_survive_a_checkpoint(tmp_path):
    state = TrainingState()
    record_step(state.type_profiles.setdefault("slow", {}), ConfigKey(1, 1, 16, 0), 0.02, 0.0, 0.02)
    saved = json.loads(json.dumps(state.to_dict()))
    assert TrainingState.from_dict(saved).type_profiles == state.type_profiles
    assert TrainingState.from_dict({k: v for k, v in saved.items() if k != "type_profiles"}).type_profiles == {}

    st = _status(tmp_path)
    meta = {"step": 10, "progress": 5.0, "samples": 320, "profile": profile_to_json(_profile(FAST, ONE_NODE)),
            "type_profiles": {"fast": profile_to_json(_profile(FAST, ONE_NODE)),
                              "slow": profile_to_json(_profile(SLOW, ONE_NODE[:1]))},
            "stats": [1.0, 2.0], "stats_steps": 10}
    st.absorb_meta(json.loads(json.dumps(meta)))
    assert st.type_agents["slow"].measurements.keys() == ONE_NODE[:1]
    assert st.type_agents["fast"].measurements.keys() == ONE_NODE
    assert st.type_agents["slow"].reported_stats == (1.0, 2.0)


# ---------------------------------------------------------------- projection
def _report(typed: dict, workdir):
    st = _status(workdir)
    st.take_measurements(_metrics({}, typed))
    st.refit()
    with st.lock:
        return st.report()


def test_each_measured_type_has_its_own_model(tmp_path):
    report = _report({"fast": _profile(FAST, ONE_NODE), "slow": _profile(SLOW, ONE_NODE)}, tmp_path)
    models = report.goodput_models(("fast", "slow"))
    assert models["fast"].throughput_params == report.type_params["fast"]
    assert models["slow"].throughput_params == report.type_params["slow"]
    t = {name: float(step_time(models[name].throughput_params, 1, 1, 32, 0)) for name in models}
    assert t["slow"] / t["fast"] == pytest.approx(2.0, rel=0.05)  # measured, not declared
    assert models["fast"].grad_stats is models["slow"].grad_stats or \
        models["fast"].grad_stats == models["slow"].grad_stats


def test_an_unmeasured_type_is_projected_at_ratio_one_until_measured(tmp_path):
    report = _report({"fast": _profile(FAST, ONE_NODE)}, tmp_path)
    models = report.goodput_models(("fast", "slow"))
    assert set(models) == {"fast", "slow"}
    src, proj = models["fast"].throughput_params, models["slow"].throughput_params
    for name in ("alpha_c", "beta_c", "alpha_n", "alpha_r"):
        assert getattr(proj, name) == pytest.approx(getattr(src, name))


def test_projection_plan_rules():
    # measured (no arrival profile): own; unmeasured: the most-measured type at ratio 1
    assert projection_plan(("a", "b", "c"), {"a": [1, 1, 2], "b": [1]}, {"a", "b"}, {}) == {
        "a": ("a", 1.0), "b": ("b", 1.0), "c": ("a", 1.0)}
    # profiled on arrival: the bootstrap ratio of the one-replica throughputs
    plan = projection_plan(("a", "b"), {"a": [1, 2, 4], "b": [1]}, {"a", "b"}, {"a": 10.0, "b": 5.0})
    assert plan == {"a": ("a", 1.0), "b": ("a", 0.5)}
    # measured but not fitted yet: nothing stands for it
    assert projection_plan(("a", "b"), {"a": [1], "b": [1]}, {"a"}, {}) == {"a": ("a", 1.0)}
    assert projection_plan(("a",), {}, set(), {}) == {}


def test_projection_plan_keeps_the_simulators_single_replica_rule():
    # every type profiled once, none measured beyond: each keeps its own arrival fit
    plan = projection_plan(("a", "b"), {"a": [1], "b": [1]}, {"a", "b"}, {"a": 2.0, "b": 1.0})
    assert plan == {"a": ("a", 1.0), "b": ("b", 1.0)}
    assert np.isfinite(list(plan.values())[0][1])



def test_a_restored_job_drops_torn_log_lines_before_appending(tmp_path):
    """A crash mid-append tears the last line of events.jsonl or steps.csv; the
    restored job's next line starts on a line of its own."""
    row = [0] * len(STEP_COLUMNS)
    first = _status(tmp_path)
    first.record("started", {"step": 0})
    first._append_steps([row])
    with open(tmp_path / EVENTS_FILE, "a") as fh:
        fh.write('{"time": 1, "ki')
    with open(tmp_path / STEPS_FILE, "a") as fh:
        fh.write("7,0.1")
    again = _status(tmp_path)
    again.restore()
    again.record("restarted", {"step": 1})
    again._append_steps([row])
    assert [e.kind for e in again.events] == ["started", "restarted"]
    assert [json.loads(line)["kind"] for line in (tmp_path / EVENTS_FILE).read_text().splitlines()] == [
        "started", "restarted"]
    assert len(step_log(tmp_path)) == 2
