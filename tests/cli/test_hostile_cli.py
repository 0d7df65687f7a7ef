"""Hostile input to the command line and the simulator: exit 2 with one clear line, never a traceback."""

from __future__ import annotations

import json
import logging

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.backends.sim import ParametricProfile, load_trace_profile, simulate
from pollux_opt.backends.sim.run import MAX_ARRIVAL_ROUNDS, MAX_SIM_CPUS
from pollux_opt.cli.main import DEFAULT_ALLOCATE_TIME_LIMIT_S, LARGE_INSTANCE_BYTES, build_parser, main
from pollux_opt.model import Cluster
from pollux_opt.workloads import load_workload
from pollux_opt.workloads.adaptdl import read_adaptdl_csv
from pollux_opt.workloads.job import WorkloadJob

HEADER = "name,time,application,num_replicas,batch_size\n"
SMALL = {
    "cluster": {"nodes": [{"id": "n0", "cpus": 4}]},
    "jobs": [{"id": "a", "speedup_table": [[1, 1, 1.0], [1, 2, 1.8]], "max_replicas": 2}],
}


def _fails(argv, capsys, match):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert match in err, err
    return err


# ------------------------------------------------------------ allocate
def test_allocate_has_a_documented_default_time_limit():
    help_text = build_parser()._subparsers._group_actions[0].choices["allocate"].format_help()
    assert f"else {DEFAULT_ALLOCATE_TIME_LIMIT_S:g})" in help_text.replace("\n", " ").replace("  ", " ")


@pytest.mark.parametrize("limit", ["inf", "0", "-1", "nan", "soon"])
def test_allocate_refuses_a_time_limit_that_never_ends_or_is_not_one(tmp_path, capsys, limit):
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(SMALL))
    with pytest.raises(SystemExit) as exc:
        main(["allocate", str(path), "--time-limit", limit])
    assert exc.value.code == 2
    assert "must be a finite number of seconds > 0" in capsys.readouterr().err


def test_allocate_logs_each_step_and_stays_within_its_time_limit(tmp_path, capsys, caplog):
    path = tmp_path / "inst.json"
    path.write_text(json.dumps({**SMALL, "options": {"time_limit": 7}}))
    caplog.set_level(logging.INFO, logger="pollux_opt")  # an earlier test may have quieted the library
    assert main(["allocate", str(path)]) == 0
    text = caplog.text
    for step in ("reading", "checking the instance, time limit 7 s", "encoding 1 jobs on 1 nodes",
                 "solving 2 configurations with milp"):
        assert step in text, text
    assert json.loads(capsys.readouterr().out)["status"] == "optimal"


def test_allocate_stops_reading_a_huge_file_at_the_time_limit(tmp_path, capsys):
    jobs = [dict(SMALL["jobs"][0], id=f"j{i}") for i in range(30_000)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps({**SMALL, "jobs": jobs}))
    assert path.stat().st_size >= LARGE_INSTANCE_BYTES
    err = _fails(["allocate", str(path), "--time-limit", "0.05"], capsys, "ran past the time limit")
    assert "jobs" in err
    assert "pollux-opt: reading" in err and "pollux-opt: checking the instance" in err  # a large file's steps


@pytest.mark.parametrize(
    "raw, match",
    [(b"\xff\xfe{", "is not UTF-8 text"), (b"[" * 100_000, "nested too deeply"), (b"", "malformed JSON")],
)
def test_allocate_rejects_bad_bytes(tmp_path, capsys, raw, match):
    path = tmp_path / "inst.json"
    path.write_bytes(raw)
    _fails(["allocate", str(path)], capsys, match)


# ------------------------------------------------------------ workload CSVs
@pytest.mark.parametrize(
    "content, match",
    [
        (HEADER + "a,abc,cifar10,6,2048\n", r"row 1, column 'time' must be a finite number, got 'abc'"),
        (HEADER + "a,nan,cifar10,6,2048\n", r"row 1, column 'time' must be a finite number, got 'nan'"),
        (HEADER + "a,1,cifar10,,2048\n", r"row 1, column 'num_replicas' must be an integer"),
        (HEADER + "a,1,cifar10,6.5,2048\n", r"column 'num_replicas' must be an integer of at most 18 digits, got 6\.5"),
        (HEADER + "a,1,cifar10,6," + "9" * 30 + "\n", r"column 'batch_size' must be an integer of at most 18 digits"),
        (HEADER + "a,1,cifar10,x,2048\n", r"row 1, column 'num_replicas' must be an integer"),
        (HEADER + ",1,cifar10,6,2048\n", r"job id must be letters, digits"),
        (HEADER + "a,-1,cifar10,6,2048\n", r"arrival_s must be a finite number >= 0, got -1"),
        ("", r"is empty \(no header row\)"),
        (HEADER, r"has no rows"),
        ('a,b\n"unterminated\n', r"is not a well-formed CSV table"),
        ("name,time\na,1\n", r"lacks columns \['application', 'num_replicas', 'batch_size'\]"),
    ],
)
def test_bad_workload_csvs_are_named(tmp_path, content, match):
    path = tmp_path / "w.csv"
    path.write_text(content)
    with pytest.raises(InvalidProblem, match=match):
        read_adaptdl_csv(path)


@pytest.mark.parametrize("raw", [b"\xff\xfe\x00n", bytes(range(128, 256))])
def test_binary_workload_csvs_are_named(tmp_path, raw):
    path = tmp_path / "w.csv"
    path.write_bytes(raw)
    with pytest.raises(InvalidProblem, match=r"workload '.*w\.csv' is not UTF-8 text: byte 0x"):
        read_adaptdl_csv(path)


def test_a_good_workload_csv_reads_as_before(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "b,154,cifar10,6,2048\na,53.5,ncf,1,256\n")
    jobs = read_adaptdl_csv(path)
    assert [(j.id, j.arrival_s, j.kind, j.replicas, j.batch_size) for j in jobs] == [
        ("a", 53.5, "ncf", 1, 256), ("b", 154.0, "cifar10", 6, 2048)]
    assert all(type(j.replicas) is int for j in jobs)


# ------------------------------------------------------------ profiles
def _profile_dir(tmp_path, placements: bytes):
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "placements.csv").write_bytes(placements)
    (folder / "validation-64.csv").write_text("iteration,grad_sqr,grad_var,progress\n10,1.0,2.0,5.0\n")
    return folder


@pytest.mark.parametrize(
    "placements, match",
    [
        (b"", r"profile table '.*placements\.csv' is empty"),
        (b"garbage\n1\n", r"lacks columns \['placement', 'local_bsz', 'step_time', 'sync_time'\]"),
        (b"placement,local_bsz,step_time,sync_time\n", r"has no rows"),
        (b"placement,local_bsz,step_time,sync_time\n1,32,fast,0.1\n", r"row 1, column 'step_time' must be a finite number"),
        (b"placement,local_bsz,step_time,sync_time\nx1,32,0.2,0.1\n", r"column 'placement' must be replicas per node"),
        (b"\x89PNG\r\n\x1a\n", r"is not UTF-8 text"),
    ],
)
def test_corrupt_profile_tables_are_named(tmp_path, placements, match):
    with pytest.raises(InvalidProblem, match=match):
        load_trace_profile(_profile_dir(tmp_path, placements))


@pytest.mark.parametrize(
    "content, match",
    [("{bad", r"malformed JSON in '"), ("[1, 2]", r"must map application names to objects"),
     ('{"cifar10": {"verify_seconds": -3}}', r"cifar10\.verify_seconds must be a finite number of seconds >= 0")],
)
def test_a_bad_export_json_is_named(tmp_path, capsys, content, match):
    (tmp_path / "export.json").write_text(content)
    w = tmp_path / "w.csv"
    w.write_text(HEADER + "a,1,cifar10,1,128\n")
    _fails(["simulate", "--workload", str(w), "--profiles", str(tmp_path), "--completion-delay", "measured",
            "--out", str(tmp_path / "out")], capsys, match.replace("\\", ""))


# ------------------------------------------------------------ simulate's scale
@pytest.mark.parametrize(
    "flags, match",
    [
        (["--interval", "1e-6"], "--interval must be a finite number of seconds >= 1, got 1e-06"),
        (["--interval", "nan"], "--interval must be a finite number of seconds >= 1, got nan"),
        (["--nodes", "100000"], f"--nodes x --cpus-per-node must be at most MAX_SIM_CPUS = {MAX_SIM_CPUS}"),
        (["--nodes", "0"], "--nodes must be an integer >= 1, got 0"),
        (["--cpus-per-node", "0"], "--cpus-per-node must be an integer >= 1, got 0"),
        (["--jobs", "0"], "--jobs must be an integer >= 1, got 0"),
        (["--autoscale", "4"], "--autoscale must be MIN:MAX, two node counts, got '4'"),
        (["--autoscale", "a:b"], "--autoscale must be MIN:MAX, two node counts, got 'a:b'"),
        (["--autoscale", "4:2"], "autoscale max_nodes must be at least min_nodes (4), got 2"),
        (["--autoscale", "1:17"], "--autoscale 1:17: MAX must be at most the cluster's nodes"),
        (["--autoscale", "1:4", "--node-startup", "-5"], "autoscale startup_s must be a finite number of seconds"),
        (["--autoscale", "1:4", "--grow-above", "0.1", "--shrink-below", "0.2"],
         "autoscale shrink_below must be at most grow_above"),
        (["--autoscale", "1:4", "--time-value", "8", "--grow-above", "0.1"],
         "--grow-above and --shrink-below are the threshold rule's; they do not go with --time-value 8"),
        (["--autoscale", "1:4", "--time-value", "-1"], "autoscale time_value must be a finite number >= 0"),
        (["--autoscale", "1:4", "--release-after", "nan"], "autoscale release_after must be a finite number"),
        (["--node-cost", "default"], "--node-cost must be TYPE=PRICE (a price per node-hour), got 'default'"),
        (["--node-cost", "default=x"], "--node-cost must be TYPE=PRICE (a price per node-hour), got 'default=x'"),
        (["--node-cost", "gpu=2"], "prices name node type 'gpu', which the cluster lacks; its types: ['default']"),
    ],
)
def test_simulate_rejects_a_run_that_would_not_finish(tmp_path, capsys, flags, match):
    w = tmp_path / "w.csv"
    w.write_text(HEADER + "a,1,cifar10,1,128\n")
    _fails(["simulate", "--workload", str(w), "--out", str(tmp_path / "out"), *flags], capsys, match)


def test_simulate_out_must_not_be_an_existing_file(tmp_path, capsys):
    w = tmp_path / "w.csv"
    w.write_text(HEADER + "a,1,cifar10,1,128\n")
    _fails(["simulate", "--workload", str(w), "--out", str(w)], capsys, "is an existing file; give a folder")


def test_simulate_rejects_an_arrival_it_would_never_reach():
    synth = {"synth": ParametricProfile("synth", max_epochs=2)}
    far = [WorkloadJob(id="a", kind="synth", arrival_s=1e300, replicas=1, batch_size=128)]
    with pytest.raises(InvalidProblem, match=rf"job 'a': arrival_s must be within MAX_ARRIVAL_ROUNDS = "
                                             rf"{MAX_ARRIVAL_ROUNDS} rounds of 60 s \(6e\+06 s\), got 1e\+300"):
        simulate(far, synth, "tiresias", cluster=Cluster.uniform(1, 4), interval=60.0)
    with pytest.raises(InvalidProblem, match=r"interval must be a finite number of seconds >= 1, got 1e-06"):
        simulate(far, synth, "tiresias", cluster=Cluster.uniform(1, 4), interval=1e-6)
    with pytest.raises(InvalidProblem, match=r"at most MAX_SIM_CPUS = 65536 replica slots, got 100000 nodes"):
        simulate(far, synth, "tiresias", cluster=Cluster.uniform(100_000, 4), interval=60.0)


# ------------------------------------------------------------ run directories and workloads
@pytest.mark.parametrize(
    "config, match",
    [(b"{garbage", "malformed JSON in '"), (b"\xff\xfe", "is not UTF-8 text"),
     (b'{"policy": "pollux"}', "is incomplete: it lacks ['workload', 'cluster', 'interval_s']"),
     (b"[]", "is incomplete")],
)
def test_resuming_a_run_with_a_broken_config_is_a_clear_error(tmp_path, capsys, config, match):
    (tmp_path / "config.json").write_bytes(config)
    _fails(["run", "--out", str(tmp_path), "--quiet"], capsys, match)


def test_a_submitted_batch_no_policy_could_run_is_rejected_up_front(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"name": "w", "jobs": [
        {"id": "a", "kind": "digits-cnn", "arrival_s": 0, "replicas": 1, "batch_size": 100_000}]}))
    with pytest.raises(InvalidProblem, match=r"^workload job 'a': batch_size must be at most its max_batch_size "
                                             r"\(512\), got 100000$"):
        load_workload(str(path))


def test_a_new_run_checks_a_workload_given_as_an_object(tmp_path):
    from pollux_opt.backends.local import run_workload
    from pollux_opt.workloads import Workload

    workload = Workload("w", (WorkloadJob("a", "digits-cnn", 0.0, 1, 100_000),))
    with pytest.raises(InvalidProblem, match=r"workload job 'a': batch_size must be at most its max_batch_size"):
        run_workload(tmp_path / "run", workload, "fixed", cluster=Cluster.uniform(1, 2), progress=False)
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.parametrize("policies, match", [
    (["pollux", "bogus"], "unknown policy 'bogus'"),
    (["pollux", "pollux"], "a policy named twice"),
])
def test_demo_checks_its_policies_before_running_any(tmp_path, capsys, policies, match):
    assert main(["demo", "--quick", "--quiet", "--out", str(tmp_path / "d"), "--policies", *policies]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
