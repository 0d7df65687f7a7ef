"""Generated instance files through the Python API and ``pollux-opt allocate`` (in-process).

The generator is ``experiments/fuzz_instances.py`` (which runs more cases, the
CLI as subprocesses, and records the counts); here 300 seeded cases must give
no traceback, no hang and no inconsistent status.
"""

from __future__ import annotations

import logging

import pytest

CASES = 300


@pytest.fixture
def fuzz(experiment):
    return experiment("fuzz_instances")


def test_generated_cases_mix_valid_and_hostile_files(fuzz):
    cases = [fuzz.generate_case(seed) for seed in range(50)]
    assert len({raw for raw, _, _ in cases}) >= 45  # a few hostile byte strings repeat (deep nesting)
    assert sum(raw.startswith(b'{"version"') for raw, _, _ in cases) >= 35
    assert cases == [fuzz.generate_case(seed) for seed in range(50)]  # seeded


def test_generated_instances_never_crash_hang_or_misreport(caplog, fuzz):
    caplog.set_level(logging.ERROR)
    counts = fuzz.run_cases(range(CASES))
    for front, c in counts.items():
        assert c.cases == CASES
        assert (c.tracebacks, c.hangs, c.wrong) == (0, 0, 0), (front, c.examples)
        # Both outcomes occur: the generator is neither all-valid nor all-hostile.
        assert c.answered > CASES // 4 and c.rejected > CASES // 10, (front, c)
    assert counts["api"].answered == counts["cli"].answered
