"""A synthetic recorded real run (the ``recorded_runs`` fixture), read by the
profile export and by the simulator-fidelity experiment's tests; the machine's
cgroup CPU controller (the ``cgroups`` fixture) for the tests of real quotas."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from pollux_opt.backends.local.throttle import ThrottleUnavailable, detect

#: The columns of a job's ``steps.csv`` as the runtime writes them.
STEP_COLUMNS = (
    "generation", "step", "time", "num_replicas", "local_bsz", "accum_steps", "step_time",
    "compute_time", "sync_time", "loss", "grad_sqr_est", "grad_var_est", "gain", "lr_factor", "progress",
)


@dataclass(frozen=True)
class RecordedRuns:
    """Writer of run directories holding one job ``a`` of app ``toy-app``: generation 1
    on one replica (m = M0/2, s = 1), generation 2 on two (m = 64, s = 0); the run log
    charges 2.5 s of verification, the job's events 0.3 s to start and 1.5 s to rescale."""

    step_columns: tuple = STEP_COLUMNS
    #: Initial (M0) and largest batch size of the synthetic job.
    m0: int = 32
    max_bsz: int = 256
    #: Gradient statistics of the synthetic job (grad_var at M0).
    sqr: float = 2.0
    var: float = 6.0
    #: Per-micro-batch compute and sync seconds of the synthetic job, by replicas.
    compute: dict = field(default_factory=lambda: {1: 0.010, 2: 0.012})
    sync: dict = field(default_factory=lambda: {1: 0.0, 2: 0.004})

    def gain(self, batch: int) -> float:
        """The statistical efficiency gain at ``batch`` (samples) from the job's gradient statistics."""
        return (self.var + self.sqr) / (self.var / (batch / self.m0) + self.sqr)

    def write(self, root: Path, name: str, nodes_gen2: dict) -> tuple[Path, float]:
        """``(root/name, the job's final progress)``; generation 2 runs on ``nodes_gen2`` (node -> replicas)."""
        run = root / name
        run.mkdir(parents=True)
        final = self._write_job(run, "a", nodes_gen2=nodes_gen2)
        (run / "config.json").write_text(json.dumps({"workload": {"jobs": [
            {"id": "a", "kind": "toy-app", "arrival_s": 0.0, "replicas": 1, "batch_size": 64},
        ]}}))
        (run / "events.jsonl").write_text(
            json.dumps({"t": 1.0, "job_id": "a", "type": "validation", "value": 0.5, "progress": 10.0}) + "\n"
            + json.dumps({"t": 2.0, "job_id": "a", "type": "validation", "value": 0.95, "progress": final}) + "\n"
            + json.dumps({"t": 4.5, "job_id": "a", "type": "complete", "verify_s": 2.5}) + "\n"
        )
        return run, final

    def _write_job(self, run: Path, job_id: str, *, nodes_gen2: dict, steps_per_gen: int = 60,
                   t0: float = 1000.0) -> float:
        d = run / "jobs" / job_id
        d.mkdir(parents=True)
        spec = {"name": "toy-app", "init_batch_size": self.m0, "max_batch_size": self.max_bsz, "target": 0.9}
        (d / "job.json").write_text(json.dumps({"job_id": job_id, "options": {"warmup_steps": 2},
                                                "spec": json.dumps(spec)}))
        rows, progress, t, step = [], 0.0, t0, 0
        configs = [(1, 1, self.m0 // 2, 1), (2, 2, 64, 0)]  # (generation, K, m, s)
        for gen, k, m, s in configs:
            for _ in range(steps_per_gen):
                step += 1
                compute = self.compute[k] * (s + 1)
                total = compute + self.sync[k]
                t += total
                gain = self.gain(k * m * (s + 1))
                progress += gain
                rows.append((gen, step, t, k, m, s, total, compute, self.sync[k], 1.0, self.sqr, self.var, gain,
                             gain, progress))
        pd.DataFrame(rows, columns=list(self.step_columns)).to_csv(d / "steps.csv", index=False)
        events = [
            {"time": t0, "kind": "started", "details": {"seconds": 0.3, "step": 0, "placement": {"n0": 1}}},
            {"time": t0 + 1, "kind": "rescaled",
             "details": {"seconds": 1.5, "step": steps_per_gen, "placement": nodes_gen2}},
            {"time": t, "kind": "target_reached", "details": {"step": step, "metric": 0.95}},
        ]
        (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        return progress


@pytest.fixture
def recorded_runs() -> RecordedRuns:
    """Writes synthetic recorded runs (see :class:`RecordedRuns`)."""
    return RecordedRuns()


@pytest.fixture
def cgroups():
    """This machine's cgroup CPU controller (:func:`detect`); skips the test
    where CPU quotas are unavailable."""
    try:
        return detect()
    except ThrottleUnavailable as why:
        pytest.skip(f"cgroup CPU quotas unavailable here: {why}")
