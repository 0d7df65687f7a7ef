"""The run log records only checkpoints a job could resume from: a forged or
damaged one is neither logged nor allowed to hide the real ones after it."""

from __future__ import annotations

import hashlib
import json

from pollux_opt.backends.local.handle import JobBookkeeping
from pollux_opt.backends.local.polling import checkpoint_events
from pollux_opt.workloads import WorkloadJob

WL = WorkloadJob("j", "digits-cnn", 0.0, 1, 32)


def _write(directory, step: int, payload: bytes = b"weights", sha256: str | None = None, **meta) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"ckpt-{step:010d}.pt").write_bytes(payload)
    meta = {"step": step, "progress": float(step), "sha256": sha256 or hashlib.sha256(payload).hexdigest(), **meta}
    (directory / f"ckpt-{step:010d}.json").write_text(json.dumps(meta))


def test_a_forged_checkpoint_is_not_logged_and_later_real_ones_are(tmp_path):
    job = JobBookkeeping(id="j", wl=WL, spec=WL.job_spec())
    ckpt = tmp_path / "checkpoints"
    _write(ckpt, 5)
    assert checkpoint_events(job, ckpt) == [{"step": 5, "progress": 5.0, "final": False}]
    _write(ckpt, 9_999_999_999, sha256="0" * 64)  # metadata whose payload does not hash to it
    (ckpt / "ckpt-0000000011.json").write_text("{not json")
    assert checkpoint_events(job, ckpt) == []
    assert job.last_ckpt_step == 5
    _write(ckpt, 10, final=True)
    assert checkpoint_events(job, ckpt) == [{"step": 10, "progress": 10.0, "final": True}]
    assert job.last_ckpt_step == 10
    assert job.ckpt_rejected == {"ckpt-9999999999.json"}  # hashed once; unreadable metadata costs no hash
    assert checkpoint_events(job, ckpt) == []  # nothing new: nothing hashed again
