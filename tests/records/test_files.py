"""The one atomic writer: a file is complete or untouched, and its rename reaches the disk."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from pollux_opt.records import files
from pollux_opt.records.files import (
    atomic_write_bytes, atomic_write_csv, atomic_write_json, atomic_write_text, drop_torn_line,
)


def test_a_crash_before_the_rename_leaves_the_old_content_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    atomic_write_json(path, {"old": 1})

    def crash(src, dst):
        raise OSError("killed before the rename")

    monkeypatch.setattr(files.os, "replace", crash)
    with pytest.raises(OSError, match="killed before the rename"):
        atomic_write_json(path, {"new": 2})
    assert json.loads(path.read_text()) == {"old": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_crash_while_writing_leaves_no_file_where_there_was_none(tmp_path, monkeypatch):
    path = tmp_path / "new.csv"

    def crash(fd):
        raise OSError("disk gone")

    monkeypatch.setattr(files.os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        atomic_write_text(path, "a,b\n1,2\n")
    assert list(tmp_path.iterdir()) == []


def test_the_file_and_its_directory_are_fsynced(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def counting_fsync(fd):
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", counting_fsync)
    atomic_write_bytes(tmp_path / "sub" / "x.bin", b"\x00\x01")
    assert synced == ["file", "dir"]
    assert (tmp_path / "sub" / "x.bin").read_bytes() == b"\x00\x01"


def test_text_json_and_csv_helpers(tmp_path):
    atomic_write_text(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
    atomic_write_json(tmp_path / "j.json", {"b": 1, "a": [1.5]})
    assert (tmp_path / "j.json").read_text() == json.dumps({"b": 1, "a": [1.5]}, indent=2)
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "nan.json", {"x": float("nan")})  # strict JSON by default
    assert not (tmp_path / "nan.json").exists()
    atomic_write_json(tmp_path / "nan.json", {"x": float("nan")}, allow_nan=True, sort_keys=True, indent=1)
    assert (tmp_path / "nan.json").read_text() == '{\n "x": NaN\n}'
    frame = pd.DataFrame({"name": ["a", "b"], "time": [0.0, 1.5]})
    atomic_write_csv(tmp_path / "w.csv", frame)
    assert (tmp_path / "w.csv").read_text() == frame.to_csv(index=False)


@pytest.mark.parametrize("content, kept, last", [
    (b"", b"", b""),
    (b'{"a":1}\n', b'{"a":1}\n', b'{"a":1}\n'),
    (b'{"a":1}\n{"b":', b'{"a":1}\n', b'{"a":1}\n'),
    (b'{"a":1}\n{"b":2}\n', b'{"a":1}\n{"b":2}\n', b'{"b":2}\n'),
    (b"torn", b"", b""),
])
def test_a_torn_last_line_is_dropped_and_the_last_whole_line_returned(tmp_path, content, kept, last):
    path = tmp_path / "log.jsonl"
    path.write_bytes(content)
    assert drop_torn_line(path) == last
    assert path.read_bytes() == kept


def test_dropping_a_torn_line_of_a_missing_file_creates_nothing(tmp_path):
    assert drop_torn_line(tmp_path / "none") == b"" and not (tmp_path / "none").exists()
