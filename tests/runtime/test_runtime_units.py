"""Unit tests of the elastic job runtime's pure parts: gradient statistics,
AdaScale gain, batch co-adaptation, checkpoints, specs, options, the registry,
the lazy torch import and the job controller's lifecycle.  No worker processes
here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pollux_opt import InvalidProblem
from pollux_opt.model import BatchConfig, BatchLimits, GoodputModel, GradientStats, ThroughputParams
from pollux_opt.agent.agent import MIN_STATS_STEPS, JobAgent
from pollux_opt.agent.batch import choose_batch
from pollux_opt.agent.measurements import ConfigKey
from pollux_opt.runtime.checkpoint import (
    atomic_write_json,
    latest_good,
    list_checkpoints,
    load_payload,
    prune,
    save_checkpoint,
)
from pollux_opt.lifecycle import JobState
from pollux_opt.runtime.allocation import normalize_placement
from pollux_opt.runtime.report import JobReport, Measurements, RuntimeOptions
from pollux_opt.agent.stats import GradStatsEMA, adascale_gain, lr_factor, micro_batch_estimates
from pollux_opt.runtime import JobSpec, get_job, heldout_error, job_names, register_job

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------- gradient statistics
def test_micro_batch_estimators_are_unbiased():
    """Per-sample gradients G + noise (trace of covariance sigma2): the averages of
    the estimates over many draws match |G|^2 and sigma2 / M0."""
    rng = np.random.default_rng(0)
    dim, n, m, m0, trials = 20, 4, 8, 32, 4000
    grad = rng.standard_normal(dim) * 0.3
    scales = rng.uniform(0.5, 2.0, dim)
    sigma2 = float((scales**2).sum())
    per_sample = grad + rng.standard_normal((trials, n, m, dim)) * scales
    micro = per_sample.mean(axis=2)  # (trials, n, dim): n micro-batch gradients
    sums = (micro**2).sum(axis=(1, 2))
    means = (micro.mean(axis=1) ** 2).sum(axis=1)
    est = np.array([micro_batch_estimates(s, t, n, m, m0) for s, t in zip(sums, means)])
    sqr_true, var_true = float(grad @ grad), sigma2 / m0
    stderr = est.std(axis=0) / math.sqrt(trials)
    assert abs(est[:, 0].mean() - sqr_true) < 4 * stderr[0]
    assert abs(est[:, 1].mean() - var_true) < 4 * stderr[1]


def test_micro_batch_estimates_need_two_gradients():
    with pytest.raises(ValueError, match="n must be >= 2 micro-batches"):
        micro_batch_estimates(1.0, 1.0, 1, 8, 8)


def test_ema_is_bias_corrected_and_clips_noise():
    ema = GradStatsEMA()
    assert ema.estimate() is None
    for _ in range(3):
        ema.update(2.0, 5.0, scale=1.0)
    sqr, var = ema.estimate()
    assert sqr == pytest.approx(2.0) and var == pytest.approx(5.0)
    noisy = GradStatsEMA()
    noisy.update(-1.0, 4.0, scale=1.0)  # an unbiased |G|^2 estimate can be negative
    sqr, var = noisy.estimate()
    assert sqr > 0 and var == pytest.approx(4.0)
    restored = GradStatsEMA.from_state(json.loads(json.dumps(ema.state())))
    assert restored.estimate() == ema.estimate()


@settings(max_examples=200, deadline=None)
@given(
    sqr=st.floats(1e-6, 1e3), var=st.floats(0.0, 1e3), scale=st.floats(1.0, 1e3),
)
def test_adascale_gain_is_between_one_and_the_scale(sqr, var, scale):
    gain = adascale_gain((sqr, var), scale)
    assert 1.0 - 1e-9 <= gain <= scale * (1 + 1e-9)
    assert adascale_gain((sqr, var), 1.0) == pytest.approx(1.0)


def test_gain_without_statistics_gives_no_credit_for_a_larger_batch():
    assert adascale_gain(None, 8.0) == 1.0
    assert adascale_gain(None, 0.5) == 0.5


def test_lr_rules():
    assert lr_factor("adascale", 3.0, 8.0) == 3.0
    assert lr_factor("sqrt", 3.0, 16.0) == 4.0
    assert lr_factor("linear", 3.0, 8.0) == 8.0
    assert lr_factor("none", 3.0, 8.0) == 1.0
    with pytest.raises(ValueError, match="unknown lr_scaling rule 'cubic'"):
        lr_factor("cubic", 1.0, 1.0)


# ----------------------------------------------------------------- co-adaptation
LIMITS = BatchLimits(init_batch_size=32, max_batch_size=1024, max_local_bsz=256)
PARAMS = ThroughputParams(alpha_c=0.01, beta_c=1e-4, alpha_n=0.005, beta_n=0.0, alpha_r=0.005, beta_r=0.0, gamma=1.0)


def _model(grad_var: float) -> GoodputModel:
    """A goodput model of ``PARAMS`` with |G|^2 = 1 and the given gradient variance at M0."""
    return GoodputModel(PARAMS, GradientStats(grad_sqr=1.0, grad_var=grad_var, init_batch_size=32), LIMITS)


def test_single_replica_runs_two_micro_batches():
    assert choose_batch(LIMITS, 1, 1, None, fixed_batch_size=64) == BatchConfig(32, 1)
    assert choose_batch(LIMITS, 1, 1, None, fixed_batch_size=63) == BatchConfig(32, 1)
    assert choose_batch(LIMITS, 1, 1, None, fixed_batch_size=64, split_single=False) == BatchConfig(64, 0)
    assert choose_batch(LIMITS, 1, 2, None, fixed_batch_size=128) == BatchConfig(64, 0)
    assert choose_batch(LIMITS, 1, 1, None, fixed_batch_size=768) == BatchConfig(256, 2)


def test_a_fixed_batch_is_split_to_the_limits_and_never_beyond_the_largest():
    assert choose_batch(LIMITS, 1, 2, None, fixed_batch_size=1000, split_single=False) == BatchConfig(250, 1)
    assert choose_batch(LIMITS, 1, 4, None, fixed_batch_size=4096).total_batch(4) <= LIMITS.max_batch_size
    few = BatchLimits(32, 4096, 4, 64, max_accum_steps=3)
    # a user's fixed batch takes the accumulation steps it needs
    assert choose_batch(few, 1, 1, None, fixed_batch_size=1024) == BatchConfig(64, 15)


def test_batch_stays_at_m0_until_statistics_are_trusted():
    agent = JobAgent(LIMITS)
    agent.add_measurement(ConfigKey(1, 1, 32, 0), 0.05, 0.0)
    agent.add_measurement(ConfigKey(1, 2, 32, 0), 0.06, 0.01)
    agent.update_stats((1.0, 100.0), MIN_STATS_STEPS - 1)
    assert agent.model() is not None and agent.batch_model() is None
    assert choose_batch(LIMITS, 1, 2, agent.batch_model()).total_batch(2) == 32
    agent.update_stats((1.0, 100.0), MIN_STATS_STEPS)
    assert agent.batch_model() is agent.model()
    assert choose_batch(LIMITS, 1, 2, agent.batch_model()).total_batch(2) > 32  # noise scale 3200: a larger batch pays


def test_low_noise_keeps_a_small_batch_and_fixed_mode_keeps_the_users_batch():
    assert choose_batch(LIMITS, 1, 2, _model(0.01)).total_batch(2) <= 64
    fixed = choose_batch(LIMITS, 1, 3, _model(0.01), fixed_batch_size=600)
    assert fixed.total_batch(3) == 600 and fixed.local_bsz <= LIMITS.max_local_bsz


def test_current_configuration_is_kept_on_a_near_tie():
    model = _model(100.0)
    best = choose_batch(LIMITS, 1, 2, model)
    near = BatchConfig(best.local_bsz - 1, best.accum_steps)
    assert choose_batch(LIMITS, 1, 2, model, current=near) == near
    assert choose_batch(LIMITS, 1, 2, model, current=BatchConfig(16, 0)) == best


def test_infeasible_allocation_is_rejected_with_its_numbers():
    tight = BatchLimits(init_batch_size=32, max_batch_size=64, min_local_bsz=16)
    with pytest.raises(InvalidProblem, match=r"num_replicas=5 admits no batch configuration under the job's "
                                             r"batch limits \(BatchLimits\(init_batch_size=32"):
        choose_batch(tight, 1, 5, None)


# ------------------------------------------------------------------- checkpoints
@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def _save(directory: Path, step: int, value: float):
    import torch

    payload = {"w": torch.full((4,), value), "runtime": {"step": step}}
    return save_checkpoint(directory, step, payload, {"progress": float(step)})


def test_checkpoints_are_atomic_and_verified(tmp_path, torch):
    info = _save(tmp_path, 5, 1.5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000000005.json", "ckpt-0000000005.pt"]
    assert load_payload(info)["w"].tolist() == [1.5] * 4
    assert info.meta["step"] == 5 and len(info.meta["sha256"]) == 64
    atomic_write_json(tmp_path / "x.json", {"a": 1})
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_corrupt_or_partial_checkpoints_fall_back_to_the_previous_good_one(tmp_path, torch):
    for step in (10, 20, 30, 40):
        _save(tmp_path, step, float(step))
    (tmp_path / "ckpt-0000000040.json").write_text('{"step": 40, "sha2')  # torn metadata
    (tmp_path / "ckpt-0000000030.pt").write_bytes(b"PK\x03\x04 truncated")  # torn payload
    (tmp_path / "ckpt-0000000050.pt").write_bytes(b"payload written, metadata never")
    seen = []
    info = latest_good(tmp_path, on_corrupt=lambda c: seen.append(c.step))
    assert info.step == 20 and seen == [30]
    assert load_payload(info)["w"][0].item() == 20.0
    assert (tmp_path / "ckpt-0000000030.pt.corrupt").exists()
    with pytest.raises(ValueError, match="does not match its recorded SHA-256"):
        bad = list_checkpoints(tmp_path)[0]
        bad.path.write_bytes(b"changed")
        load_payload(bad)


def test_prune_keeps_the_newest_and_final_checkpoints(tmp_path, torch):
    for step in (1, 2, 3, 4, 5):
        info = _save(tmp_path, step, 0.0)
    final = save_checkpoint(tmp_path, 6, {"w": torch.zeros(1)}, {"final": True})
    _save(tmp_path, 7, 0.0)
    _save(tmp_path, 8, 0.0)
    _save(tmp_path, 9, 0.0)
    prune(tmp_path, keep=2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [9, 8, 6]
    assert final.path.exists() and not info.path.exists()


# ------------------------------------------------------------ specs and options
def test_job_spec_round_trips_through_json():
    spec = get_job("digits-cnn")
    assert JobSpec.from_json(spec.to_json()) == spec
    assert spec.limits().max_local_bsz == 256
    assert spec.reached(0.99) and not spec.reached(0.5) and not spec.reached(float("nan"))
    loss_spec = get_job("stdlib-charlm")
    assert loss_spec.reached(1.0) and not loss_spec.reached(3.0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "bad name"}, "name must be letters"),
        ({"builder": "no_colon"}, "builder must be an import path 'package.module:function', got 'no_colon'"),
        ({"builder": lambda ctx: None}, "builder must be a top-level function"),
        ({"init_batch_size": 0}, "init_batch_size must be an integer >= 1, got 0"),
        ({"max_batch_size": 8}, r"max_batch_size must be >= init_batch_size \(32\), got 8"),
        ({"lr_scaling": "cubic"}, "lr_scaling must be one of"),
        ({"target": float("inf")}, "target must be a finite number or None, got inf"),
        ({"target": "0.9"}, "target must be a finite number or None, got '0.9'"),
        ({"eval_every": 0}, "eval_every must be a finite number > 0, got 0"),
        ({"higher_is_better": 1}, "higher_is_better must be true or false, got 1"),
        ({"metric": ""}, "metric must be a non-empty string, got ''"),
        ({"seed": -1}, "seed must be an integer >= 0, got -1"),
        ({"config": {"x": object()}}, "config must be JSON-serialisable"),
    ],
)
def test_job_spec_rejects_bad_fields(changes, message):
    with pytest.raises(InvalidProblem, match=message):
        get_job("digits-cnn").replace(**changes)


def test_registry():
    assert {"digits-cnn", "synth-classify", "stdlib-charlm", "ratings-mf"} <= set(job_names())
    with pytest.raises(InvalidProblem, match="unknown job 'nope'; registered jobs"):
        get_job("nope")
    clash = get_job("digits-cnn").replace(target=0.5)
    with pytest.raises(InvalidProblem, match="a job named 'digits-cnn' is already registered"):
        register_job(clash)
    missing = get_job("digits-cnn").replace(name="ghost", builder="no_such_module_xyz:build")
    with pytest.raises(InvalidProblem, match="builder 'no_such_module_xyz:build' of job 'ghost' cannot be imported"):
        register_job(missing)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, None), "num_replicas must be an integer >= 1, got 0"),
        ((2, 3), r"num_nodes must be <= num_replicas \(2\), got 3"),
        (({"a": -1}, None), r"placement\['a'\] must be an integer >= 0, got -1"),
        (({"a": 0}, None), "placement must give at least one replica"),
        (({"a": 1, "b": 2}, 1), r"num_nodes \(1\) disagrees with the placement"),
    ],
)
def test_placement_errors(args, message):
    with pytest.raises(InvalidProblem, match=message):
        normalize_placement(*args)


def test_placement_spreads_replicas_over_nodes():
    assert normalize_placement(5, 2) == {"0": 3, "1": 2}
    assert normalize_placement({"n1": 2, "n2": 0}) == {"n1": 2}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("fixed_batch_size", 0, "fixed_batch_size must be an integer >= 1 or None, got 0"),
        ("step_limit", True, "step_limit must be an integer >= 1 or None, got True"),
        ("checkpoint_interval_s", -1.0, "checkpoint_interval_s must be a finite number > 0, got -1.0"),
        ("keep_checkpoints", 1, "keep_checkpoints must be an integer >= 2, got 1"),
        ("max_restarts", -1, "max_restarts must be an integer >= 0, got -1"),
    ],
)
def test_runtime_options_errors(field, value, message):
    with pytest.raises(InvalidProblem, match=message):
        RuntimeOptions(**{field: value})


# --------------------------------------------------------- measurements and report
def _profile(rows):
    return {f"1,{k},{m},{s}": {"count": 10, "step": 10 * t, "sync": 10 * y, "compute": 10 * (t - y)}
            for k, m, s, t, y in rows}


def test_measurements_fit_and_heldout_error_on_exact_model_data():
    truth = ThroughputParams(alpha_c=0.002, beta_c=3e-5, alpha_n=0.004, beta_n=0.0, alpha_r=0.004, beta_r=0.0,
                             gamma=1.0)
    from pollux_opt.model import step_time, sync_time

    configs = [(1, 16, 0), (1, 64, 0), (1, 256, 0), (2, 32, 0), (2, 128, 0), (1, 64, 1), (2, 64, 0)]
    rows = [(k, m, s, float(step_time(truth, 1, k, m, s)), float(sync_time(truth, 1, k))) for k, m, s in configs]
    meas = Measurements.from_profile(_profile(rows))
    assert len(meas) == 7 and np.isnan(meas.sync_time[meas.num_replicas == 1]).all()
    train = np.array([True, False, True, True, True, False, False])
    _, predicted, mape = heldout_error(meas, train)
    assert mape < 1.0
    with pytest.raises(InvalidProblem, match="train must be a bool mask of length 7"):
        heldout_error(meas, np.ones(7, dtype=bool))


def test_report_goodput_model_needs_measurements_and_statistics():
    meas = Measurements.from_profile({})
    base = dict(
        job_id="j", kind="k", state=JobState.QUEUED, step=0, progress=0.0, samples=0, epoch=0.0,
        metric_name="m", target=1.0, higher_is_better=True, metric=None, final_metric=None, placement={},
        num_replicas=0, num_nodes=0, local_bsz=0, accum_steps=0, batch_size=0, fixed_batch_size=None,
        measurements=meas, throughput_params=None, grad_stats=None, limits=LIMITS, restart_delay=None,
        rescale_times=(), start_times=(), num_restarts=0, age=0.0, worker_pids=(), error=None, events=(),
    )
    assert JobReport(**base).goodput_model() is None
    assert JobReport(**dict(base, throughput_params=PARAMS)).goodput_model() is None
    fixed = JobReport(**dict(base, throughput_params=PARAMS, fixed_batch_size=64)).goodput_model()
    from pollux_opt.model import step_time

    # Fixed batch: the speedup is the step-time ratio of the same 64 samples on 1 and 2 replicas.
    expected = step_time(PARAMS, 1, 1, 64) / step_time(PARAMS, 1, 2, 32)
    assert fixed.speedup(1, 2, fixed_batch_size=64) == pytest.approx(expected)
    stats = GradientStats(grad_sqr=1.0, grad_var=50.0, init_batch_size=32)
    model = JobReport(**dict(base, throughput_params=PARAMS, grad_stats=stats)).goodput_model()
    assert model.speedup(1, 2) > 1.0


# ------------------------------------------------------------------- lazy torch
def test_package_imports_without_torch_and_says_how_to_install_it(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import pollux_opt, pollux_opt.runtime
        from pollux_opt.runtime import ElasticJob, get_job
        job = ElasticJob(get_job("digits-cnn"), sys.argv[1])
        try:
            job.start(1)
        except ImportError as exc:
            print("IMPORT-ERROR:", exc)
        print("torch imported:", "torch" in sys.modules and sys.modules["torch"] is not None)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "job")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'pollux-opt[jobs]'" in out.stdout
    assert "torch imported: False" in out.stdout


# ------------------------------------------------------------ handle and pool errors
def test_elastic_job_rejects_bad_arguments_before_starting_anything(tmp_path):
    from pollux_opt.runtime import ElasticJob, RuntimeOptions, WorkerPool

    with pytest.raises(InvalidProblem, match="spec must be a JobSpec or a registered job name, got 3"):
        ElasticJob(3, tmp_path / "a")
    with pytest.raises(InvalidProblem, match="unknown job 'nope'"):
        ElasticJob("nope", tmp_path / "a")
    with pytest.raises(InvalidProblem, match="options must be a RuntimeOptions"):
        ElasticJob("digits-cnn", tmp_path / "a", options={"step_limit": 3})
    with pytest.raises(InvalidProblem, match="pool must be a WorkerPool or None"):
        ElasticJob("digits-cnn", tmp_path / "a", pool="shared")
    job = ElasticJob("digits-cnn", tmp_path / "a")
    with pytest.raises(InvalidProblem, match=r"cpus must list one CPU id >= 0 per replica \(2\), got \(0,\)"):
        job.start(2, cpus=[0])
    with pytest.raises(InvalidProblem, match=r"local_bsz must be an integer in \[1, 256\], got 1000"):
        job.start(1, local_bsz=1000)
    with pytest.raises(InvalidProblem, match=r"accum_steps must be an integer in \[0, 15\], got 99"):
        job.start(1, local_bsz=8, accum_steps=99)
    with pytest.raises(InvalidProblem, match="num_replicas=600 admits no batch configuration"):
        job.start(600)
    assert job.poll() is JobState.QUEUED  # nothing was started
    job.close()
    with pytest.raises(InvalidProblem, match="job 'a' is closed"):
        job.start(1)
    with pytest.raises(InvalidProblem, match="holds job 'a' with a different spec"):
        ElasticJob(get_job("digits-cnn").replace(target=0.5), tmp_path / "a")
    with pytest.raises(InvalidProblem, match="holds job 'a' with options"):
        ElasticJob("digits-cnn", tmp_path / "a", options=RuntimeOptions(step_limit=5))
    with pytest.raises(InvalidProblem, match="job_id 'b' differs from 'a' stored in the workdir"):
        ElasticJob("digits-cnn", tmp_path / "a", job_id="b")
    with pytest.raises(InvalidProblem, match="holds no job"):
        ElasticJob.from_workdir(tmp_path / "empty")
    reopened = ElasticJob.from_workdir(tmp_path / "a")
    assert reopened.spec == get_job("digits-cnn") and reopened.poll() is JobState.QUEUED
    reopened.close()
    with pytest.raises(InvalidProblem, match="spares must be an integer >= 0, got -1"):
        WorkerPool(spares=-1)
    with pytest.raises(InvalidProblem, match=r"max_idle must be >= spares \(2\), got 1"):
        WorkerPool(spares=2, max_idle=1)
    with pytest.raises(InvalidProblem, match=r"max_idle must be an integer >= 0, got True"):
        WorkerPool(max_idle=True)
    with pytest.raises(InvalidProblem, match="start_method must be one of"):
        WorkerPool(start_method="fork")


def test_job_parts_are_checked_with_the_builder_named(torch):
    from pollux_opt.runtime import JobParts

    model = torch.nn.Linear(2, 1)
    good = dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_size=4,
                get_batch=lambda i: i, loss=lambda m, b: b, evaluate=lambda m: 0.0)
    JobParts(**good).check("pkg:build")
    for field, value, message in [
        ("model", "net", "builder 'pkg:build': model must be a torch.nn.Module"),
        ("optimizer", None, "builder 'pkg:build': optimizer must be a torch.optim.Optimizer"),
        ("train_size", 0, "builder 'pkg:build': train_size must be an integer >= 1, got 0"),
        ("max_grad_norm", 0.0, r"builder 'pkg:build': max_grad_norm must be a number > 0 or None, got 0\.0"),
        ("loss", 3, "builder 'pkg:build': loss must be callable, got 3"),
    ]:
        with pytest.raises(InvalidProblem, match=message):
            JobParts(**dict(good, **{field: value})).check("pkg:build")


# ------------------------------------------------ supervisor state machine (no processes)
class _FakeWorker:
    def __init__(self, pid: int) -> None:
        self.sent: list[tuple] = []
        self.pid = pid

    def alive(self) -> bool:
        return True

    def send(self, *message) -> bool:
        self.sent.append(message)
        return True


class _FakePool:
    def __init__(self) -> None:
        self.released: list = []

    def release(self, workers) -> None:
        self.released.extend(workers)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("request_kind", ["rescale", "stop"])
def test_target_pause_racing_a_scheduler_request_still_completes(tmp_path, request_kind):
    """Rank 1 reports 'paused (target)', then a scheduler request (rescale or
    stop) arrives before rank 0's report.  The ranks never report again, so
    the request must keep rank 1's report: the target pause then completes."""
    from pollux_opt.runtime import ElasticJob
    from pollux_opt.runtime.allocation import WorkerAllocation
    from pollux_opt.runtime.generation import Generation

    job = ElasticJob("digits-cnn", tmp_path / "job")
    ctl = job._ctl
    verifications = []
    ctl.pool = _FakePool()
    ctl._start_verification = lambda: verifications.append(ctl.status.step)
    workers = [_FakeWorker(100), _FakeWorker(101)]
    ctl._gen = Generation(1, workers)
    ctl.status.alloc = WorkerAllocation({"n0": 2})
    ctl.status.enter(JobState.RESCALING, "launching: start")
    ctl.status.enter(JobState.RUNNING, "workers resumed: start")

    def paused(rank: int) -> dict:
        return {"generation": 1, "rank": rank, "step": 554, "reason": "target", "checksum": "c",
                "progress": 60.0, "samples": 9000, "metric": 0.9}

    ctl._on_message(1, "paused", paused(1))
    if request_kind == "rescale":
        ctl.request_alloc(WorkerAllocation({"n0": 1}), 0.0)
    else:
        ctl.request_stop(cancel=False)
    assert workers[0].sent == [("stop",)]  # the request reached rank 0, which ignores it once paused
    ctl._on_message(0, "paused", paused(0))
    assert [e.kind for e in ctl.status.events][-1] == "target_reached"
    assert verifications == [554] and not ctl._gen.workers and ctl.pool.released == workers
    job.close()


def test_a_cancelled_running_job_checkpoints_then_ends_cancelled_ignoring_later_allocations(tmp_path):
    """cancel() takes the stop path (the workers finish their step, checkpoint
    and leave) and then ends the job: a rescale asked for meanwhile is ignored."""
    from pollux_opt.runtime import ElasticJob
    from pollux_opt.runtime.allocation import WorkerAllocation
    from pollux_opt.runtime.generation import Generation

    job = ElasticJob("digits-cnn", tmp_path / "job")
    ctl = job._ctl
    ctl.pool = _FakePool()
    workers = [_FakeWorker(100), _FakeWorker(101)]
    ctl._gen = Generation(1, workers)
    ctl.status.alloc = WorkerAllocation({"n0": 2})
    ctl.status.enter(JobState.RESCALING, "launching: start")
    ctl.status.enter(JobState.RUNNING, "workers resumed: start")
    ctl.request_stop(cancel=True)
    assert job.poll() is JobState.RESCALING and workers[0].sent == [("stop",)]
    ctl.request_alloc(WorkerAllocation({"n0": 1}), 0.0)
    for rank in (0, 1):
        ctl._on_message(rank, "paused", {"generation": 1, "rank": rank, "step": 30, "reason": "request",
                                         "checksum": "c", "progress": 3.0, "samples": 960, "metric": None})
    stopped = ctl.status.events[-1]
    assert stopped.kind == "stopped" and stopped.details == {"reason": "request", "step": 30, "checksum": "c",
                                                             "cancel": True}
    assert job.poll() is JobState.CANCELLED and ctl.pool.released == workers and not job.report().placement
    assert [t.new for t in ctl.status.lifecycle.history] == [
        JobState.RESCALING, JobState.RUNNING, JobState.RESCALING, JobState.CANCELLED]
    job.close()


@pytest.mark.parametrize("resume", [True, False])
def test_failed_verification_resumes_alone_or_waits_for_the_scheduler(tmp_path, resume):
    """A job driven on its own trains on from its final checkpoint on its last
    allocation; a scheduler-driven one (the real backend sets
    ``resume_after_failed_verification=False``) stops holding nothing, since its
    CPUs were handed back when it reached the target, and a scheduler request
    made while it was verifying is served instead."""
    from pollux_opt.runtime import ElasticJob
    from pollux_opt.runtime.allocation import WorkerAllocation

    with pytest.raises(InvalidProblem, match="resume_after_failed_verification must be true or false, got 1"):
        RuntimeOptions(resume_after_failed_verification=1)
    job = ElasticJob("digits-cnn", tmp_path / "job", options=RuntimeOptions(resume_after_failed_verification=resume))
    ctl = job._ctl
    launched = []
    ctl._launch = lambda alloc, kind, t0: launched.append((alloc.placement, kind))
    ctl.status.alloc = WorkerAllocation({"n0": 2})
    ctl.status.enter(JobState.RUNNING, "target reached", verifying=True)
    ctl._after_failed_verification()
    if resume:
        assert launched == [({"n0": 2}, "restart")]
    else:
        assert launched == [] and job.report().state is JobState.QUEUED
        assert ctl.status.events[-1].kind == "stopped" and ctl.status.events[-1].details["reason"] == "verification_failed"
    if not resume:
        ctl.status.enter(JobState.RUNNING, "target reached", verifying=True)
    ctl._verification.failures = 0
    ctl.request_alloc(WorkerAllocation({"n1": 1}), 0.0)  # the scheduler moved it meanwhile
    ctl._after_failed_verification()
    assert launched[-1] == ({"n1": 1}, "restart")
    job.close()


def test_profiling_visits_each_configuration_in_turn_leaving_replicas_unpinned(monkeypatch):
    """profile_throughput starts the first configuration, rescales to each next
    one, and leaves the replicas' CPUs to the OS."""
    import functools
    import types

    from pollux_opt.runtime import profiling as _profiling

    calls = []

    class FakeJob:
        def __init__(self, *args, **kwargs):
            self.rows = {}

        def _run(self, how, k, local_bsz, accum_steps, cpus=None, gpus=None):
            calls.append((how, k, cpus, gpus))
            self.rows[f"1,{k},{local_bsz},{accum_steps}"] = {"count": 99, "step": 99.0, "sync": 0.0, "compute": 99.0}

        start = functools.partialmethod(_run, "start")
        rescale = functools.partialmethod(_run, "rescale")

        def report(self):
            return types.SimpleNamespace(state=JobState.RUNNING, measurements=Measurements.from_profile(self.rows))

        def wait(self, timeout=None, until=None):
            return self.report()

        def stop(self):
            pass

        close = stop

    monkeypatch.setattr(_profiling, "ElasticJob", FakeJob)
    rows = _profiling.profile_throughput(get_job("digits-cnn"), [(1, 32, 0), (2, 32, 0)], steps=1)
    assert calls == [("start", 1, None, None), ("rescale", 2, None, None)]
    assert list(rows.num_replicas) == [1, 2]
    calls.clear()  # on GPUs: replica i on the i-th GPU given
    _profiling.profile_throughput(get_job("digits-cnn"), [(1, 32, 0), (2, 32, 0)], steps=1, gpus=[3, 5])
    assert calls == [("start", 1, None, [3]), ("rescale", 2, None, [3, 5])]
    with pytest.raises(InvalidProblem, match=r"gpus must list a GPU for each replica of the largest configuration \(2\)"):
        _profiling.profile_throughput(get_job("digits-cnn"), [(2, 32, 0)], steps=1, gpus=[0])


# ----------------------------------------------------------- divergence rule
def test_the_divergence_rule_fails_after_k_consecutive_reports_above_the_multiple():
    from pollux_opt.runtime.divergence import JobDiverged, check_divergence
    from pollux_opt.runtime.state import TrainingState

    state = TrainingState()
    check_divergence(state, [2.0, 2.0, float("nan")], 1e3, 3)  # the first report sets the reference
    assert state.loss_ref == 2.0
    check_divergence(state, [3e3], 1e3, 3)
    check_divergence(state, [3e3], 1e3, 3)
    check_divergence(state, [1.0], 1e3, 3)  # back below the bound: the count starts again
    assert state.diverging_reports == 0
    check_divergence(state, [8.8e18], 1e3, 3)
    check_divergence(state, [8.8e18], 1e3, 3)
    state.step = 912
    with pytest.raises(JobDiverged, match=r"training loss 8.8e\+18 at step 912 exceeds 1000 x its initial 2 "
                                          r"for 3 consecutive reports"):
        check_divergence(state, [8.8e18], 1e3, 3)


def test_the_divergence_rule_is_off_without_a_factor_or_a_positive_reference():
    from pollux_opt.runtime.divergence import check_divergence
    from pollux_opt.runtime.state import TrainingState

    for factor, first in ((None, 1.0), (1e3, -0.5)):
        state = TrainingState()
        check_divergence(state, [first], factor, 1)
        for _ in range(5):
            check_divergence(state, [1e30], factor, 1)
        assert state.diverging_reports == 0


def test_a_job_spec_needs_a_completion_criterion_and_counts_epochs_and_progress():
    base = dict(name="x", builder="pollux_opt.runtime.builtin_jobs:build_digits_cnn", init_batch_size=8,
                max_batch_size=64)
    with pytest.raises(InvalidProblem, match="job 'x' needs a completion criterion: set target, epochs or "
                                             "progress_target"):
        JobSpec(**base)
    spec = JobSpec(**base, epochs=3, progress_target=100.0)
    assert not spec.counts_reached(150.0, 2.0) and not spec.counts_reached(50.0, 3.0)
    assert spec.counts_reached(100.0, 3.0) and not spec.reached(1.0)  # no metric target: never by metric
    with pytest.raises(InvalidProblem, match="import_dir must be an absolute directory path, got 'rel'"):
        JobSpec(**base, epochs=1, import_dir="rel")
