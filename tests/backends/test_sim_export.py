"""``pollux-opt profile``: real-run measurements -> AdaptDL-format profiles, from synthetic
recorded runs (the ``recorded_runs`` fixture)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pollux_opt.backends.sim.export import EXPORT_EPOCHS, export_profiles
from pollux_opt.backends.sim import load_profiles
from pollux_opt.workloads import read_adaptdl_csv
from pollux_opt.cli.main import main
from solvers import InvalidProblem

def test_round_trip_through_the_simulator_reader(tmp_path, recorded_runs):
    run1, final = recorded_runs.write(tmp_path / "runs", "one-node", {"n0": 2})
    run2, _ = recorded_runs.write(tmp_path / "runs", "two-nodes", {"n0": 1, "n1": 1})
    out = tmp_path / "profiles"
    result = export_profiles([run1, run2], out)
    assert set(result) == {"toy-app"}
    assert result["toy-app"].jobs == ("one-node/a", "two-nodes/a")
    assert result["toy-app"].restart_seconds == pytest.approx(1.5)
    assert result["toy-app"].verify_seconds == pytest.approx(2.5)  # from the run log's complete event

    profile = load_profiles(out)["toy-app"]
    assert profile.init_batch_size == recorded_runs.m0 and profile.max_batch_size == recorded_runs.max_bsz
    assert profile.max_epochs == EXPORT_EPOCHS
    assert profile.progress_at(profile.max_epochs) == pytest.approx(final)
    # One replica, s = 1: a trace row is one micro-batch, and the simulator's
    # T + s (T - T_sync) gives back the measured optimizer step.
    step, sync = profile.step_sync((1,), recorded_runs.m0 // 2)
    assert step == pytest.approx(recorded_runs.compute[1]) and sync == pytest.approx(0.0)
    assert step + 1 * (step - sync) == pytest.approx(2 * recorded_runs.compute[1])
    # Nodes come from the placement events: "2" (one node) and "11" (two nodes).
    for placement in ((2,), (1, 1)):
        step, sync = profile.step_sync(placement, 64)
        assert step == pytest.approx(recorded_runs.compute[2] + recorded_runs.sync[2])
        assert sync == pytest.approx(recorded_runs.sync[2])
    scal = pd.read_csv(out / "toy-app" / "scalability.csv")
    assert sorted(scal.num_nodes.unique()) == [1, 2]
    # grad_var_est is already at M0: exported unchanged, and the AdaScale
    # iteration count at B follows from it.
    sqr, var = profile.grad_stats(128, 3)
    assert (sqr, var) == (pytest.approx(recorded_runs.sqr), pytest.approx(recorded_runs.var))
    assert profile.iterations(recorded_runs.m0, 5) == pytest.approx(profile.progress_at(5))
    assert profile.iterations(128, 5) == pytest.approx(profile.progress_at(5) / recorded_runs.gain(128))
    jobs = read_adaptdl_csv(out / "workload-one-node.csv")
    assert [(j.id, j.kind, j.batch_size) for j in jobs] == [("a", "toy-app", 64)]


def test_warmup_steps_are_left_out(tmp_path, recorded_runs):
    run, _ = recorded_runs.write(tmp_path, "r", {"n0": 2})
    steps = pd.read_csv(run / "jobs" / "a" / "steps.csv")
    steps.loc[[0, 1], "step_time"] = 5.0  # the first two steps of a generation: start-up cost
    steps.to_csv(run / "jobs" / "a" / "steps.csv", index=False)
    export_profiles([run], tmp_path / "p")
    placements = pd.read_csv(tmp_path / "p" / "toy-app" / "placements.csv", dtype={"placement": str})
    assert placements.step_time.max() < 1.0


def test_step_time_is_the_mean_of_warm_steps_slow_ones_included(tmp_path, recorded_runs):
    """A job's training time is the sum of its steps: one warm step in ten
    slowed 4x by contention makes the configuration's exported step 30 %
    longer (the median would ignore it and the replay would finish early)."""
    run, _ = recorded_runs.write(tmp_path, "r", {"n0": 2})
    path = run / "jobs" / "a" / "steps.csv"
    steps = pd.read_csv(path)
    one = steps.index[(steps.num_replicas == 1) & (steps.index >= 2)]  # warm one-replica steps
    slow = one[::10]
    steps.loc[slow, "step_time"] = 4 * steps.loc[slow, "step_time"]
    steps.loc[slow, "compute_time"] = 4 * steps.loc[slow, "compute_time"]
    steps.to_csv(path, index=False)
    export_profiles([run], tmp_path / "p")
    step, _ = load_profiles(tmp_path / "p")["toy-app"].step_sync((1,), recorded_runs.m0 // 2)
    expected = recorded_runs.compute[1] * (1 + 3 * len(slow) / len(one))
    assert step == pytest.approx(expected, rel=1e-6)
    assert step > 1.25 * recorded_runs.compute[1]


def test_demo_folder_expands_to_its_runs_and_cli(tmp_path, capsys, recorded_runs):
    recorded_runs.write(tmp_path / "demo", "fixed", {"n0": 2})
    recorded_runs.write(tmp_path / "demo", "pollux", {"n0": 2})
    assert main(["profile", str(tmp_path / "demo"), "--out", str(tmp_path / "p")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["toy-app"]["jobs"] == ["fixed/a", "pollux/a"]
    assert (tmp_path / "p" / "export.json").is_file()
    assert sorted(p.name for p in (tmp_path / "p").glob("workload-*.csv")) == [
        "workload-fixed.csv", "workload-pollux.csv"]


def test_a_missing_run_dir_is_named(tmp_path):
    with pytest.raises(InvalidProblem, match=r"run dir '.*nope' does not exist"):
        export_profiles([tmp_path / "nope"], tmp_path / "out")


def test_a_run_dir_without_a_jobs_folder_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidProblem, match=r"run dir '.*empty' holds no jobs/ folder"):
        export_profiles([tmp_path / "empty"], tmp_path / "out")


def test_a_run_dir_with_no_recorded_steps_is_refused(tmp_path, recorded_runs):
    job = tmp_path / "run" / "jobs" / "a"
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"spec": {"name": "x", "init_batch_size": 1, "max_batch_size": 2}}))
    (job / "steps.csv").write_text(",".join(recorded_runs.step_columns) + "\n")
    with pytest.raises(InvalidProblem, match=r"no job with recorded steps"):
        export_profiles([tmp_path / "run"], tmp_path / "out")


def test_an_empty_list_of_run_dirs_is_refused(tmp_path):
    with pytest.raises(InvalidProblem, match=r"run_dirs must name at least one run directory"):
        export_profiles([], tmp_path / "out")


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys):
    assert main(["profile", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["../victim", "/tmp/victim", "..", "a/../../victim"])
def test_spec_name_that_is_a_path_is_refused_before_anything_is_written(tmp_path, capsys, name, recorded_runs):
    """A job.json whose spec.name is a path must not make the export write or
    delete files outside its output folder (here: ``victim/`` next to it)."""
    run, _ = recorded_runs.write(tmp_path, "r", {"n0": 2})
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


def test_an_app_filter_name_that_is_a_path_is_refused(tmp_path, recorded_runs):
    run, _ = recorded_runs.write(tmp_path, "r", {"n0": 2})
    with pytest.raises(InvalidProblem, match=r"apps entry must be letters, digits, .*got '\.\./x'"):
        export_profiles([run], tmp_path / "p", apps=["../x"])


def test_grad_var_export_matches_the_simulated_gain(tmp_path, recorded_runs):
    """The simulator's gain at the exported stats equals the runtime's recorded gain."""
    run, _ = recorded_runs.write(tmp_path, "r", {"n0": 2})
    export_profiles([run], tmp_path / "p")
    profile = load_profiles(tmp_path / "p")["toy-app"]
    steps = pd.read_csv(run / "jobs" / "a" / "steps.csv")
    batch = steps.num_replicas * steps.local_bsz * (steps.accum_steps + 1)
    sqr, var = profile.grad_stats(128, 0)
    sim_gain = (var + sqr) / (var / (batch / profile.init_batch_size) + sqr)
    np.testing.assert_allclose(sim_gain, steps.gain)


def test_single_node_profile_with_one_replica_count_extrapolates_without_error(tmp_path, recorded_runs):
    """Profiles exported from one machine can have every row on one node and
    one replica count (a degenerate hull for 3-D interpolation): a placement
    never measured takes the nearest measured rows instead of raising."""
    run, _ = recorded_runs.write(tmp_path, "r", {"n0": 2})
    steps = pd.read_csv(run / "jobs" / "a" / "steps.csv")
    steps = steps[steps.generation == 1]
    steps.to_csv(run / "jobs" / "a" / "steps.csv", index=False)
    export_profiles([run], tmp_path / "p")
    profile = load_profiles(tmp_path / "p")["toy-app"]
    step, sync = profile.step_sync((1, 1), recorded_runs.m0 // 2)  # two nodes: never measured
    assert step == pytest.approx(recorded_runs.compute[1]) and sync == pytest.approx(0.0)


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
def test_corrupt_run_files_are_named_not_a_traceback(tmp_path, capsys, file, content, match, recorded_runs):
    run, _ = recorded_runs.write(tmp_path, "r", {"0": 2})
    (run / file).write_bytes(content)
    with pytest.raises(InvalidProblem, match=match):
        export_profiles([run], tmp_path / "out")
    assert main(["profile", str(run), "--out", str(tmp_path / "o")]) == 2
    assert "Traceback" not in capsys.readouterr().err
