"""Benchmarks run only when asked: ``pytest benchmarks/ --benchmark``.

pytest-benchmark's own options all start with ``--benchmark-``; this adds the
bare ``--benchmark`` flag and skips every benchmark without it, so a plain
``pytest`` run (or ``pytest benchmarks/``) stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The benchmarks time the experiments' own code: the scripts import as modules
# (and import their siblings) with their folder on sys.path, as when they run.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--benchmark",
        action="store_true",
        default=False,
        help="run the benchmarks in benchmarks/ (skipped without this flag)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--benchmark"):
        return
    skip = pytest.mark.skip(reason="benchmarks run only with --benchmark")
    for item in items:
        item.add_marker(skip)
