"""CPU time per step of a user's own loop (:mod:`pollux_opt.elastic`) against the
builder protocol on the same model and data.

Run with ``pytest benchmarks/test_user_job_overhead_bench.py --benchmark``.
Target: the keep-your-loop wrapper costs <= 5 % more per step.  The
measurement is ``experiments/user_jobs.py``'s (an MLP of two 256-wide hidden
layers, steps of two micro-batches of 32 samples on one replica, in this
process; both jobs run side by side taking turns, and the overhead is the
median ratio of the CPU seconds per step of adjacent chunks of their
steady-state steps); ``extra_info`` holds both jobs' milliseconds per step,
the quartiles of the chunk ratios and each round's median.
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("torch")

#: The target, percent more CPU time per step than the builder protocol.
OVERHEAD_TARGET_PCT = 5.0


def test_user_loop_step_overhead_against_the_builder_protocol(benchmark, tmp_path):
    logging.disable(logging.WARNING)
    import user_jobs  # experiments/ is on sys.path: see conftest.py

    result = benchmark.pedantic(lambda: user_jobs.step_overhead(tmp_path), rounds=1, iterations=1, warmup_rounds=0)
    benchmark.extra_info.update(
        builder_ms_per_step=1000 * result["builder_step_s"], loop_ms_per_step=1000 * result["loop_step_s"],
        overhead_pct=result["overhead_pct"], overhead_iqr_pct=result["overhead_iqr_pct"],
        round_overheads_pct=result["round_overheads_pct"],
    )
    assert result["overhead_pct"] <= OVERHEAD_TARGET_PCT, result
