"""A job whose target was reached is verified, never trained past: re-opened with
an unchecked final checkpoint it checks that checkpoint at once, and a launch
that finds one verifies it instead (the supervisor with a stand-in pool, so no
worker or torch is needed)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from pollux_opt.lifecycle import JobState
from pollux_opt.runtime import ElasticJob, WorkerPool, get_job
from pollux_opt.runtime.allocation import parse_allocation
from pollux_opt.runtime.verify import VERIFICATION_FILE

SPEC = get_job("digits-cnn")
#: Generous bound on the supervisor thread's reaction, seconds.
WAIT_S = 10.0


class _Finished:
    """A process that has already ended with status 0."""

    exitcode = 0

    def is_alive(self) -> bool:
        return False

    def join(self, timeout=None) -> None:
        pass

    def kill(self) -> None:
        pass


class StubPool(WorkerPool):
    """Starts no process: records what it was asked to check and writes the
    check's record as the real verification would (``reached`` as given).
    A launch of workers would fail the test (the pool holds none)."""

    def __init__(self, reached: bool = True) -> None:  # no fork server: WorkerPool.__init__ not called
        self.reached = reached
        self.checked: list[str] = []

    def start_process(self, target, args, name):
        workdir, meta_path, _log = args
        self.checked.append(Path(meta_path).name)
        (Path(workdir) / VERIFICATION_FILE).write_text(json.dumps(
            {"checkpoint": meta_path, "step": 42, "metric": 0.97, "reached": self.reached}))
        return _Finished()

    def release(self, workers) -> None:
        pass

    def discard(self, workers, graceful=False) -> None:
        pass

    def acquire(self, count, job_key=None):
        raise AssertionError("the job launched workers")

    def close(self) -> None:
        pass


def _final_checkpoint(workdir: Path, step: int = 42) -> str:
    """Write a final checkpoint (payload bytes and metadata with their SHA-256); returns the metadata's name."""
    ckpt = workdir / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    payload = b"not a real torch payload"
    (ckpt / f"ckpt-{step:010d}.pt").write_bytes(payload)
    meta = {"step": step, "final": True, "metric": 0.97, "progress": 50.0,
            "sha256": hashlib.sha256(payload).hexdigest()}
    (ckpt / f"ckpt-{step:010d}.json").write_text(json.dumps(meta))
    return f"ckpt-{step:010d}.json"


def _job(workdir: Path, pool: StubPool, state: str, **saved) -> ElasticJob:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "state.json").write_text(json.dumps({"state": state, **saved}))
    return ElasticJob(SPEC, workdir, job_id="j", pool=pool)


def _wait_state(job: ElasticJob, state: JobState) -> None:
    deadline = time.monotonic() + WAIT_S
    while job.poll() is not state and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job.poll() is state


def _verifying(job: ElasticJob) -> bool:
    """Running, verifying the final checkpoint, holding no CPUs."""
    report = job.report()
    return report.state is JobState.RUNNING and report.verifying and not report.placement


def test_a_job_reopened_while_verifying_checks_its_final_checkpoint_at_once(tmp_path):
    name = _final_checkpoint(tmp_path)
    pool = StubPool()
    job = _job(tmp_path, pool, "running", verifying=True)
    try:
        assert _verifying(job)  # never shown as queued: no scheduler allocates it CPUs
        _wait_state(job, JobState.SUCCEEDED)
        assert pool.checked == [name]
        kinds = [e.kind for e in job.report().events]
        assert kinds == ["verification_resumed", "verified"]
        assert job.report().final_metric == 0.97 and job.report().step == 42
    finally:
        job.close()


def test_a_job_killed_after_its_final_checkpoint_but_before_verifying_verifies_it(tmp_path):
    _final_checkpoint(tmp_path)
    job = _job(tmp_path, StubPool(), "running")  # the pause after the target never completed
    try:
        _wait_state(job, JobState.SUCCEEDED)
    finally:
        job.close()


def test_a_rejected_final_checkpoint_is_trained_on_not_checked_again(tmp_path):
    name = _final_checkpoint(tmp_path)
    (tmp_path / VERIFICATION_FILE).write_text(json.dumps(
        {"checkpoint": str(tmp_path / "checkpoints" / name), "reached": False}))
    pool = StubPool()
    job = _job(tmp_path, pool, "queued")
    try:
        assert job.poll() is JobState.QUEUED and pool.checked == []
    finally:
        job.close()


def test_a_launch_that_finds_an_unchecked_final_checkpoint_verifies_it(tmp_path):
    pool = StubPool(reached=False)
    job = _job(tmp_path, pool, "queued")
    name = _final_checkpoint(tmp_path, step=7)  # written after the job was opened (a worker died after it)
    alloc = parse_allocation(SPEC.limits(), None, 1, None, None, None, None)
    job._ctl._launch(alloc, "restart", time.monotonic())
    try:
        assert _verifying(job) and pool.checked == [name]
        reached = job.report().events[-1]
        assert reached.kind == "target_reached" and reached.details == {
            "step": 7, "metric": 0.97, "from_checkpoint": True}
    finally:
        job.close()
