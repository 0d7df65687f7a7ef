"""``pollux-opt profile``: real-run measurements -> AdaptDL-format profiles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pollux_opt.backends.sim.export import EXPORT_EPOCHS, export_profiles
from pollux_opt.backends.sim.traces import load_profiles
from pollux_opt.workloads import read_adaptdl_csv
from pollux_opt.cli.main import main
from solvers import InvalidProblem

STEP_COLUMNS = [
    "generation", "step", "time", "num_replicas", "local_bsz", "accum_steps", "step_time",
    "compute_time", "sync_time", "loss", "grad_sqr_est", "grad_var_est", "gain", "lr_factor", "progress",
]

M0, MAX_BSZ = 32, 256
#: Gradient statistics of the synthetic job (grad_var at M0).
SQR, VAR = 2.0, 6.0
#: Per-micro-batch compute and sync seconds of the synthetic job, by replicas.
COMPUTE = {1: 0.010, 2: 0.012}
SYNC = {1: 0.0, 2: 0.004}


def _gain(batch: int) -> float:
    return (VAR + SQR) / (VAR / (batch / M0) + SQR)


def _write_job(run: Path, job_id: str, *, nodes_gen2: dict, steps_per_gen: int = 60, t0: float = 1000.0) -> float:
    """A job that runs generation 1 on one replica (m = M0/2, s = 1), generation 2
    on ``nodes_gen2`` (two replicas, m = 64, s = 0); returns its final progress."""
    d = run / "jobs" / job_id
    d.mkdir(parents=True)
    spec = {"name": "toy-app", "init_batch_size": M0, "max_batch_size": MAX_BSZ, "target": 0.9}
    (d / "job.json").write_text(json.dumps({"job_id": job_id, "options": {"warmup_steps": 2},
                                            "spec": json.dumps(spec)}))
    rows, progress, t, step = [], 0.0, t0, 0
    configs = [(1, 1, M0 // 2, 1), (2, 2, 64, 0)]  # (generation, K, m, s)
    for gen, k, m, s in configs:
        for _ in range(steps_per_gen):
            step += 1
            compute = COMPUTE[k] * (s + 1)
            total = compute + SYNC[k]
            t += total
            gain = _gain(k * m * (s + 1))
            progress += gain
            rows.append((gen, step, t, k, m, s, total, compute, SYNC[k], 1.0, SQR, VAR, gain, gain, progress))
    pd.DataFrame(rows, columns=STEP_COLUMNS).to_csv(d / "steps.csv", index=False)
    events = [
        {"time": t0, "kind": "started", "details": {"seconds": 0.3, "step": 0, "placement": {"n0": 1}}},
        {"time": t0 + 1, "kind": "rescaled",
         "details": {"seconds": 1.5, "step": steps_per_gen, "placement": nodes_gen2}},
        {"time": t, "kind": "target_reached", "details": {"step": step, "metric": 0.95}},
    ]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return progress


def _write_run(root: Path, name: str, nodes_gen2: dict) -> tuple[Path, float]:
    run = root / name
    run.mkdir(parents=True)
    final = _write_job(run, "a", nodes_gen2=nodes_gen2)
    (run / "config.json").write_text(json.dumps({"workload": {"jobs": [
        {"id": "a", "kind": "toy-app", "arrival_s": 0.0, "replicas": 1, "batch_size": 64},
    ]}}))
    (run / "events.jsonl").write_text(
        json.dumps({"t": 1.0, "job_id": "a", "type": "validation", "value": 0.5, "progress": 10.0}) + "\n"
        + json.dumps({"t": 2.0, "job_id": "a", "type": "validation", "value": 0.95, "progress": final}) + "\n"
        + json.dumps({"t": 4.5, "job_id": "a", "type": "complete", "verify_s": 2.5}) + "\n"
    )
    return run, final


def test_round_trip_through_the_simulator_reader(tmp_path):
    run1, final = _write_run(tmp_path / "runs", "one-node", {"n0": 2})
    run2, _ = _write_run(tmp_path / "runs", "two-nodes", {"n0": 1, "n1": 1})
    out = tmp_path / "profiles"
    result = export_profiles([run1, run2], out)
    assert set(result) == {"toy-app"}
    assert result["toy-app"].jobs == ("one-node/a", "two-nodes/a")
    assert result["toy-app"].restart_seconds == pytest.approx(1.5)
    assert result["toy-app"].verify_seconds == pytest.approx(2.5)  # from the run log's complete event

    profile = load_profiles(out)["toy-app"]
    assert profile.init_batch_size == M0 and profile.max_batch_size == MAX_BSZ
    assert profile.max_epochs == EXPORT_EPOCHS
    assert profile.progress_at(profile.max_epochs) == pytest.approx(final)
    # One replica, s = 1: a trace row is one micro-batch, and the simulator's
    # T + s (T - T_sync) gives back the measured optimizer step.
    step, sync = profile.step_sync((1,), M0 // 2)
    assert step == pytest.approx(COMPUTE[1]) and sync == pytest.approx(0.0)
    assert step + 1 * (step - sync) == pytest.approx(2 * COMPUTE[1])
    # Nodes come from the placement events: "2" (one node) and "11" (two nodes).
    for placement in ((2,), (1, 1)):
        step, sync = profile.step_sync(placement, 64)
        assert step == pytest.approx(COMPUTE[2] + SYNC[2]) and sync == pytest.approx(SYNC[2])
    scal = pd.read_csv(out / "toy-app" / "scalability.csv")
    assert sorted(scal.num_nodes.unique()) == [1, 2]
    # grad_var_est is already at M0: exported unchanged, and the AdaScale
    # iteration count at B follows from it.
    sqr, var = profile.grad_stats(128, 3)
    assert (sqr, var) == (pytest.approx(SQR), pytest.approx(VAR))
    assert profile.iterations(M0, 5) == pytest.approx(profile.progress_at(5))
    assert profile.iterations(128, 5) == pytest.approx(profile.progress_at(5) / _gain(128))
    jobs = read_adaptdl_csv(out / "workload-one-node.csv")
    assert [(j.id, j.kind, j.batch_size) for j in jobs] == [("a", "toy-app", 64)]


def test_warmup_steps_are_left_out(tmp_path):
    run, _ = _write_run(tmp_path, "r", {"n0": 2})
    steps = pd.read_csv(run / "jobs" / "a" / "steps.csv")
    steps.loc[[0, 1], "step_time"] = 5.0  # the first two steps of a generation: start-up cost
    steps.to_csv(run / "jobs" / "a" / "steps.csv", index=False)
    export_profiles([run], tmp_path / "p")
    placements = pd.read_csv(tmp_path / "p" / "toy-app" / "placements.csv", dtype={"placement": str})
    assert placements.step_time.max() < 1.0


def test_step_time_is_the_mean_of_warm_steps_slow_ones_included(tmp_path):
    """A job's training time is the sum of its steps: one warm step in ten
    slowed 4x by contention makes the configuration's exported step 30 %
    longer (the median would ignore it and the replay would finish early)."""
    run, _ = _write_run(tmp_path, "r", {"n0": 2})
    path = run / "jobs" / "a" / "steps.csv"
    steps = pd.read_csv(path)
    one = steps.index[(steps.num_replicas == 1) & (steps.index >= 2)]  # warm one-replica steps
    slow = one[::10]
    steps.loc[slow, "step_time"] = 4 * steps.loc[slow, "step_time"]
    steps.loc[slow, "compute_time"] = 4 * steps.loc[slow, "compute_time"]
    steps.to_csv(path, index=False)
    export_profiles([run], tmp_path / "p")
    step, _ = load_profiles(tmp_path / "p")["toy-app"].step_sync((1,), M0 // 2)
    expected = COMPUTE[1] * (1 + 3 * len(slow) / len(one))
    assert step == pytest.approx(expected, rel=1e-6)
    assert step > 1.25 * COMPUTE[1]


def test_demo_folder_expands_to_its_runs_and_cli(tmp_path, capsys):
    _write_run(tmp_path / "demo", "fixed", {"n0": 2})
    _write_run(tmp_path / "demo", "pollux", {"n0": 2})
    assert main(["profile", str(tmp_path / "demo"), "--out", str(tmp_path / "p")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["toy-app"]["jobs"] == ["fixed/a", "pollux/a"]
    assert (tmp_path / "p" / "export.json").is_file()
    assert sorted(p.name for p in (tmp_path / "p").glob("workload-*.csv")) == [
        "workload-fixed.csv", "workload-pollux.csv"]


def test_missing_run_dir(tmp_path):
    with pytest.raises(InvalidProblem, match=r"run dir '.*nope' does not exist"):
        export_profiles([tmp_path / "nope"], tmp_path / "out")


def test_run_dir_without_jobs(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidProblem, match=r"run dir '.*empty' holds no jobs/ folder"):
        export_profiles([tmp_path / "empty"], tmp_path / "out")


def test_run_dir_with_no_recorded_steps(tmp_path):
    job = tmp_path / "run" / "jobs" / "a"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"spec": {"name": "x", "init_batch_size": 1, "max_batch_size": 2}}))
    (job / "steps.csv").write_text(",".join(STEP_COLUMNS) + "\n")
    with pytest.raises(InvalidProblem, match=r"no job with recorded steps"):
        export_profiles([tmp_path / "run"], tmp_path / "out")


def test_no_run_dirs(tmp_path):
    with pytest.raises(InvalidProblem, match=r"run_dirs must name at least one run directory"):
        export_profiles([], tmp_path / "out")


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys):
    assert main(["profile", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["../victim", "/tmp/victim", "..", "a/../../victim"])
def test_spec_name_that_is_a_path_is_refused_before_anything_is_written(tmp_path, capsys, name):
    """A job.json whose spec.name is a path must not make the export write or
    delete files outside its output folder (here: ``victim/`` next to it)."""
    run, _ = _write_run(tmp_path, "r", {"n0": 2})
    job_json = run / "jobs" / "a" / "job.json"
    meta = json.loads(job_json.read_text())
    meta["spec"] = json.dumps({**json.loads(meta["spec"]), "name": name})
    job_json.write_text(json.dumps(meta))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "validation-1.csv").write_text("keep\n")
    with pytest.raises(InvalidProblem, match=r"spec\.name in '.*job\.json' must be letters, digits, .*got '"):
        export_profiles([run], tmp_path / "p")
    assert main(["profile", str(run), "--out", str(tmp_path / "p")]) == 2
    assert "spec.name" in capsys.readouterr().err
    assert [f.name for f in victim.iterdir()] == ["validation-1.csv"]
    assert (victim / "validation-1.csv").read_text() == "keep\n"
    assert not (tmp_path / "p").exists() or not any((tmp_path / "p").iterdir())


def test_app_filter_names_are_checked(tmp_path):
    run, _ = _write_run(tmp_path, "r", {"n0": 2})
    with pytest.raises(InvalidProblem, match=r"apps entry must be letters, digits, .*got '\.\./x'"):
        export_profiles([run], tmp_path / "p", apps=["../x"])


def test_grad_var_export_matches_the_simulated_gain(tmp_path):
    """The simulator's gain at the exported stats equals the runtime's recorded gain."""
    run, _ = _write_run(tmp_path, "r", {"n0": 2})
    export_profiles([run], tmp_path / "p")
    profile = load_profiles(tmp_path / "p")["toy-app"]
    steps = pd.read_csv(run / "jobs" / "a" / "steps.csv")
    batch = steps.num_replicas * steps.local_bsz * (steps.accum_steps + 1)
    sqr, var = profile.grad_stats(128, 0)
    sim_gain = (var + sqr) / (var / (batch / profile.init_batch_size) + sqr)
    np.testing.assert_allclose(sim_gain, steps.gain)


def test_single_node_profile_with_one_replica_count_extrapolates_without_error(tmp_path):
    """Profiles exported from one machine can have every row on one node and
    one replica count (a degenerate hull for 3-D interpolation): a placement
    never measured takes the nearest measured rows instead of raising."""
    run, _ = _write_run(tmp_path, "r", {"n0": 2})
    steps = pd.read_csv(run / "jobs" / "a" / "steps.csv")
    steps = steps[steps.generation == 1]
    steps.to_csv(run / "jobs" / "a" / "steps.csv", index=False)
    export_profiles([run], tmp_path / "p")
    profile = load_profiles(tmp_path / "p")["toy-app"]
    step, sync = profile.step_sync((1, 1), M0 // 2)  # two nodes: never measured
    assert step == pytest.approx(COMPUTE[1]) and sync == pytest.approx(0.0)


@pytest.mark.parametrize(
    "file, content, match",
    [
        ("jobs/a/job.json", b"{torn", r"malformed JSON in '.*job\.json': Expecting property name"),
        ("jobs/a/job.json", b"\xff\xfe{}", r"job file '.*job\.json' is not UTF-8 text: byte 0xff at offset 0"),
        ("jobs/a/job.json", b'{"spec": {"name": "toy-app"}}', r"job file '.*job\.json' is not a runtime's job\.json: "
                                                               r"KeyError: 'init_batch_size'"),
        ("jobs/a/job.json", b"[]", r"is not a runtime's job\.json"),
        ("jobs/a/steps.csv", b"step,generation\n1,1\n", r"steps table '.*steps\.csv' lacks columns \['num_replicas'"),
        ("jobs/a/steps.csv", b"", r"steps table '.*steps\.csv' is empty"),
        ("jobs/a/steps.csv", b"\x00\x9f\x92\x96", r"steps table '.*steps\.csv' is not UTF-8 text"),
        ("config.json", b"{", r"malformed JSON in '.*config\.json'"),
        ("config.json", b'{"workload": {"jobs": [{"id": "a"}]}}', r"workload\.jobs must be a list of jobs with id"),
    ],
)
def test_corrupt_run_files_are_named_not_a_traceback(tmp_path, capsys, file, content, match):
    run, _ = _write_run(tmp_path, "r", {"0": 2})
    (run / file).write_bytes(content)
    with pytest.raises(InvalidProblem, match=match):
        export_profiles([run], tmp_path / "out")
    assert main(["profile", str(run), "--out", str(tmp_path / "o")]) == 2
    assert "Traceback" not in capsys.readouterr().err
