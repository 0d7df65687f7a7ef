"""Hostile instance files and values: a clear error, a bounded cost, never a traceback."""

from __future__ import annotations

import json
import time

import pytest

from pollux_opt import Cluster, GoodputModel, InvalidProblem, Job, Node, Options, Status, allocate
from pollux_opt.model import BatchLimits, GradientStats, ThroughputParams, parse_instance, to_problem
from pollux_opt.model.configs import candidate_pairs, top_sums
from pollux_opt.model.instance import load_instance
from solvers import MAX_CPUS, MAX_REPLICAS, P_RANGE, WEIGHT_RANGE, OutOfTime

TABLE = {(1, 1): 1.0, (1, 2): 1.8, (2, 2): 1.6}


def _model(**limits) -> GoodputModel:
    return GoodputModel(
        throughput_params=ThroughputParams(0.02, 0.001, 0.05, 0.01, 0.2, 0.05, 2.0),
        grad_stats=GradientStats(grad_sqr=1.0, grad_var=50.0, init_batch_size=32),
        limits=BatchLimits(**{"init_batch_size": 32, **limits}),
    )


SMALL = {
    "cluster": {"nodes": [{"id": "n0", "cpus": 4}]},
    "jobs": [{"id": "a", "speedup_table": [[1, 1, 1.0], [1, 2, 1.8]], "max_replicas": 2}],
}


# ------------------------------------------------------------ bytes of the file
@pytest.mark.parametrize(
    "raw, match",
    [
        (json.dumps(SMALL).replace('"a"', '"\u00e9"').encode("latin-1"), r"is not UTF-8 text: byte 0xe9 at offset \d+"),
        (json.dumps(SMALL).encode("utf-16"), r"is not UTF-8 text: byte 0xff at offset 0"),
        (b"\xff" + json.dumps(SMALL).encode(), r"is not UTF-8 text: byte 0xff at offset 0"),
        (json.dumps(SMALL).encode()[:40] + b"\x80\x81" + json.dumps(SMALL).encode()[40:], r"byte 0x80 at offset 40"),
        (b"[" * 100_000 + b"]" * 100_000, r"malformed JSON in '.*inst\.json': nested too deeply"),
        (b'{"cluster": {"nodes": [{"id": "n0", "cpus": ' + b"9" * 5000 + b"}]}, \"jobs\": []}",
         r"malformed JSON in '.*inst\.json': Exceeds the limit"),
        (b"", r"malformed JSON in '.*inst\.json': Expecting value at line 1 column 1"),
        (b"\x00\x01\x02", r"malformed JSON"),
    ],
    ids=["latin-1", "utf-16", "stray 0xff", "stray continuation bytes", "nested 100000 deep",
         "5000-digit literal", "empty", "binary"],
)
def test_a_file_that_is_not_utf8_json_is_named(tmp_path, raw, match):
    path = tmp_path / "inst.json"
    path.write_bytes(raw)
    with pytest.raises(InvalidProblem, match=match):
        load_instance(path)


def test_a_utf8_byte_order_mark_is_allowed(tmp_path):
    path = tmp_path / "inst.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(SMALL).encode())
    assert load_instance(path).jobs[0].id == "a"


def test_a_4000_digit_count_is_rejected_by_its_domain_with_a_short_message():
    data = json.loads(json.dumps(SMALL).replace('"cpus": 4', '"cpus": ' + "9" * 4000))
    with pytest.raises(InvalidProblem, match=r"^cluster\.nodes\[0\]\.cpus must be an integer in \[1, 2147483647\], "
                                             r"got an integer of about 400\d digits$"):
        parse_instance(data)


@pytest.mark.parametrize(
    "job, match",
    [
        ({"id": None}, r"jobs\[0\]\.id must be a non-empty string, got None"),
        ({"max_replicas": 2**63}, r"max_replicas must be an integer in \[0, 2147483647\], got 9223372036854775808"),
        ({"max_replicas": 10**400}, r"max_replicas must be an integer in \[0, 2147483647\], got an integer of about 401"),
        ({"restarts": 10**400}, r"restarts must be an integer in \[0, 9007199254740992\]"),
        ({"age": 10**400}, r"age must be a finite number >= 0, got an integer of about 401 digits"),
        ({"weight": 10**400}, r"weight must be a finite number in \[1e-06, 1000000\], got an integer of about 401"),
        ({"weight": 1e-9}, r"weight must be a finite number in \[1e-06, 1000000\], got 1e-09"),
        ({"speedup_table": [[1, 1, 1e12]]}, r"speedup at \(num_nodes=1, num_replicas=1\) must be a finite number in "
                                            r"\[0, 2147483648\], got 1000000000000\.0"),
        ({"placement": {"n0": 2**40}}, r"placement on node 'n0' must be an integer in \[0, 2147483647\]"),
    ],
)
def test_job_fields_outside_the_solver_domain_are_named(job, match):
    data = json.loads(json.dumps(SMALL))
    data["jobs"][0].update(job)
    with pytest.raises(InvalidProblem, match=match):
        parse_instance(data)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"p": P_RANGE[0] - 1}, r"^p must be a finite number in \[-5, 5\], got -6\.0$"),
        ({"p": P_RANGE[1] + 1}, r"^p must be a finite number in \[-5, 5\], got 6\.0$"),
        ({"max_nodes_per_job": MAX_REPLICAS + 1}, r"^max_nodes_per_job must be an integer in \[1, 2147483647\]"),
        ({"seed": 2**63}, r"^seed must be an integer in \[0, 9223372036854775808\) or None"),
        ({"restart_delay": 10**400}, r"^restart_delay must be a finite number of seconds >= 0, got an integer"),
    ],
)
def test_options_outside_the_solver_domain_are_named(options, match):
    with pytest.raises(InvalidProblem, match=match):
        parse_instance({**SMALL, "version": 2, "options": options})


def test_the_model_domains_are_the_solver_domains():
    with pytest.raises(InvalidProblem):
        Node("n", MAX_CPUS + 1)
    assert Node("n", MAX_CPUS).cpus == MAX_CPUS
    assert Options(p=P_RANGE[0]).p == P_RANGE[0] and Options(p=P_RANGE[1]).p == P_RANGE[1]
    for w in WEIGHT_RANGE:
        assert Job("a", TABLE, max_replicas=2, weight=w).weight == w


def test_wide_jobs_get_a_smaller_default_spread_penalty_not_an_error_about_it():
    for m in (1001, 5000, MAX_REPLICAS):
        options = Options(max_nodes_per_job=m)
        assert 0 < options.spread_penalty * (m - 1) <= 0.5


# ------------------------------------------------------------ cost bounded by the work
def test_explicit_tables_are_encoded_from_the_table_not_from_the_node_size():
    job = Job("a", TABLE, max_replicas=10**9)
    problem = to_problem(Cluster((Node("n0", 10**6),)), [job], Options())
    assert problem.cfg_job.size == 2  # (1, 1) and (1, 2); (2, 2) needs two nodes
    problem = to_problem(Cluster.uniform(2, 10**7), [job], Options())
    assert problem.cfg_job.size == 3


@pytest.mark.parametrize("fixed", [None, 64])
def test_goodput_model_pairs_stop_at_what_the_job_can_use(fixed):
    model = _model(max_batch_size=1024, min_local_bsz=8)
    usable = 1024 // 8 if fixed is None else fixed
    job = Job("a", model, max_replicas=10**9, fixed_batch_size=fixed)
    pairs = candidate_pairs(job, top_sums(Cluster.uniform(2, 10**7)), 16)
    assert max(k for _, k in pairs) == usable
    assert len(pairs) == 2 * usable - 1
    small = candidate_pairs(Job("b", model, max_replicas=2), top_sums(Cluster((Node("n0", 100_000),))), 16)
    assert small == ((1, 1), (1, 2))


def test_pairs_beyond_the_usable_range_were_infeasible_anyway():
    model = _model(max_batch_size=1024, min_local_bsz=8)
    k = 1024 // 8
    assert model.optimize([1, 1], [k, k + 1]).feasible.tolist() == [True, False]


def test_big_nodes_answer_like_small_ones():
    job = Job("a", TABLE, max_replicas=10**9)
    big = allocate(Cluster.uniform(2, 10**7), [job])
    small = allocate(Cluster.uniform(2, 4), [job])
    assert big.status == small.status == Status.OPTIMAL
    assert big.objective == pytest.approx(small.objective)


# ------------------------------------------------------------ deadlines
def test_parsing_stops_at_its_deadline():
    data = {**SMALL, "jobs": [dict(SMALL["jobs"][0], id=f"j{i}") for i in range(3000)]}
    with pytest.raises(OutOfTime, match=r"checking the instance ran past the time limit after 0 of 3000 jobs"):
        parse_instance(data, deadline=time.monotonic() - 1)
    assert issubclass(OutOfTime, InvalidProblem)


def test_an_encoding_past_the_time_limit_keeps_the_current_placement(monkeypatch):
    import sys

    allocate_module = sys.modules["pollux_opt.model.allocate"]

    jobs = [Job(f"j{i}", TABLE, max_replicas=2, placement={"n0": 1} if i == 0 else {}) for i in range(3)]

    def slow(*args, **kwargs):
        time.sleep(0.05)
        raise OutOfTime("encoding ran past the time limit after 0 of 3 jobs")

    monkeypatch.setattr(allocate_module, "to_problem", slow)
    alloc = allocate(Cluster.uniform(2, 4), jobs, time_limit=0.01)
    assert alloc.status == Status.TIME_LIMIT_NO_SOLUTION
    assert alloc.placement == {"j0": {"n0": 1}, "j1": {}, "j2": {}}
    assert alloc.to_json()["objective"] is None
