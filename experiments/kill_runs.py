"""Kill and stop ``pollux-opt run`` at random, and record what it cost.

Runs the slow kill tests (``tests/e2e/test_kills.py``: ten random kills of the
scheduler and of training workers under ``pollux`` and under ``fixed``, one
scheduler SIGKILL, Ctrl-C and a rerun), with their figures appended to a CSV
(the tests' ``POLLUX_KILL_RECORD``): per run, the kills by kind, the jobs
verified, the steps repeated where the runtime promises none and after a
killed rank 0 (bounded by the checkpoint interval), the processes and
temporary folders a killed scheduler left, and under ``fixed`` whether every
job ended exactly as in a run without kills.  The CSV is written only when
every test passed (their assertions are the targets).

    python experiments/kill_runs.py                  # -> experiments/results/kills.csv (about 7 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "kills.csv"
TESTS = ROOT / "tests" / "e2e" / "test_kills.py"
#: The environment variable the kill tests append their figures under.
RECORD_ENV = "POLLUX_KILL_RECORD"

log = logging.getLogger("kill_runs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"CSV to write (default {RESULTS})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="kill-runs-") as tmp:
        record = Path(tmp) / "kills.csv"
        load = os.getloadavg()[0]
        rc = subprocess.run([sys.executable, "-m", "pytest", str(TESTS), "-m", "slow", "-q", "-p", "no:cacheprovider"],
                            cwd=ROOT, env={**os.environ, RECORD_ENV: str(record)}).returncode
        if rc != 0:
            log.error("the kill tests failed (pytest exit %d): nothing written", rc)
            return 1
        df = pd.read_csv(record)
    df["load1"] = round((load + os.getloadavg()[0]) / 2, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out, index=False)
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
