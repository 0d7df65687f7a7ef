"""Recovering an event log with unreadable lines: :func:`repair_log` keeps every
readable event, in order, and sets the rest aside with their line numbers."""

from __future__ import annotations

import pytest

from pollux_opt import InvalidProblem
from pollux_opt.records.events import read_events, repair_log

GOOD = ['{"t": 0, "job_id": null, "type": "run_start", "policy": "x"}',
        '{"t": 1, "job_id": "a", "type": "submit", "submitted_replicas": 1, "submitted_batch_size": 32}',
        '{"t": 2, "job_id": "a", "type": "failed", "reason": "x"}']


def test_repair_sets_aside_unreadable_lines_and_keeps_the_rest_in_order(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join([GOOD[0], "garbage", GOOD[1], "[1, 2]", GOOD[2], '{"t": 3, "job']) + "\n")
    with pytest.raises(InvalidProblem, match=r"line 2 is not JSON: .*rerun with --repair-log"):
        read_events(path)
    assert repair_log(path) == 3
    assert path.read_text() == "\n".join(GOOD) + "\n"
    assert (tmp_path / "events.jsonl.rejected").read_text() == '2: garbage\n4: [1, 2]\n6: {"t": 3, "job\n'
    assert [e["t"] for e in read_events(path)] == [0, 1, 2]
    assert repair_log(path) == 0  # nothing left to repair: the file is not rewritten
    assert repair_log(tmp_path / "missing.jsonl") == 0


def test_a_line_that_is_json_but_not_an_object_is_refused_with_the_same_recovery(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join([GOOD[0], "[1, 2]", GOOD[1]]) + "\n")
    with pytest.raises(InvalidProblem, match=r"line 2 is not a JSON object; to keep every readable event"):
        read_events(path)
