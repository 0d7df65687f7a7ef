"""A user's own training loop as an elastic job (:mod:`pollux_opt.elastic`).

The loops are in ``user_loops/loop_jobs.py``, named by entry as a workload
would.  Most tests run one assignment at a time in this process (the worker's
own :func:`~pollux_opt.runtime.worker.serve_assignment` on one replica), so
they take about a second each; the rescale and failure tests use real worker
processes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pollux_opt import InvalidProblem  # noqa: E402
from pollux_opt.runtime import ElasticJob, JobState, RuntimeOptions, WorkerPool  # noqa: E402
from pollux_opt.runtime.divergence import JobDiverged  # noqa: E402
from pollux_opt.runtime.entry import entry_spec  # noqa: E402
from pollux_opt.runtime.verify import verify_checkpoint  # noqa: E402
from pollux_opt.runtime.profiling import serve_in_process  # noqa: E402

LOOPS = Path(__file__).parent / "user_loops"
WAIT_S = 120.0


def _spec(**fields):
    fields = {"init_batch_size": 16, "max_batch_size": 128, "epochs": 2, "lr_scaling": "linear",
              "eval_every": 1e9, "metric": "mse", "higher_is_better": False, **fields}
    return entry_spec("loop_jobs.py:main", LOOPS, name="loop-test", fields=fields, where="test")


def _loop_module():
    import sys

    return sys.modules["loop_jobs"]


def _serve(workdir: Path, spec, *, generation=1, checkpoint=None, local_bsz=8, accum_steps=1, **options):
    """One assignment on one replica in this process; returns the worker's messages."""
    return serve_in_process(spec, workdir, local_bsz=local_bsz, accum_steps=accum_steps, generation=generation,
                            checkpoint=checkpoint, options=RuntimeOptions(**{"report_interval_s": 0.001, **options}))


def _rows(messages):
    return [row for kind, info in messages if kind == "metrics" for row in info["rows"]]


def _last(messages, kind):
    return [info for k, info in messages if k == kind][-1]


def test_the_lr_schedule_sets_the_base_rate_and_the_rule_scales_it(tmp_path):
    spec = _spec(config={"schedule": "batch", "samples": 256})
    _loop_module().APPLIED_LRS.clear()
    messages = _serve(tmp_path / "job", spec, local_bsz=8, accum_steps=1)
    assert _last(messages, "paused")["reason"] == "target"  # two epochs, then main() returned
    rows = _rows(messages)
    applied = [lrs[0] for lrs in _loop_module().APPLIED_LRS]
    assert len(applied) == len(rows) == 2 * 256 // 16  # one real step per 2 micro-batches of 8
    for t, (row, lr) in enumerate(zip(rows, applied)):
        factor = row[13]
        assert factor == pytest.approx(16 / 16)  # linear rule: batch 16 over M0 16
        # The schedule advanced once per applied step, not per micro-batch.
        assert lr == pytest.approx(0.05 * _loop_module().schedule(t) * factor)


def test_the_rule_scales_a_larger_batch_and_leaves_the_schedules_rate_alone(tmp_path):
    spec = _spec(config={"schedule": "epoch", "samples": 256})
    _loop_module().APPLIED_LRS.clear()
    messages = _serve(tmp_path / "job", spec, local_bsz=16, accum_steps=1)  # batch 32 = 2 x M0
    rows = _rows(messages)
    steps_per_epoch = 256 // 32
    applied = [lrs[0] for lrs in _loop_module().APPLIED_LRS]
    for t, (row, lr) in enumerate(zip(rows, applied)):
        assert row[13] == pytest.approx(2.0)
        assert lr == pytest.approx(0.05 * _loop_module().schedule(t // steps_per_epoch) * 2.0)
    payload = torch.load(sorted((tmp_path / "job" / "checkpoints").glob("*.pt"))[-1], weights_only=False)
    # The optimizer keeps the schedule's rate (after 2 epochs), not the scaled one.
    assert payload["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.05 * _loop_module().schedule(2))


def _trace(trace_dir: Path) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = {}
    for path in trace_dir.iterdir():
        for line in path.read_text().splitlines():
            epoch, *idx = (int(v) for v in line.split())
            seen.setdefault(epoch, []).extend(idx)
    return seen


def test_a_stopped_loop_resumes_mid_epoch_at_the_exact_sample_with_its_extra_state(tmp_path):
    trace = tmp_path / "trace"
    trace.mkdir()
    spec = _spec(epochs=3, config={"samples": 200, "trace_dir": str(trace)})
    first = _serve(tmp_path / "job", spec, local_bsz=8, accum_steps=1, step_limit=7)
    assert _last(first, "paused")["reason"] == "step_limit"
    ckpt = _last(first, "checkpoint")["meta_path"]
    saved = torch.load(Path(ckpt).with_suffix(".pt"), weights_only=False)
    assert saved["extra"]["user:counts"] == {"batches": 14, "epochs": 0}
    # Resume with another batch configuration (as after a rescale), to the end.
    second = _serve(tmp_path / "job", spec, generation=2, checkpoint=ckpt, local_bsz=12, accum_steps=0)
    done = _last(second, "paused")
    assert done["reason"] == "target" and done["step"] > 7
    final = torch.load(Path(_last(second, "checkpoint")["meta_path"]).with_suffix(".pt"), weights_only=False)
    assert final["extra"]["user:counts"]["epochs"] == 3  # restored, not restarted from zero
    assert final["runtime"]["epoch"] == 3
    seen = _trace(trace)
    assert sorted(seen) == [0, 1, 2]
    # One replica without accumulation: the short last step of an epoch takes
    # all that is left, so every epoch sees each sample exactly once.
    for epoch, idx in seen.items():
        assert sorted(idx) == list(range(200)), f"epoch {epoch}"


def test_completion_after_n_epochs_is_verified_in_a_fresh_evaluation(tmp_path):
    spec = _spec(epochs=2, config={"samples": 128})
    messages = _serve(tmp_path / "job", spec)
    ckpt = _last(messages, "checkpoint")
    assert ckpt["final"]
    (tmp_path / "job" / "job.json").write_text(json.dumps({"spec": spec.to_json()}))
    record = verify_checkpoint(tmp_path / "job", Path(ckpt["meta_path"]))
    assert record["reached"] and record["epochs"] == 2
    assert math.isfinite(record["metric"])


def test_a_loop_returning_before_its_metric_target_fails_naming_the_criterion(tmp_path):
    spec = _spec(epochs=None, target=-1.0, eval_every=4)  # an MSE below zero is never reached
    with pytest.raises(RuntimeError, match=r"returned at epoch 2, step \d+ before the job's completion "
                                           r"criteria \(mse <= -1\) held"):
        _serve(tmp_path / "job", spec.replace(config={"samples": 64, "epochs": 2}))


def test_a_diverging_loss_fails_the_job_with_the_rule_in_the_message(tmp_path):
    spec = _spec(epochs=50, config={"samples": 64, "epochs": 50, "diverge_at_batch": 20})
    with pytest.raises(JobDiverged, match=r"training loss 1e\+09 at step \d+ exceeds 1000 x its initial "
                                          r"[\d.e+-]+ for 3 consecutive reports"):
        _serve(tmp_path / "job", spec, divergence_reports=3)


def test_a_loaders_worker_processes_and_collate_serve_the_job(tmp_path):
    spec = _spec(epochs=1, config={"samples": 64, "num_workers": 1})
    messages = _serve(tmp_path / "job", spec)
    assert _last(messages, "paused")["reason"] == "target" and _last(messages, "paused")["step"] == 4


def test_the_example_scripts_train_under_the_runtime_from_their_workload_file(tmp_path):
    from pollux_opt.workloads.load import load_workload

    wl = load_workload(Path(__file__).parents[2] / "examples" / "user-jobs" / "workload.json", quick=True)
    for job in wl.jobs:
        messages = _serve(tmp_path / job.id, job.job_spec(), local_bsz=job.batch_size // 2, accum_steps=1,
                          step_limit=3)
        paused = _last(messages, "paused")
        assert paused["reason"] == "step_limit" and paused["step"] == 3, job.id
        assert all(math.isfinite(row[9]) for row in _rows(messages))  # model.backward(loss) reported it


# ------------------------------------------------------------ entry errors
def test_a_missing_module_function_or_field_each_has_its_own_message(tmp_path):
    fields = {"init_batch_size": 16, "max_batch_size": 64, "epochs": 1}
    with pytest.raises(InvalidProblem, match=r"test: entry 'nope.py:main': script '.*nope.py' does not exist"):
        entry_spec("nope.py:main", LOOPS, name="x", fields=fields, where="test")
    with pytest.raises(InvalidProblem, match=r"test: entry 'nope_module:main': module 'nope_module' not found in "):
        entry_spec("nope_module:main", LOOPS, name="x", fields=fields, where="test")
    with pytest.raises(InvalidProblem, match=r"test: entry 'loop_jobs.py:train': module 'loop_jobs' has no "
                                             r"function 'train'"):
        entry_spec("loop_jobs.py:train", LOOPS, name="x", fields=fields, where="test")
    with pytest.raises(InvalidProblem, match=r"test: a job with an entry needs spec field\(s\) \['max_batch_size'\]"):
        entry_spec("loop_jobs.py:main", LOOPS, name="x", fields={"init_batch_size": 16, "epochs": 1}, where="test")
    with pytest.raises(InvalidProblem, match=r"test: a job with an entry needs one of the spec fields "
                                             r"\['epochs', 'progress_target', 'target'\]"):
        entry_spec("loop_jobs.py:main", LOOPS, name="x", fields={"init_batch_size": 16, "max_batch_size": 64},
                   where="test")
    with pytest.raises(InvalidProblem, match=r"entry 'os.py:system' is refused: module 'os' is part of Python's"):
        (tmp_path / "os.py").write_text("def system():\n    pass\n")
        entry_spec("os.py:system", tmp_path, name="x", fields=fields, where="test")


def test_a_workload_files_entry_is_imported_from_its_directory_or_the_import_dir(tmp_path):
    from pollux_opt.workloads.load import load_workload

    job = {"id": "a", "kind": "loop-a", "entry": "loop_jobs.py:main", "arrival_s": 0, "replicas": 1,
           "batch_size": 16, "spec": {"init_batch_size": 16, "max_batch_size": 64, "epochs": 1}}
    (LOOPS / "workload.json").write_text(json.dumps({"name": "w", "jobs": [job]}))
    try:
        wl = load_workload(LOOPS / "workload.json")
        spec = wl.jobs[0].job_spec()
        assert spec.builder == "loop_jobs:main" and spec.import_dir == str(LOOPS.resolve())
    finally:
        (LOOPS / "workload.json").unlink()
    (tmp_path / "workload.json").write_text(json.dumps({"name": "w", "jobs": [job]}))
    with pytest.raises(InvalidProblem, match=r"workload job 'a': entry 'loop_jobs.py:main': script .* does not exist"):
        load_workload(tmp_path / "workload.json").jobs[0].job_spec()
    wl = load_workload(tmp_path / "workload.json", import_dir=LOOPS)
    assert wl.jobs[0].job_spec().import_dir == str(LOOPS.resolve())
    # A run's config.json keeps the absolute import directory.
    assert wl.to_json()["jobs"][0]["import_dir"] == str(LOOPS.resolve())


def test_the_cli_refuses_a_workload_naming_a_missing_function_with_exit_status_2(tmp_path, capsys):
    from pollux_opt.cli.main import EXIT_INVALID, main

    job = {"id": "a", "kind": "loop-a", "entry": "loop_jobs.py:train", "arrival_s": 0, "replicas": 1,
           "batch_size": 16, "spec": {"init_batch_size": 16, "max_batch_size": 64, "epochs": 1}}
    (tmp_path / "workload.json").write_text(json.dumps({"name": "w", "jobs": [job]}))
    status = main(["run", "--workload", str(tmp_path / "workload.json"), "--import", str(LOOPS),
                   "--policy", "pollux", "--out", str(tmp_path / "run")])
    assert status == EXIT_INVALID
    assert ("pollux-opt: error: workload job 'a': entry 'loop_jobs.py:train': module 'loop_jobs' has no "
            "function 'train'") in capsys.readouterr().err


# ------------------------------------------------------ with worker processes
@pytest.fixture(scope="module")
def pool():
    with WorkerPool(spares=2, max_idle=3) as p:
        p.warm()
        yield p


def test_a_raising_user_loop_fails_the_job_with_the_error_in_its_log(tmp_path, pool):
    spec = _spec(epochs=5, config={"samples": 256, "raise_at_batch": 10, "num_workers": 1})
    with ElasticJob(spec, tmp_path / "job", pool=pool) as job:
        job.start(1)
        report = job.wait(timeout=WAIT_S)
    assert report.state is JobState.FAILED
    assert "ValueError: deliberate failure in the user's loop at batch 10" in report.error
    log = (tmp_path / "job" / "logs" / "worker-rank0.log").read_text()
    assert "assignment failed" in log and "deliberate failure in the user's loop at batch 10" in log
    assert "the user's own print before failing at batch 10" in log  # its stdout goes to its rank's log
    failed = [json.loads(line) for line in (tmp_path / "job" / "events.jsonl").read_text().splitlines()][-1]
    assert failed["kind"] == "failed" and "loop_jobs.py" in failed["details"]["traceback"]


def test_rescale_1_2_1_of_a_user_loop_sees_each_sample_once_and_matches_an_uninterrupted_run(tmp_path, pool):
    trace = tmp_path / "trace"
    trace.mkdir()
    config = {"samples": 1024, "epochs": 100, "delay_s": 0.002}
    spec = _spec(epochs=100, config={**config, "trace_dir": str(trace)})
    options = RuntimeOptions(fixed_batch_size=64, step_limit=120)
    with ElasticJob(spec, tmp_path / "job", options=options, pool=pool) as job:
        job.start(1)
        job.wait(timeout=WAIT_S, until=lambda r: r.state is JobState.RUNNING and r.step >= 30)
        job.rescale(2)
        job.wait(timeout=WAIT_S, until=lambda r: r.num_replicas == 2 and r.state is JobState.RUNNING and r.step >= 70)
        job.rescale(1)
        report = job.wait(timeout=WAIT_S)
    assert report.state is JobState.QUEUED and report.step == 120, report.error
    rescales = report.events_of("rescaled")
    assert [e.details["num_replicas"] for e in rescales] == [2, 1]
    for event in rescales:
        assert event.details["from_checkpoint"] == event.details["step"] == event.details["paused_step"]
        assert event.details["checksum"] == event.details["paused_checksum"]
    steps = job.step_log()
    assert steps["step"].tolist() == list(range(1, 121))  # no step lost, none repeated
    seen = _trace(trace)
    assert sorted(seen) == list(range(120 * 64 // 1024 + 1))
    for epoch, idx in seen.items():
        assert len(idx) == len(set(idx)), f"epoch {epoch} saw a sample twice"
    assert all(sorted(seen[e]) == list(range(1024)) for e in range(120 * 64 // 1024))  # complete epochs
    # The same 120 steps without a rescale end with the same parameters.
    with ElasticJob(spec.replace(config=config), tmp_path / "straight", options=options,
                    pool=pool) as job:
        job.start(1)
        straight = job.wait(timeout=WAIT_S)
    final = [r.events_of("stopped")[-1].details["checksum"] for r in (report, straight)]
    assert final[0] == final[1]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["pollux", "fixed"])
def test_the_example_scripts_run_to_verified_completion_from_the_cli(tmp_path, policy):
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "pollux_opt", "run", "--workload", "examples/user-jobs/workload.json",
         "--policy", policy, "--out", str(out), "--quick", "--quiet"],
        cwd=root, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job in ("digits", "charlm"):
        state = json.loads((out / "jobs" / job / "state.json").read_text())
        assert state["state"] == "succeeded", (job, state["error"])
        record = json.loads((out / "jobs" / job / "verification.json").read_text())
        assert record["reached"]
    assert json.loads((out / "jobs" / "charlm" / "verification.json").read_text())["epochs"] == 1


# ------------------------------------------------------------ mixed precision
def _scaler_state(messages) -> dict:
    final = Path(_last(messages, "checkpoint")["meta_path"]).with_suffix(".pt")
    return torch.load(final, weights_only=False)["scaler"]


def test_an_overflowing_loss_scale_skips_steps_backs_off_and_then_trains(tmp_path):
    """A scale of 2**127 overflows the first steps' gradients: each such step is
    skipped (no progress, no update), the scale halves, and training goes on."""
    spec = _spec(epochs=2, config={"samples": 256, "amp": {"init_scale": 2.0 ** 127}})
    messages = _serve(tmp_path / "job", spec, local_bsz=8, accum_steps=1)
    assert _last(messages, "paused")["reason"] == "target"
    rows = _rows(messages)
    progress = [row[14] for row in rows]
    skipped = sum(1 for before, after in zip([0.0, *progress], progress) if after == before)
    assert 1 <= skipped < len(rows) // 2 and progress[-1] > 0
    scale = _scaler_state(messages)["scale"]
    assert scale == 2.0 ** (127 - skipped)  # halved once per skipped step, never grown (interval 2000)
    assert all(math.isfinite(row[9]) and row[9] < 1e3 for row in rows[skipped:])  # the unscaled loss reported


def test_the_usual_scaler_calls_update_the_scale_once_per_step_not_per_micro_batch(tmp_path):
    spec = _spec(epochs=2, config={"samples": 256, "amp": {"init_scale": 2.0 ** 8, "growth_interval": 4,
                                                           "usual": True}})
    messages = _serve(tmp_path / "job", spec, local_bsz=8, accum_steps=1)  # two micro-batches a step
    steps = len(_rows(messages))
    assert _last(messages, "paused")["reason"] == "target" and steps == 2 * 256 // 16
    assert _scaler_state(messages)["scale"] == 2.0 ** (8 + steps // 4)  # grown after every 4 finite steps


def test_two_replicas_skip_the_same_overflowing_steps(tmp_path, pool):
    spec = _spec(epochs=2, config={"samples": 256, "amp": {"init_scale": 2.0 ** 127}})
    with ElasticJob(spec, tmp_path / "job", pool=pool, options=RuntimeOptions(fixed_batch_size=16)) as job:
        job.start(2)
        report = job.wait(timeout=WAIT_S)
    assert report.state is JobState.SUCCEEDED, report.error  # the ranks' parameters agreed at every pause
