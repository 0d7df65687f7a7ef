"""Real replicas on a GPU: a job that moves between a GPU and CPU cores (and
over both at once) loses and repeats no step; two GPU replicas reduce with
NCCL; a built-in job reaches its target on a GPU and is verified.  Each test
needs a CUDA GPU and skips, saying so, where torch sees none."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pollux_opt.runtime import (  # noqa: E402
    BuildContext,
    ElasticJob,
    JobParts,
    JobSpec,
    JobState,
    RuntimeOptions,
    WorkerPool,
    get_job,
)
from pollux_opt.runtime.device import machine_gpus  # noqa: E402

GPUS = machine_gpus()
needs_a_gpu = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU: torch sees none on this machine")
needs_two_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs two CUDA GPUs: torch sees {GPUS} on this machine")
#: Limit for any one wait, seconds (only hit when something is broken).
WAIT_S = 120.0


def build_regression(ctx: BuildContext) -> JobParts:
    """Linear-teacher regression with a small MLP (CPU tensors: the runtime moves the batches)."""
    gen = torch.Generator().manual_seed(7)
    n, d = 4096, 16
    x = torch.randn(n, d, generator=gen)
    y = x @ torch.randn(d, generator=gen) + 0.1 * torch.randn(n, generator=gen)
    model = torch.nn.Sequential(torch.nn.Linear(d, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))

    def evaluate(m):
        device = next(m.parameters()).device
        return float(torch.nn.functional.mse_loss(m(x[:256].to(device)).squeeze(1), y[:256].to(device)))

    return JobParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                    train_size=n, get_batch=lambda idx: (x[idx], y[idx]),
                    loss=lambda m, b: torch.nn.functional.mse_loss(m(b[0]).squeeze(1), b[1]), evaluate=evaluate)


SPEC = JobSpec(name="gpu-regression", builder=build_regression, init_batch_size=32, max_batch_size=512,
               max_local_bsz=256, target=-1.0, metric="mse", higher_is_better=False, lr_scaling="adascale",
               eval_every=1000.0)


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(spares=1, max_idle=3) as p:
        yield p


def _assert_moves_lost_no_step(report, limit: int) -> None:
    assert report.state is JobState.QUEUED and report.step == limit
    for event in report.events_of("rescaled"):
        assert event.details["from_checkpoint"] == event.details["step"] == event.details["paused_step"]
        assert event.details["checksum"] == event.details["paused_checksum"]


@needs_a_gpu
def test_a_job_moves_between_a_gpu_and_cpu_cores_and_loses_no_step(tmp_path, pool):
    with ElasticJob(SPEC, tmp_path / "job", options=RuntimeOptions(fixed_batch_size=64, step_limit=160),
                    pool=pool) as job:
        job.start(1, gpus=[0])
        job.wait(timeout=WAIT_S, until=lambda r: r.state is JobState.RUNNING and r.step >= 40)
        job.rescale(1)  # to a CPU core
        job.wait(timeout=WAIT_S, until=lambda r: r.state is JobState.RUNNING and r.step >= 80)
        job.rescale({"gpu": 1, "cpu": 1}, gpus=[0, None])  # over both: gloo through host memory
        job.wait(timeout=WAIT_S, until=lambda r: r.num_replicas == 2 and r.state is JobState.RUNNING
                 and r.step >= 120)
        job.rescale(1, gpus=[0])
        report = job.wait(timeout=WAIT_S)
    _assert_moves_lost_no_step(report, 160)
    assert len(report.events_of("rescaled")) == 3


@needs_two_gpus
def test_two_gpu_replicas_reduce_with_nccl(tmp_path, pool):
    with ElasticJob(SPEC, tmp_path / "job", options=RuntimeOptions(fixed_batch_size=64, step_limit=100),
                    pool=pool) as job:
        job.start(1, gpus=[0])
        job.wait(timeout=WAIT_S, until=lambda r: r.state is JobState.RUNNING and r.step >= 30)
        job.rescale(2, gpus=[0, 1])
        report = job.wait(timeout=WAIT_S)
    _assert_moves_lost_no_step(report, 100)


@needs_a_gpu
def test_a_builtin_job_reaches_its_target_on_a_gpu_and_is_verified(tmp_path, pool):
    spec = get_job("digits-cnn")
    with ElasticJob(spec, tmp_path / "job", pool=pool) as job:
        job.start(1, gpus=[0])
        report = job.wait(timeout=10 * WAIT_S)
    assert report.state is JobState.SUCCEEDED, report.error
    assert report.final_metric is not None and report.final_metric >= spec.target
    assert [e.kind for e in report.events][-2:] == ["target_reached", "verified"]


@needs_a_gpu
def test_mixed_precision_on_a_gpu_skips_overflowing_steps_and_completes(tmp_path, pool):
    from pathlib import Path

    from pollux_opt.runtime.entry import entry_spec

    loops = Path(__file__).parent / "user_loops"
    spec = entry_spec("loop_jobs.py:main", loops, name="amp-gpu", where="test", fields={
        "init_batch_size": 16, "max_batch_size": 128, "epochs": 2, "lr_scaling": "linear", "eval_every": 1e9,
        "metric": "mse", "higher_is_better": False,
        "config": {"samples": 256, "amp": {"init_scale": 2.0 ** 24}}})
    with ElasticJob(spec, tmp_path / "job", pool=pool, options=RuntimeOptions(fixed_batch_size=16)) as job:
        job.start(1, gpus=[0])
        report = job.wait(timeout=WAIT_S)
    assert report.state is JobState.SUCCEEDED, report.error
