"""The job agent (measurements, refit rule, goodput model), typed measurement
keys, and who owns the batch a job runs.  No
worker processes here."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.lifecycle import JobState
from pollux_opt.model import BatchLimits, ThroughputParams, step_time, sync_time
from pollux_opt.agent.agent import REFIT_GROWTH, JobAgent
from pollux_opt.agent.measurements import ConfigKey, Measurements, profile_from_json, profile_to_json, record_step

LIMITS = BatchLimits(init_batch_size=32, max_batch_size=1024, min_local_bsz=4, max_local_bsz=128)
TRUTH = ThroughputParams(alpha_c=0.002, beta_c=3e-5, alpha_n=0.004, beta_n=0.0, alpha_r=0.004, beta_r=0.0, gamma=1.0)


def _times(key: ConfigKey) -> tuple[float, float]:
    n, k, m, s = key
    return float(step_time(TRUTH, n, k, m, s)), float(sync_time(TRUTH, n, k))


# ------------------------------------------------------------------ typed keys
def test_config_key_reads_and_writes_the_string_form():
    key = ConfigKey(1, 2, 64, 1)
    assert str(key) == "1,2,64,1" and ConfigKey.parse("1,2,64,1") == key and ConfigKey.of(key) is key
    assert sorted([ConfigKey(1, 2, 8, 0), ConfigKey(1, 1, 16, 0), ConfigKey(1, 1, 8, 0)])[0] == ConfigKey(1, 1, 8, 0)
    for bad in ("1,2,64", "1,2,x,0", 7):
        with pytest.raises(InvalidProblem, match="configuration key must be 'N,K,m,s'"):
            ConfigKey.parse(bad)


def test_profiles_round_trip_through_json_with_string_keys():
    profile: dict = {}
    record_step(profile, ConfigKey(1, 2, 32, 0), 0.02, 0.005, 0.015)
    record_step(profile, ConfigKey(1, 2, 32, 0), 0.03, 0.005, 0.025)
    record_step(profile, ConfigKey(1, 1, 64, 1), 0.05, 0.0, 0.05)
    data = json.loads(json.dumps(profile_to_json(profile)))
    assert set(data) == {"1,2,32,0", "1,1,64,1"}
    back = profile_from_json(data)
    assert back == profile and all(isinstance(k, ConfigKey) for k in back)
    # Files written with string keys read as the same measurements.
    assert Measurements.from_profile(data).keys() == Measurements.from_profile(profile).keys()
    rows = Measurements.from_profile(profile)
    assert rows.keys() == [ConfigKey(1, 1, 64, 1), ConfigKey(1, 2, 32, 0)]
    assert rows.count_of(ConfigKey(1, 2, 32, 0)) == 2 and rows.count_of(ConfigKey(2, 2, 32, 0)) == 0


def test_training_state_checkpoints_profiles_with_string_keys():
    from pollux_opt.runtime.state import TrainingState

    state = TrainingState()
    record_step(state.profile, ConfigKey(1, 1, 16, 1), 0.01, 0.0, 0.01)
    saved = state.to_dict()
    assert list(saved["profile"]) == ["1,1,16,1"]
    json.dumps(saved)  # JSON-safe, as the checkpoint metadata needs
    assert TrainingState.from_dict(saved).profile == state.profile


# ---------------------------------------------------------------------- agent
def test_runtime_agent_refits_whenever_the_measurements_changed():
    agent = JobAgent(LIMITS)
    assert agent.model() is None and agent.refit() is None and not agent.stale()
    profile: dict = {}
    for key in (ConfigKey(1, 1, 16, 0), ConfigKey(1, 1, 64, 0), ConfigKey(1, 2, 32, 0)):
        for _ in range(3):
            record_step(profile, key, *_times(key), 0.0)
    agent.update_profile({k: dict(v) for k, v in profile.items()})
    assert agent.stale() and agent.model() is None  # no gradient statistics yet
    params = agent.refit()
    assert params is not None and not agent.stale() and agent.refit() is params
    record_step(profile, ConfigKey(1, 1, 16, 0), *_times(ConfigKey(1, 1, 16, 0)), 0.0)
    agent.update_profile({k: dict(v) for k, v in profile.items()})
    assert agent.stale()
    agent.update_stats((1.0, 4.0), steps=30)
    model = agent.model()
    assert model is not None and agent.params is not params and model.grad_stats.grad_var == 4.0
    assert agent.most_replicas == 2 and len(agent.measurements) == 3


def test_simulator_agent_refits_on_a_new_pair_or_growth_and_shares_fits():
    cache: dict = {}
    agent = JobAgent(LIMITS, refit_growth=REFIT_GROWTH, fit_cache=cache)
    twin = JobAgent(LIMITS, refit_growth=REFIT_GROWTH, fit_cache=cache)
    for a in (agent, twin):
        a.update_stats((1.0, 2.0))
        for key in (ConfigKey(1, 1, 16, 0), ConfigKey(1, 1, 32, 0), ConfigKey(1, 1, 48, 0)):
            a.add_measurement(key, *_times(key))
    first = agent.model().throughput_params
    assert twin.model().throughput_params is first  # the same measurements: one fit
    agent.add_measurement(ConfigKey(1, 1, 16, 0), 99.0, 0.0)  # a configuration's first report stands
    assert agent.measurements.step_time[0] == _times(ConfigKey(1, 1, 16, 0))[0]
    agent.add_measurement(ConfigKey(1, 1, 64, 0), *_times(ConfigKey(1, 1, 64, 0)))
    assert not agent.stale()  # 4 < 1.5 * 3 configurations, no new (nodes, replicas) pair
    agent.add_measurement(ConfigKey(1, 2, 16, 0), *_times(ConfigKey(1, 2, 16, 0)))
    assert agent.stale() and agent.model().throughput_params is not first


def test_agent_keeps_its_model_while_the_statistics_repeat_to_the_bit():
    agent = JobAgent(LIMITS, refit_growth=REFIT_GROWTH)
    agent.add_measurement(ConfigKey(1, 1, 32, 0), *_times(ConfigKey(1, 1, 32, 0)))
    agent.update_stats((1.0, 0.0), steps=3)
    model = agent.model()
    agent.update_stats((1.0, 0.0), steps=5)
    assert agent.model() is model and agent.stats_steps == 5
    agent.update_stats((1.0, -0.0))  # equal, not the same bits: rebuilt
    assert agent.model() is not model and math.copysign(1.0, agent.reported_stats[1]) == -1.0
    agent.update_stats((1.0, 2.0))
    assert agent.model().grad_stats.grad_var == 2.0


def test_fixed_batch_agent_stands_in_neutral_statistics():
    agent = JobAgent(LIMITS, fixed_batch=True)
    agent.add_measurement(ConfigKey(1, 1, 32, 0), *_times(ConfigKey(1, 1, 32, 0)))
    model = agent.model()
    assert model is not None and model.grad_stats.grad_var == 0.0


# ------------------------------------------------------------- who owns the batch
def test_real_backend_sends_placements_and_the_job_picks_its_batch(tmp_path, monkeypatch):
    """The backend's commands carry placements only; under a fixed-batch policy
    each job is made to train at its submitted batch size, which the log records."""
    from pollux_opt.backends.local.backend import RealBackend
    from pollux_opt.backends.local.handle import elastic_factory, elastic_opener
    from pollux_opt.model import Cluster
    from pollux_opt.records.events import EventLog, read_events
    from pollux_opt.runtime.job import ElasticJob
    from pollux_opt.scheduling.loop import Decision
    from pollux_opt.workloads.job import Workload, WorkloadJob

    sent = []
    monkeypatch.setattr(ElasticJob, "_queue", lambda self, request, payload, *rest: sent.append(payload))
    workload = Workload("one", (WorkloadJob("a", "digits-cnn", 0.0, 1, 64),))
    clock = [1000.0]
    with EventLog(tmp_path / "events.jsonl") as events:
        backend = RealBackend(tmp_path, workload, Cluster.uniform(1, 2), events, fixed_batch=True,
                              started_unix=1000.0, pin_cpus=False, job_factory=elastic_factory,
                              job_opener=elastic_opener, clock=lambda: clock[0], sleep=lambda s: None)
        backend.views()
        assert backend.jobs["a"].handle.options.fixed_batch_size == 64

        def decide(placement):
            backend.apply(Decision({"a": placement}, math.nan, 0.0, "test"))

        decide({"n0": 1})
        assert sent[-1].placement == {"n0": 1} and sent[-1].pin is None
        job = backend.jobs["a"]  # now training there
        job.state, job.report = JobState.RUNNING, dataclasses.replace(job.report, placement={"n0": 1})
        decide({"n0": 1})
        assert len(sent) == 1  # nothing changed: nothing sent
        decide({"n0": 2})
        assert len(sent) == 2 and sent[-1].placement == {"n0": 2} and sent[-1].pin is None
    logged = {e["type"]: e for e in read_events(tmp_path / "events.jsonl")}
    assert logged["submit"]["fixed_batch_size"] == 64
    assert "batch_size" not in logged["start"] and "batch_size" not in logged["rescale_begin"]
