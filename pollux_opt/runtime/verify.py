"""Completion check: re-evaluate a final checkpoint in a fresh process.

The job's controller starts :func:`verify_process` (through
:class:`VerificationRun`) in a new process forked
from the worker pool's fork server (which has imported torch and nothing of
any job), so the check skips the interpreter start and ``import torch``
(seconds on a small machine) yet shares no memory with the training
processes.  It can also be run by hand as ``python -m
pollux_opt.runtime.verify WORKDIR CHECKPOINT_META``.  Either way it
rebuilds the job from ``WORKDIR/job.json``, loads the checkpoint after checking
its digest, evaluates the validation metric (a user's loop: runs its
``main()`` until the wrapper, see :mod:`~pollux_opt.runtime.user_loop`), checks
the spec's completion criteria and writes
``WORKDIR/verification.json`` atomically.  Exit status 0 when the evaluation
ran (whatever the metric), 1 on an error (written to stderr).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pollux_opt.lifecycle import JobState

if TYPE_CHECKING:
    from pollux_opt.runtime.checkpoint import CheckpointInfo
    from pollux_opt.runtime.pool import WorkerPool
    from pollux_opt.runtime.status import JobStatus

__all__ = ["MAX_VERIFICATION_FAILURES", "VerificationRun", "main", "verify_checkpoint", "verify_process"]

VERIFICATION_FILE = "verification.json"


def verify_checkpoint(workdir: Path, meta_path: Path) -> dict:
    """Evaluate the checkpoint whose metadata is ``meta_path``; returns the record written.

    The record's ``reached`` says whether every completion criterion of the
    spec holds: the re-evaluated metric meets the target (if one is set) and
    the checkpoint's epochs and progress meet theirs (if set).
    """
    os.environ["OMP_NUM_THREADS"] = "1"
    from pollux_opt.runtime.checkpoint import atomic_write_json, list_checkpoints, load_payload, verify
    from pollux_opt.runtime.entry import LOOP, entry_protocol
    from pollux_opt.runtime.spec import JobSpec, resolve_builder
    from pollux_opt.extras import TORCH_MISSING, require

    torch = require("torch", TORCH_MISSING)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    workdir = Path(workdir)
    meta_path = Path(meta_path)
    job = json.loads((workdir / "job.json").read_text())
    spec = JobSpec.from_json(job["spec"])
    info = next((c for c in list_checkpoints(meta_path.parent) if c.meta_path == meta_path), None)
    if info is None or not verify(info):
        raise ValueError(f"checkpoint {meta_path} is missing or corrupt")
    torch.manual_seed(spec.seed)
    payload = load_payload(info)
    fn = resolve_builder(spec.builder, spec.import_dir)
    if entry_protocol(fn) == LOOP:
        metric, epochs = _evaluate_loop(spec, fn, payload, info, torch)
    else:
        metric, epochs = _evaluate_builder(spec, fn, payload, workdir, torch)
    runtime = payload["runtime"]
    counts = spec.counts_reached(float(runtime["progress"]), epochs)
    reached = counts and (spec.target is None or spec.reached(metric))
    record = {
        "checkpoint": str(meta_path), "step": info.step, "metric": metric, "target": spec.target,
        "higher_is_better": spec.higher_is_better, "reached": reached, "epochs": epochs,
        "progress": float(runtime["progress"]), "training_metric": info.meta.get("metric"),
        "seconds": time.perf_counter() - t0, "pid": os.getpid(), "time": time.time(),
    }
    atomic_write_json(workdir / VERIFICATION_FILE, record)
    return record


def _evaluate_builder(spec, build, payload: dict, workdir: Path, torch) -> tuple[float, float]:
    """The builder protocol: (metric, epochs of the sample stream) of the checkpoint."""
    from pollux_opt.runtime.spec import BuildContext, JobParts

    parts = build(BuildContext(seed=spec.seed, config=dict(spec.config), workdir=workdir))
    if not isinstance(parts, JobParts):
        raise TypeError(f"builder {spec.builder!r} must return JobParts, got {type(parts).__name__}")
    parts.model.load_state_dict(payload["model"])
    parts.model.eval()
    with torch.no_grad():
        metric = float(parts.evaluate(parts.model))
    return metric, int(payload["runtime"]["samples"]) / parts.train_size


def _evaluate_loop(spec, fn, payload: dict, info, torch) -> tuple[float | None, float]:
    """A user's loop: run its ``main()`` up to the wrapper, which loads the
    checkpoint's model, checks its digest and evaluates it (None: no evaluate)."""
    from pollux_opt.runtime.user_loop import UserLoop, VerificationDone, run_user_loop
    from pollux_opt.runtime.state import param_checksum

    result: dict = {}

    def attach(user_loop, parts, extra):
        parts.model.load_state_dict(payload["model"])
        checksum = param_checksum(parts.model)
        if checksum != info.meta.get("checksum"):
            raise ValueError(f"parameters loaded from {info.meta_path} have checksum {checksum}, "
                             f"the checkpoint says {info.meta.get('checksum')}")
        metric = None
        if parts.evaluate is not None:
            parts.model.eval()
            with torch.no_grad():
                metric = float(parts.evaluate(parts.model))
        result["metric"] = metric
        raise VerificationDone()

    run_user_loop(UserLoop(spec, 0, 1, attach), fn)
    if "metric" not in result:
        raise RuntimeError(f"entry {spec.builder!r} returned without creating an ElasticDataParallel")
    return result["metric"], float(payload["runtime"].get("epoch", 0))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m pollux_opt.runtime.verify WORKDIR CHECKPOINT_META", file=sys.stderr)
        return 2
    try:
        record = verify_checkpoint(Path(args[0]), Path(args[1]))
    except Exception as exc:  # noqa: BLE001 - reported through the exit status
        import traceback

        traceback.print_exc()
        print(f"verification failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(record))
    return 0


def verify_process(workdir: str, meta_path: str, log_path: str) -> None:
    """Process entry point (top level, picklable arguments): :func:`main` with
    stdout and stderr appended to ``log_path``; exits with its status."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.exit(main([workdir, meta_path]))


#: Verification failures (metric not reproduced in a fresh process) tolerated
#: before a job is failed instead of resumed.
MAX_VERIFICATION_FAILURES = 2


class VerificationRun:
    """The controller's side of the check: the one process checking a job's
    final checkpoint, and what its end means for the job (recorded through the
    job's :class:`~pollux_opt.runtime.status.JobStatus` ``status``)."""

    def __init__(self, status: "JobStatus") -> None:
        self.status = status
        self.workdir = status.workdir
        self.failures = 0  # finished checks that did not confirm the target
        self._proc = None  # the multiprocessing process, while one exists

    @property
    def active(self) -> bool:
        return self._proc is not None

    def start(self, pool: "WorkerPool", info: "CheckpointInfo", reason: str | None, event: str | None = None,
              **details) -> None:
        """Start checking ``info`` in a new process from the pool's fork server
        (torch already imported, none of the training processes' memory): record
        ``event`` (with ``details``) first if given, then enter ``running``,
        verifying, for ``reason`` (None: the job already verifies)."""
        if event is not None:
            self.status.record(event, {"step": info.step, "metric": info.meta.get("metric"), **details})
        (self.workdir / VERIFICATION_FILE).unlink(missing_ok=True)
        log_dir = self.workdir / "logs"
        log_dir.mkdir(exist_ok=True)
        self._proc = pool.start_process(
            verify_process, (str(self.workdir), str(info.meta_path), str(log_dir / "verify.log")),
            name=f"pollux-verify-{self.status.job_id}",
        )
        if reason is not None:
            self.status.enter(JobState.RUNNING, reason, verifying=True)
        self.status.persist()

    def finish(self) -> bool:
        """Once the check has ended, record what it found: the job succeeds, or
        fails when the check could not run.  True when it ran without confirming
        the target (what follows is the controller's choice)."""
        proc = self._proc
        if proc is None or proc.is_alive():
            return False
        proc.join()
        self._proc = None
        if proc.exitcode != 0:
            self.status.fail(f"verification process exited with status {proc.exitcode} (see logs/verify.log)")
            return False
        record = self.record()
        if not record["reached"]:
            self.status.record("verification_failed", record)
            return True
        self.status.record("verified", record)
        with self.status.lock:
            self.status.final_metric = record["metric"]
            self.status.enter(JobState.SUCCEEDED, "verified")
        self.status.persist()
        return False

    def count_failure(self) -> bool:
        """Count one check that did not confirm the target; True once
        :data:`MAX_VERIFICATION_FAILURES` have (the job then fails instead of resuming)."""
        self.failures += 1
        return self.failures >= MAX_VERIFICATION_FAILURES

    def record(self) -> dict:
        """What the finished check wrote (see :func:`verify_checkpoint`)."""
        return json.loads((self.workdir / VERIFICATION_FILE).read_text())

    def rejected(self, info: "CheckpointInfo") -> bool:
        """True if the last finished check was of ``info`` and did not confirm the
        target (then the job trains on from it rather than checking it again)."""
        try:
            record = self.record()
        except (OSError, ValueError):
            return False
        if not isinstance(record, dict):
            return False
        checked = Path(str(record.get("checkpoint", ""))).name
        return checked == info.meta_path.name and record.get("reached") is False

    def kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


if __name__ == "__main__":
    sys.exit(main())
