"""Event log: append-only JSONL, schema checks, torn-line recovery."""

from __future__ import annotations

import json
import math

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.records.events import (
    EVENT_FIELDS,
    EVENT_TYPES,
    EventLog,
    goodput_model_from_json,
    goodput_model_to_json,
    read_events,
)
from pollux_opt.model import BatchLimits, GoodputModel, GradientStats, ThroughputParams


def test_emit_appends_one_json_line_per_event(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.emit("run_start", 0.0, None, policy="pollux")
        log.emit("submit", 1.5, "a", submitted_replicas=1, submitted_batch_size=32)
        log.emit("allocation", 2.0, None, placement={"a": {"n0": 1}}, objective=math.nan, solver_s=0.01)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    events = read_events(path)
    assert [e["type"] for e in events] == ["run_start", "submit", "allocation"]
    assert events[1] == {"t": 1.5, "job_id": "a", "type": "submit", "submitted_replicas": 1,
                         "submitted_batch_size": 32}
    assert events[2]["objective"] is None  # nan is written as null (JSON has no nan)
    assert all(set(("t", "job_id", "type")) <= set(e) for e in events)


def test_reopening_appends(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.emit("submit", 0.0, "a", submitted_replicas=1, submitted_batch_size=8)
    with EventLog(path) as log:
        log.emit("failed", 3.0, "a", reason="boom")
    assert [e["type"] for e in read_events(path)] == ["submit", "failed"]


def test_an_event_stamped_before_the_last_one_moves_up_to_it_also_after_a_reopen(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.emit("submit", 5.0, "a", submitted_replicas=1, submitted_batch_size=8)
        assert log.emit("submit", 4.5, "b", submitted_replicas=1, submitted_batch_size=8)["t"] == 5.0
    with open(path, "a") as fh:
        fh.write('{"t": 9.0, "job_id": "a", "ty')  # a torn line's time does not count
    with EventLog(path) as log:
        log.emit("failed", 4.8, "a", reason="x")
        log.emit("failed", 6.0, "b", reason="y")
    assert [e["t"] for e in read_events(path)] == [5.0, 5.0, 5.0, 6.0]


def test_torn_last_line_is_skipped_and_repaired(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.emit("submit", 0.0, "a", submitted_replicas=1, submitted_batch_size=8)
    with open(path, "a") as fh:
        fh.write('{"t": 1.0, "job_id": "a", "ty')  # a kill in the middle of a write
    assert [e["type"] for e in read_events(path)] == ["submit"]
    with EventLog(path) as log:
        log.emit("failed", 2.0, "a", reason="x")
    assert [e["type"] for e in read_events(path)] == ["submit", "failed"]
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"t": 0, "job_id": null, "type": "run_start", "policy": "x"}\nnot json\n{"t": 1}\n')
    with pytest.raises(InvalidProblem, match=r"line 2 is not JSON"):
        read_events(path)


def test_missing_log_is_an_error(tmp_path):
    with pytest.raises(InvalidProblem, match=r"does not exist"):
        read_events(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("etype", "t", "job_id", "fields", "message"),
    [
        ("explode", 0.0, "a", {}, r"event type must be one of .* got 'explode'"),
        ("submit", math.nan, "a", {"submitted_replicas": 1, "submitted_batch_size": 1},
         r"event t must be a finite number of seconds, got nan"),
        ("submit", 0.0, None, {"submitted_replicas": 1, "submitted_batch_size": 1},
         r"submit event needs a job_id string, got None"),
        ("allocation", 0.0, "a", {"placement": {}, "objective": 1.0, "solver_s": 0.0},
         r"allocation is a cluster event: job_id must be null, got 'a'"),
        ("rescale_end", 0.0, "a", {"placement": {}}, r"rescale_end event misses field\(s\) \['duration_s'\]"),
    ],
)
def test_bad_events_are_rejected_with_a_clear_message(tmp_path, etype, t, job_id, fields, message):
    with EventLog(tmp_path / "e.jsonl") as log:
        with pytest.raises(InvalidProblem, match=message):
            log.emit(etype, t, job_id, **fields)
    assert read_events(tmp_path / "e.jsonl") == []


def test_every_event_type_has_a_field_list():
    assert set(EVENT_FIELDS) == set(EVENT_TYPES)
    for required in ("submit", "start", "allocation", "rescale_begin", "rescale_end", "checkpoint",
                     "restart_after_fault", "report", "validation", "complete", "failed"):
        assert required in EVENT_TYPES


def test_goodput_model_round_trips_through_json():
    model = GoodputModel(
        ThroughputParams(0.1, 0.01, 0.02, 0.001, 0.05, 0.002, 1.7),
        GradientStats(2.0, 30.0, 32),
        BatchLimits(32, 1024, 2, 256, 7),
    )
    data = json.loads(json.dumps(goodput_model_to_json(model)))
    back = goodput_model_from_json(data)
    assert back == model
    assert goodput_model_to_json(None) is None and goodput_model_from_json(None) is None
    with pytest.raises(InvalidProblem, match=r"bad goodput model in event log"):
        goodput_model_from_json({"throughput_params": {}})
