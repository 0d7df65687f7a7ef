"""One workload-job type for real runs and simulations; the AdaptDL CSVs read into it."""

from __future__ import annotations

import numpy as np
import pytest

from pollux_opt import InvalidProblem
from pollux_opt.workloads import (
    WORKLOAD_SETS,
    WorkloadJob,
    load_workload,
    read_adaptdl_csv,
    write_adaptdl_csv,
)
from pollux_opt.workloads.sets import RATINGS_QUICK


def test_adaptdl_csv_rows_become_workload_jobs_sorted_by_arrival(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size\n"
                    "b-1,60,bert,2,64\ncifar10-0,53,cifar10,6,2048\na-2,60,ncf,1,256\n")
    jobs = read_adaptdl_csv(path)
    assert [(j.id, j.kind, j.arrival_s, j.replicas, j.batch_size) for j in jobs] == [
        ("cifar10-0", "cifar10", 53.0, 6, 2048), ("a-2", "ncf", 60.0, 1, 256), ("b-1", "bert", 60.0, 2, 64)]
    assert all(type(j.replicas) is int and type(j.batch_size) is int for j in jobs)
    out = tmp_path / "again.csv"
    write_adaptdl_csv(jobs, out)
    assert read_adaptdl_csv(out) == jobs
    assert out.read_text().splitlines()[0] == "name,time,application,num_replicas,batch_size"


_HEADER = "name,time,application,num_replicas,batch_size\n"


@pytest.mark.parametrize("text, message", [
    (None, r"does not exist"),
    ("name,time,application,num_replicas\na,0,ncf,1\n", r"lacks columns \['batch_size'\]"),
    (_HEADER + "a,0,ncf,1,8\na,1,ncf,1,8\n", r"duplicate job name 'a'"),
    (_HEADER + "a,0,ncf,0,8\n", r"job 'a': replicas must be an integer >= 1, got 0"),
])
def test_bad_adaptdl_csvs_are_refused_naming_the_problem(tmp_path, text, message):
    path = tmp_path / "w.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(InvalidProblem, match=message):
        read_adaptdl_csv(path)


def test_workload_job_fields_are_checked_and_numpy_integers_accepted():
    job = WorkloadJob("j", "synth", np.float64(2.5), np.int64(3), np.int32(64), max_replicas=np.int64(4))
    assert (job.arrival_s, job.replicas, job.batch_size, job.max_replicas) == (2.5, 3, 64, 4)
    assert type(job.replicas) is int and type(job.arrival_s) is float
    for kwargs, message in [
        ({"replicas": 1.5}, r"job 'j': replicas must be an integer >= 1, got 1.5"),
        ({"batch_size": True}, r"job 'j': batch_size must be an integer >= 1, got True"),
        ({"arrival_s": float("inf")}, r"job 'j': arrival_s must be a finite number >= 0, got inf"),
        ({"max_replicas": 0}, r"job 'j': max_replicas must be an integer >= 1 or None, got 0"),
        ({"min_replicas": 3, "max_replicas": 2}, r"job 'j': max_replicas must be >= min_replicas \(3\), got 2"),
        ({"kind": ""}, r"job 'j': kind must be letters, digits, '\.', '_' or '-' \(not starting with a symbol\), "
                       r"got ''"),
        ({"kind": "../x"}, r"job 'j': kind must be letters, digits, .*got '\.\./x'"),
    ]:
        args = {"id": "j", "kind": "synth", "arrival_s": 0.0, "replicas": 1, "batch_size": 8} | kwargs
        with pytest.raises(InvalidProblem, match=message):
            WorkloadJob(**args)
    with pytest.raises(InvalidProblem, match=r"job id must be letters, digits, '\.', '_' or '-' "
                                             r"\(not starting with a symbol\), got 'bad id'"):
        WorkloadJob("bad id", "synth", 0.0, 1, 8)


def test_mixed_and_burst_run_the_same_four_jobs_and_quick_ratings_keeps_its_learning_rate():
    mixed, burst = WORKLOAD_SETS["mixed"], WORKLOAD_SETS["burst"]
    assert {(j.id, j.kind, j.batch_size) for j in mixed.jobs} == {(j.id, j.kind, j.batch_size) for j in burst.jobs}
    assert all(j.replicas == 1 for j in mixed.jobs) and all(j.replicas == 2 for j in burst.jobs)
    quick = {j.id: j for j in load_workload("mixed", quick=True).jobs}
    assert quick["ratings"].spec == RATINGS_QUICK and quick["ratings"].job_spec().config["lr"] == 5e-4
    assert quick["ratings"].job_spec().target == 0.60


def test_a_workload_job_round_trips_through_json_with_every_field():
    job = WorkloadJob(id="a", kind="digits-cnn", arrival_s=3.0, replicas=2, batch_size=64, min_replicas=1,
                      max_replicas=4, spec={"target": 0.9}, quick_spec={"target": 0.5}, weight=2.5)
    assert WorkloadJob.from_json(job.to_json()) == job
